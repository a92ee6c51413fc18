// How the `rankwatch` subcommands reach rankwatchd's gRPC service: the --server and TLS
// flags, the channel, gRPC errors turned into one readable line, and answers as --json prints
// them.
#pragma once

#include <google/protobuf/message.h>
#include <grpcpp/grpcpp.h>

#include <CLI/CLI.hpp>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace rankwatch {

struct GrpcClientFlags {
  std::string server = "127.0.0.1:7466";
  std::string tls_ca;    // PEM CA that signed the server's certificate: use TLS
  std::string tls_cert;  // PEM client certificate (mutual TLS)
  std::string tls_key;   // its key
};

// Registers --server, --tls-ca, --tls-cert, --tls-key on `cmd`.
void AddGrpcClientFlags(CLI::App* cmd, GrpcClientFlags* flags);

// The largest answer a channel accepts.
inline constexpr int kMaxAnswerBytes = 512 << 20;

// A channel to the server; unreadable certificate files are InvalidArgument naming the file.
absl::StatusOr<std::shared_ptr<grpc::Channel>> OpenChannel(const GrpcClientFlags& flags);

// `answer` as `--json` prints it: the protobuf JSON mapping with the .proto's field names,
// indented.
std::string AnswerJson(const google::protobuf::Message& answer);

// "cannot reach rankwatchd at ADDR", "TLS handshake with ADDR failed (...)", or the server's
// own message: one line, no gRPC internals.
std::string Explain(const grpc::Status& status, const GrpcClientFlags& flags);

}  // namespace rankwatch
