#include "cli/grpc_client.h"

#include <google/protobuf/util/json_util.h>
#include <grpc/support/log.h>

#include <fstream>
#include <sstream>

namespace rankwatch {
namespace {

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  if (!in || text.str().empty()) return absl::InvalidArgumentError("cannot read " + path);
  return text.str();
}

}  // namespace

void AddGrpcClientFlags(CLI::App* cmd, GrpcClientFlags* f) {
  cmd->add_option("--server", f->server, "rankwatchd gRPC address")->capture_default_str();
  cmd->add_option("--tls-ca", f->tls_ca, "PEM CA of the server's certificate: connect with TLS");
  cmd->add_option("--tls-cert", f->tls_cert, "PEM client certificate (mutual TLS)");
  cmd->add_option("--tls-key", f->tls_key, "PEM key of the client certificate");
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> OpenChannel(const GrpcClientFlags& f) {
  // gRPC's own log lines (a failed handshake, ...) would come before ours: errors reach the
  // user as one line from Explain instead.
  gpr_set_log_function([](gpr_log_func_args*) {});
  // Answers may be large (a timeline of many ranks; gRPC's default limit is 4 MiB).
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxAnswerBytes);
  if (f.tls_ca.empty() && f.tls_cert.empty() && f.tls_key.empty()) {
    return grpc::CreateCustomChannel(f.server, grpc::InsecureChannelCredentials(), args);
  }
  grpc::SslCredentialsOptions ssl;
  if (!f.tls_ca.empty()) {
    auto ca = ReadFile(f.tls_ca);
    if (!ca.ok()) return ca.status();
    ssl.pem_root_certs = *ca;
  }
  if (!f.tls_cert.empty() || !f.tls_key.empty()) {
    auto cert = ReadFile(f.tls_cert);
    if (!cert.ok()) return cert.status();
    auto key = ReadFile(f.tls_key);
    if (!key.ok()) return key.status();
    ssl.pem_cert_chain = *cert;
    ssl.pem_private_key = *key;
  }
  return grpc::CreateCustomChannel(f.server, grpc::SslCredentials(ssl), args);
}

std::string AnswerJson(const google::protobuf::Message& answer) {
  std::string out;
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(answer, &out, options);
  return out;
}

std::string Explain(const grpc::Status& status, const GrpcClientFlags& f) {
  const std::string& m = status.error_message();
  switch (status.error_code()) {
    case grpc::StatusCode::UNAVAILABLE:
      if (m.find("SSL") != std::string::npos || m.find("ssl") != std::string::npos ||
          m.find("handshake") != std::string::npos || m.find("certificate") != std::string::npos) {
        return "TLS handshake with rankwatchd at " + f.server +
               " failed (wrong CA or certificate, or the server does not use TLS)";
      }
      // The daemon's own UNAVAILABLE: shutting down, or a feature turned off there (its
      // message names rankwatchd's flag); gRPC's connection errors never name rankwatchd.
      if (m.find("shutting down") != std::string::npos ||
          m.find("rankwatchd") != std::string::npos) {
        return "rankwatchd at " + f.server + ": " + m;
      }
      return "cannot reach rankwatchd at " + f.server +
             (f.tls_ca.empty() ? " (if it uses TLS, pass --tls-ca)" : "");
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return "rankwatchd at " + f.server + " did not answer in time";
    default:
      return m.empty() ? "rankwatchd at " + f.server + ": error " +
                             std::to_string(static_cast<int>(status.error_code()))
                       : m;
  }
}

}  // namespace rankwatch
