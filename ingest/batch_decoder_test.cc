#include "ingest/batch_decoder.h"

#include <cmath>
#include <iterator>
#include <string>

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
  b = Valid();
  b.mutable_steps(0)->set_gc_ns(~0ull);  // a negative GC time written as an integer
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

TEST(BatchDecoderTest, RejectsOversizedStringsInEveryField) {
  const std::string huge(1 << 20, 'x');  // 1 MiB, inside the 4 MiB message limit
  using Setter = void (*)(v1::Batch*, const std::string&);
  const Setter setters[] = {
      [](v1::Batch* b, const std::string& v) { b->mutable_source()->set_training_job(v); },
      [](v1::Batch* b, const std::string& v) { b->mutable_source()->set_node(v); },
      [](v1::Batch* b, const std::string& v) { b->mutable_source()->set_device(v); },
      [](v1::Batch* b, const std::string& v) { b->mutable_source()->set_collector(v); },
      [](v1::Batch* b, const std::string& v) { b->mutable_source()->set_training_strategy(v); },
      [](v1::Batch* b, const std::string& v) { b->mutable_trace()->set_source_format(v); },
      [](v1::Batch* b, const std::string& v) { b->mutable_trace()->set_device_type(v); },
      [](v1::Batch* b, const std::string& v) { b->mutable_trace()->set_file(v); },
      [](v1::Batch* b, const std::string& v) {
        b->clear_strings();
        b->add_strings(v);
      },
  };
  for (size_t i = 0; i < std::size(setters); ++i) {
    v1::Batch b = Valid();
    setters[i](&b, huge);
    std::string detail;
    v1::Batch out;
    EXPECT_EQ(BatchDecoder().Decode(b.SerializeAsString(), &out, &detail), RejectReason::kBadString)
        << "field " << i;
    EXPECT_LT(detail.size(), 200u) << "the detail does not quote the string";
    setters[i](&b, "short");
    EXPECT_EQ(DecodeOf(b), RejectReason::kNone) << "field " << i;
  }
}

TEST(BatchDecoderTest, RejectsNegativeNanAndInfiniteValues) {
  v1::Batch b = Valid();
  // A negative duration written by a producer arrives as a huge unsigned value.
  b.mutable_steps(0)->set_forward_ns(static_cast<uint64_t>(int64_t{-5}));
  EXPECT_EQ(DecodeOf(b), RejectReason::kBadValue);
  b = Valid();
  b.mutable_steps(0)->set_end_unix_ns(-1);
  EXPECT_EQ(DecodeOf(b), RejectReason::kBadValue);
  b = Valid();
  b.set_created_unix_ns(-1);
  EXPECT_EQ(DecodeOf(b), RejectReason::kBadValue);
  for (double v : {std::nan(""), double{INFINITY}, -double{INFINITY}, -1.0}) {
    b = Valid();
    b.add_samples()->set_cpu_utilization(v);
    EXPECT_EQ(DecodeOf(b), RejectReason::kBadValue) << v;
    b = Valid();
    b.add_samples()->add_devices()->set_power_watts(v);
    EXPECT_EQ(DecodeOf(b), RejectReason::kBadValue) << v;
    b = Valid();
    b.add_samples()->add_processes()->set_cpu_utilization(v);
    EXPECT_EQ(DecodeOf(b), RejectReason::kBadValue) << v;
  }
  b = Valid();
  b.add_kernels()->set_memory_bw_gbps(std::nan(""));
  EXPECT_EQ(DecodeOf(b), RejectReason::kBadValue);
  b = Valid();
  b.add_kernels()->set_dur_ns(-100);  // quirky traces have these: accepted
  EXPECT_EQ(DecodeOf(b), RejectReason::kNone);
  b.add_kernels()->set_dur_ns(INT64_MIN);
  EXPECT_EQ(DecodeOf(b), RejectReason::kBadValue);
}

TEST(BatchDecoderTest, RejectsTimestampsFarAheadOfTheClock) {
  const int64_t now = 1'800'000'000'000'000'000;
  const int64_t hour = 3'600'000'000'000;
  v1::Batch out;
  v1::Batch b = Valid();
  b.set_created_unix_ns(now + hour / 2);  // half an hour ahead: a skewed clock, accepted
  EXPECT_EQ(BatchDecoder().Decode(b.SerializeAsString(), &out, nullptr, now), RejectReason::kNone);
  b.set_created_unix_ns(now + 2 * hour);
  std::string detail;
  EXPECT_EQ(BatchDecoder().Decode(b.SerializeAsString(), &out, &detail, now),
            RejectReason::kFutureTimestamp);
  EXPECT_NE(detail.find("7200 s ahead"), std::string::npos) << detail;
  // Without a clock (tools), nothing is compared.
  EXPECT_EQ(BatchDecoder().Decode(b.SerializeAsString(), &out), RejectReason::kNone);
  b = Valid();
  b.mutable_steps(0)->set_end_unix_ns(INT64_MAX);
  EXPECT_EQ(BatchDecoder().Decode(b.SerializeAsString(), &out, nullptr, now),
            RejectReason::kFutureTimestamp);
  b = Valid();
  b.add_samples()->set_unix_ns(now + 100 * hour);
  EXPECT_EQ(BatchDecoder().Decode(b.SerializeAsString(), &out, nullptr, now),
            RejectReason::kFutureTimestamp);
}

TEST(BatchDecoderTest, ReasonsHaveMetricLabels) {
  for (int i = 0; i < kRejectReasonCount; ++i) {
    EXPECT_NE(RejectReasonName(static_cast<RejectReason>(i)), "unknown");
  }
}

}  // namespace
}  // namespace rankwatch
