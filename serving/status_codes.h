// The one mapping from an absl::Status code to the transport codes the daemon answers with:
// the gRPC status code (serving/grpc_server.cc) and the HTTP status of the JSON API
// (serving/web_server.cc). Abseil's codes are gRPC's codes, so the gRPC code is the same code;
// the HTTP status follows google.rpc.Code's mapping, except where this API's contract says
// otherwise (see status_codes.cc). Pure; thread-safe.
#pragma once

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace rankwatch {

// The gRPC code of `code`: the same code (absl::StatusCode and grpc::StatusCode share their
// numbers). A value outside absl's codes is UNKNOWN.
grpc::StatusCode GrpcCodeOf(absl::StatusCode code);

// `status` as a gRPC status: GrpcCodeOf its code, and its message.
grpc::Status ToGrpc(const absl::Status& status);

// The HTTP status of `code`, e.g. 404 for kNotFound and kOutOfRange, 503 for kUnavailable; 200
// for kOk. A value outside absl's codes is 500.
int HttpStatusOf(absl::StatusCode code);
inline int HttpStatusOf(const absl::Status& status) { return HttpStatusOf(status.code()); }

}  // namespace rankwatch
