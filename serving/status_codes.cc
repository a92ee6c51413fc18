#include "serving/status_codes.h"

#include <array>
#include <string>

namespace rankwatch {
namespace {

struct TransportCodes {
  absl::StatusCode status;
  grpc::StatusCode grpc;
  int http;
};

// Indexed by the absl code. The HTTP statuses are google.rpc.Code's (google/rpc/code.proto)
// except:
// - kOutOfRange is 404, not 400: the API's only OutOfRange is a rank past the world size, a
//   path (/jobs/J/ranks/64) or a parameter that names no resource (docs/web-ui.md: an unknown
//   rank is 404).
// - kFailedPrecondition is 409 Conflict, not 400: the request is well formed and the current
//   state of the resource refuses it (a capture that names no ranks, of a job that names no
//   culprit now); the same request may succeed later. 412 Precondition Failed is for the
//   conditional headers of RFC 9110 (If-Match, If-Unmodified-Since), which the API does not
//   take.
// - kCancelled is 500, not 499: the daemon answers, so the client did not close the request
//   (nginx's 499 is a log-only code, which cpp-httplib sends as "499 Internal Server Error").
constexpr std::array<TransportCodes, 17> kCodes = {{
    {absl::StatusCode::kOk, grpc::StatusCode::OK, 200},
    {absl::StatusCode::kCancelled, grpc::StatusCode::CANCELLED, 500},
    {absl::StatusCode::kUnknown, grpc::StatusCode::UNKNOWN, 500},
    {absl::StatusCode::kInvalidArgument, grpc::StatusCode::INVALID_ARGUMENT, 400},
    {absl::StatusCode::kDeadlineExceeded, grpc::StatusCode::DEADLINE_EXCEEDED, 504},
    {absl::StatusCode::kNotFound, grpc::StatusCode::NOT_FOUND, 404},
    {absl::StatusCode::kAlreadyExists, grpc::StatusCode::ALREADY_EXISTS, 409},
    {absl::StatusCode::kPermissionDenied, grpc::StatusCode::PERMISSION_DENIED, 403},
    {absl::StatusCode::kResourceExhausted, grpc::StatusCode::RESOURCE_EXHAUSTED, 429},
    {absl::StatusCode::kFailedPrecondition, grpc::StatusCode::FAILED_PRECONDITION, 409},
    {absl::StatusCode::kAborted, grpc::StatusCode::ABORTED, 409},
    {absl::StatusCode::kOutOfRange, grpc::StatusCode::OUT_OF_RANGE, 404},
    {absl::StatusCode::kUnimplemented, grpc::StatusCode::UNIMPLEMENTED, 501},
    {absl::StatusCode::kInternal, grpc::StatusCode::INTERNAL, 500},
    {absl::StatusCode::kUnavailable, grpc::StatusCode::UNAVAILABLE, 503},
    {absl::StatusCode::kDataLoss, grpc::StatusCode::DATA_LOSS, 500},
    {absl::StatusCode::kUnauthenticated, grpc::StatusCode::UNAUTHENTICATED, 401},
}};

constexpr bool IndexedByCode() {
  for (size_t i = 0; i < kCodes.size(); ++i) {
    if (static_cast<size_t>(kCodes[i].status) != i) return false;
    if (static_cast<size_t>(kCodes[i].grpc) != i) return false;
  }
  return true;
}
static_assert(IndexedByCode(), "kCodes lists every absl code once, in order, with its gRPC twin");

const TransportCodes* Find(absl::StatusCode code) {
  const auto i = static_cast<size_t>(code);
  return i < kCodes.size() ? &kCodes[i] : nullptr;
}

}  // namespace

grpc::StatusCode GrpcCodeOf(absl::StatusCode code) {
  const TransportCodes* c = Find(code);
  return c != nullptr ? c->grpc : grpc::StatusCode::UNKNOWN;
}

grpc::Status ToGrpc(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return {GrpcCodeOf(status.code()), std::string(status.message())};
}

int HttpStatusOf(absl::StatusCode code) {
  const TransportCodes* c = Find(code);
  return c != nullptr ? c->http : 500;
}

}  // namespace rankwatch
