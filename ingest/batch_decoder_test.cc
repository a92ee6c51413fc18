#include "ingest/batch_decoder.h"

#include <gtest/gtest.h>

namespace rankwatch {
namespace {

v1::Batch Valid() {
  v1::Batch b;
  b.set_schema_version(1);
  b.mutable_source()->set_training_job("job-a");
  b.mutable_source()->set_rank(3);
  b.mutable_source()->set_world_size(8);
  v1::StepRecord* r = b.add_steps();
  r->set_step(10);
  r->set_step_time_ns(100'000'000);
  r->set_forward_ns(30'000'000);
  return b;
}

RejectReason DecodeOf(const v1::Batch& b, const BatchDecoder& d = BatchDecoder()) {
  v1::Batch out;
  return d.Decode(b.SerializeAsString(), &out);
}

TEST(BatchDecoderTest, AcceptsAValidBatch) {
  v1::Batch out;
  std::string detail;
  ASSERT_EQ(BatchDecoder().Decode(Valid().SerializeAsString(), &out, &detail), RejectReason::kNone)
      << detail;
  EXPECT_EQ(out.source().training_job(), "job-a");
  EXPECT_EQ(out.steps(0).forward_ns(), 30'000'000u);
}

TEST(BatchDecoderTest, RejectsGarbageAndEmptyMessages) {
  v1::Batch out;
  std::string detail;
  EXPECT_EQ(BatchDecoder().Decode("\xff\xff\xff garbage", &out, &detail), RejectReason::kMalformed);
  EXPECT_FALSE(detail.empty());
  // An empty message parses as an empty protobuf: version 0 is not a rankwatch batch.
  EXPECT_EQ(BatchDecoder().Decode("", &out), RejectReason::kSchemaVersion);
  EXPECT_EQ(BatchDecoder().Decode("hello world\n", &out), RejectReason::kMalformed);
}

TEST(BatchDecoderTest, RejectsOversizedMessages) {
  BatchLimits limits;
  limits.max_bytes = 16;
  EXPECT_EQ(DecodeOf(Valid(), BatchDecoder(limits)), RejectReason::kOversized);
}

TEST(BatchDecoderTest, RejectsFutureSchemaVersions) {
  v1::Batch b = Valid();
  b.set_schema_version(kSchemaVersion + 1);
  EXPECT_EQ(DecodeOf(b), RejectReason::kSchemaVersion);
}

TEST(BatchDecoderTest, RejectsMissingIdentityAndBadRanks) {
  v1::Batch b = Valid();
  b.mutable_source()->clear_training_job();
  EXPECT_EQ(DecodeOf(b), RejectReason::kMissingSource);
  b = Valid();
  b.mutable_source()->set_rank(8);
  EXPECT_EQ(DecodeOf(b), RejectReason::kBadRank);
  b = Valid();
  b.mutable_source()->set_world_size(0);
  EXPECT_EQ(DecodeOf(b), RejectReason::kBadRank);
}

TEST(BatchDecoderTest, RejectsAbsurdDurationsAndTooManyRecords) {
  v1::Batch b = Valid();
  b.mutable_steps(0)->set_backward_ns(86'401ull * 1'000'000'000ull);
  EXPECT_EQ(DecodeOf(b), RejectReason::kBadValue);
  BatchLimits limits;
  limits.max_steps = 1;
  b = Valid();
  b.add_steps()->set_step(11);
  EXPECT_EQ(DecodeOf(b, BatchDecoder(limits)), RejectReason::kTooManyRecords);
}

TEST(BatchDecoderTest, RejectsKernelStringIndexesOutsideTheTable) {
  v1::Batch b = Valid();
  b.add_strings("");
  b.add_strings("ncclKernel_AllReduce");
  b.add_kernels()->set_name(1);
  EXPECT_EQ(DecodeOf(b), RejectReason::kNone);
  b.add_kernels()->set_name(2);
  EXPECT_EQ(DecodeOf(b), RejectReason::kBadString);
}

TEST(BatchDecoderTest, ReasonsHaveMetricLabels) {
  for (int i = 0; i < kRejectReasonCount; ++i) {
    EXPECT_NE(RejectReasonName(static_cast<RejectReason>(i)), "unknown");
  }
}

}  // namespace
}  // namespace rankwatch
