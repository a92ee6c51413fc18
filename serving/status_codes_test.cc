#include "serving/status_codes.h"

#include <gtest/gtest.h>

#include <utility>
#include <vector>

namespace rankwatch {
namespace {

struct Expected {
  absl::StatusCode status;
  grpc::StatusCode grpc;
  int http;
};

// Every absl code, written out: a change to the table must change this list.
const std::vector<Expected> kEveryCode = {
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
};

TEST(StatusCodesTest, EveryAbslCodeHasItsGrpcCodeAndHttpStatus) {
  ASSERT_EQ(kEveryCode.size(), 17u);
  for (const Expected& e : kEveryCode) {
    SCOPED_TRACE(absl::StatusCodeToString(e.status));
    EXPECT_EQ(GrpcCodeOf(e.status), e.grpc);
    EXPECT_EQ(HttpStatusOf(e.status), e.http);
    const absl::Status status(e.status, "what went wrong");
    EXPECT_EQ(HttpStatusOf(status), e.http);
    const grpc::Status g = ToGrpc(status);
    EXPECT_EQ(g.error_code(), e.grpc);
    EXPECT_EQ(g.error_message(), e.status == absl::StatusCode::kOk ? "" : "what went wrong");
  }
}

TEST(StatusCodesTest, TheGrpcCodeIsTheSameNumber) {
  for (int code = 0; code <= 16; ++code) {
    EXPECT_EQ(static_cast<int>(GrpcCodeOf(static_cast<absl::StatusCode>(code))), code);
  }
}

TEST(StatusCodesTest, ACodeOutsideAbslsIsUnknownAndAServerError) {
  const auto bogus = static_cast<absl::StatusCode>(42);
  EXPECT_EQ(GrpcCodeOf(bogus), grpc::StatusCode::UNKNOWN);
  EXPECT_EQ(HttpStatusOf(bogus), 500);
  EXPECT_EQ(HttpStatusOf(static_cast<absl::StatusCode>(-1)), 500);
}

}  // namespace
}  // namespace rankwatch
