#include "ingest/batch_decoder.h"

#include <cmath>
#include <functional>
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

// A pipeline-parallel rank: rank 3 of 8 = data rank 1 of 2, stage 1 of 4, with ops.
v1::Batch WithLayoutAndOps() {
  v1::Batch b = Valid();
  v1::ParallelLayout* l = b.mutable_source()->mutable_layout();
  l->set_data_rank(1);
  l->set_data_size(2);
  l->set_pipeline_rank(1);
  l->set_pipeline_size(4);
  v1::StepRecord* s = b.mutable_steps(0);
  s->set_ops_origin_unix_ns(1'700'000'000'000'000'000);
  s->set_gc_ns(2'000'000);
  s->set_gc_count(3);
  for (uint32_t mb = 0; mb < 4; ++mb) {
    v1::OpRecord* op = s->add_ops();
    op->set_type(v1::OP_FORWARD_COMPUTE);
    op->set_microbatch(mb);
    op->set_start_offset_us(25'000 * mb);
    op->set_duration_us(24'000);
  }
  return b;
}

TEST(BatchDecoderTest, AcceptsALayoutThatFitsTheWorldAndRejectsOthersAsBadRanks) {
  v1::Batch out;
  std::string detail;
  DecodeNotes notes;
  ASSERT_EQ(BatchDecoder().Decode(WithLayoutAndOps().SerializeAsString(), &out, &detail, 0, &notes),
            RejectReason::kNone)
      << detail;
  EXPECT_EQ(out.source().layout().pipeline_rank(), 1u);
  EXPECT_EQ(notes.ops, 4u);
  EXPECT_EQ(notes.unknown_op_types, 0u);
  // Sizes of 0 mean 1: a layout of sizes 8 x 0 x 0 x 0 fits a world of 8.
  v1::Batch b = Valid();
  b.mutable_source()->mutable_layout()->set_data_size(8);
  b.mutable_source()->mutable_layout()->set_data_rank(3);
  EXPECT_EQ(DecodeOf(b), RejectReason::kNone);
  struct Case {
    const char* what;
    void (*mutate)(v1::ParallelLayout*);
    const char* detail;
  };
  const Case cases[] = {
      {"stage out of range", [](v1::ParallelLayout* l) { l->set_pipeline_rank(4); },
       "pipeline rank 4 is not below its size 4"},
      {"a rank of an unused kind", [](v1::ParallelLayout* l) { l->set_tensor_rank(1); },
       "tensor rank 1 is not below its size 1"},
      {"sizes over the world", [](v1::ParallelLayout* l) { l->set_tensor_size(2); },
       "do not multiply to the world size 8"},
      {"sizes under the world",
       [](v1::ParallelLayout* l) {
         l->set_data_size(1);
         l->set_data_rank(0);
       },
       "do not multiply to the world size 8"},
      {"experts wider than a stage", [](v1::ParallelLayout* l) { l->set_expert_size(4); },
       "expert size 4 does not divide the ranks of a pipeline stage (2)"},
      {"huge sizes that wrap",
       [](v1::ParallelLayout* l) {
         l->set_data_size(1u << 31);
         l->set_pipeline_size(1u << 31);
         l->set_tensor_size(1u << 31);
         l->set_context_size(1u << 31);
       },
       "do not multiply"},
  };
  for (const Case& c : cases) {
    b = WithLayoutAndOps();
    c.mutate(b.mutable_source()->mutable_layout());
    detail.clear();
    EXPECT_EQ(BatchDecoder().Decode(b.SerializeAsString(), &out, &detail), RejectReason::kBadRank)
        << c.what;
    EXPECT_NE(detail.find(c.detail), std::string::npos) << c.what << ": " << detail;
  }
  b = WithLayoutAndOps();
  b.mutable_source()->mutable_layout()->set_expert_size(2);  // within a stage of 2 ranks
  b.mutable_source()->mutable_layout()->set_expert_rank(1);
  EXPECT_EQ(DecodeOf(b), RejectReason::kNone);
}

TEST(BatchDecoderTest, BoundsOpsTheirDurationsIndexesAndOrigin) {
  v1::Batch b = WithLayoutAndOps();
  BatchLimits limits;
  limits.max_ops_per_step = 3;
  EXPECT_EQ(DecodeOf(b, BatchDecoder(limits)), RejectReason::kTooManyRecords);
  limits.max_ops_per_step = 4;
  EXPECT_EQ(DecodeOf(b, BatchDecoder(limits)), RejectReason::kNone);

  b.mutable_steps(0)->mutable_ops(2)->set_duration_us(86'401ull * 1'000'000);  // over a day
  EXPECT_EQ(DecodeOf(b), RejectReason::kBadValue);
  b = WithLayoutAndOps();
  b.mutable_steps(0)->mutable_ops(2)->set_start_offset_us(static_cast<uint64_t>(int64_t{-1}));
  EXPECT_EQ(DecodeOf(b), RejectReason::kBadValue);
  b = WithLayoutAndOps();
  b.mutable_steps(0)->mutable_ops(1)->set_microbatch(1u << 16);
  EXPECT_EQ(DecodeOf(b), RejectReason::kBadValue);
  b = WithLayoutAndOps();
  b.mutable_steps(0)->set_gc_ns(86'401ull * 1'000'000'000);
  EXPECT_EQ(DecodeOf(b), RejectReason::kBadValue);
  b = WithLayoutAndOps();
  b.mutable_steps(0)->set_ops_origin_unix_ns(-5);
  EXPECT_EQ(DecodeOf(b), RejectReason::kBadValue);
  b = WithLayoutAndOps();
  v1::Batch out;
  EXPECT_EQ(BatchDecoder().Decode(b.SerializeAsString(), &out, nullptr, 1'600'000'000'000'000'000),
            RejectReason::kFutureTimestamp);  // ops 3 years ahead of the daemon's clock

  // Model chunks: below the layout's virtual stages (1 when not interleaved); any without a
  // layout.
  b = WithLayoutAndOps();
  b.mutable_steps(0)->mutable_ops(0)->set_model_chunk(1);
  EXPECT_EQ(DecodeOf(b), RejectReason::kBadValue);
  b.mutable_source()->mutable_layout()->set_virtual_stages(2);
  EXPECT_EQ(DecodeOf(b), RejectReason::kNone);
  b.mutable_steps(0)->mutable_ops(0)->set_model_chunk(2);
  EXPECT_EQ(DecodeOf(b), RejectReason::kBadValue);
  b.mutable_source()->clear_layout();
  EXPECT_EQ(DecodeOf(b), RejectReason::kNone);
}

// OpType is a proto3 open enum: a newer collector's op types (and OP_UNSPECIFIED) are accepted
// and counted, never a rejection of the batch.
TEST(BatchDecoderTest, AcceptsAndCountsOpTypesItDoesNotKnow) {
  v1::Batch b = WithLayoutAndOps();
  b.mutable_steps(0)->mutable_ops(1)->set_type(static_cast<v1::OpType>(99));
  b.mutable_steps(0)->mutable_ops(2)->set_type(v1::OP_UNSPECIFIED);
  v1::StepRecord* second = b.add_steps();
  second->set_step(11);
  second->add_ops()->set_type(v1::OP_OPTIMIZER);
  v1::Batch out;
  DecodeNotes notes;
  ASSERT_EQ(BatchDecoder().Decode(b.SerializeAsString(), &out, nullptr, 0, &notes),
            RejectReason::kNone);
  EXPECT_EQ(out.steps(0).ops(1).type(), 99);  // kept as sent
  EXPECT_EQ(notes.ops, 5u);
  EXPECT_EQ(notes.unknown_op_types, 2u);
  // The notes are of the last batch only.
  ASSERT_EQ(BatchDecoder().Decode(Valid().SerializeAsString(), &out, nullptr, 0, &notes),
            RejectReason::kNone);
  EXPECT_EQ(notes.ops, 0u);
  EXPECT_EQ(notes.unknown_op_types, 0u);
}

TEST(BatchDecoderTest, ReasonsHaveMetricLabels) {
  for (int i = 0; i < kRejectReasonCount; ++i) {
    EXPECT_NE(RejectReasonName(static_cast<RejectReason>(i)), "unknown");
  }
}

// A batch of rank 3 with its Flight Recorder dump: two groups, two entries.
v1::Batch WithDump() {
  v1::Batch b = Valid();
  b.clear_steps();
  v1::FlightRecorderDump* d = b.add_flight_recorder_dumps();
  d->set_rank(3);
  d->set_state(v1::FR_DUMP_READ);
  d->set_version("2.9");
  v1::FlightRecorderGroup* g = d->add_groups();
  g->set_name("0");
  g->set_desc("default_pg");
  for (uint32_t r = 0; r < 8; ++r) g->add_ranks(r);
  d->add_status()->set_uid("0");
  for (int i = 0; i < 2; ++i) {
    v1::FlightRecorderEntry* e = d->add_entries();
    e->set_record_id(i);
    e->set_profiling_name("nccl:all_reduce");
    e->add_input_sizes()->add_dims(1024);
    e->add_input_dtypes("Float");
    e->add_frames()->set_name("train_step");
  }
  return b;
}

TEST(BatchDecoderTest, ChecksFlightRecorderDumps) {
  std::string detail;
  v1::Batch out;
  ASSERT_EQ(BatchDecoder().Decode(WithDump().SerializeAsString(), &out, &detail),
            RejectReason::kNone)
      << detail;
  EXPECT_EQ(out.flight_recorder_dumps(0).entries_size(), 2);
  v1::Batch b = WithDump();
  b.mutable_flight_recorder_dumps(0)->set_rank(4);  // not the batch's rank
  EXPECT_EQ(DecodeOf(b), RejectReason::kBadRank);
  b = WithDump();
  b.mutable_flight_recorder_dumps(0)->set_state(v1::FR_DUMP_MISSING);
  EXPECT_EQ(DecodeOf(b), RejectReason::kBadValue);
  b = WithDump();
  b.mutable_flight_recorder_dumps(0)->set_file_mtime_unix_ns(-1);
  EXPECT_EQ(DecodeOf(b), RejectReason::kBadValue);
  BatchLimits limits;
  limits.max_fr_entries = 1;
  EXPECT_EQ(DecodeOf(WithDump(), BatchDecoder(limits)), RejectReason::kTooManyRecords);
  limits = {};
  limits.max_fr_dumps = 0;
  EXPECT_EQ(DecodeOf(WithDump(), BatchDecoder(limits)), RejectReason::kTooManyRecords);
  limits = {};
  limits.max_fr_frames = 0;
  EXPECT_EQ(DecodeOf(WithDump(), BatchDecoder(limits)), RejectReason::kTooManyRecords);
  limits = {};
  limits.max_fr_dims = 0;
  EXPECT_EQ(DecodeOf(WithDump(), BatchDecoder(limits)), RejectReason::kTooManyRecords);
  limits = {};
  limits.max_fr_groups = 0;
  EXPECT_EQ(DecodeOf(WithDump(), BatchDecoder(limits)), RejectReason::kTooManyRecords);
  b = WithDump();
  b.mutable_flight_recorder_dumps(0)->mutable_groups(0)->add_ranks(1u << 20);
  EXPECT_EQ(DecodeOf(b), RejectReason::kBadRank);
  // Every string is bounded.
  const std::string long_string(5000, 'x');
  const std::vector<std::function<void(v1::FlightRecorderDump*)>> setters = {
      [&](v1::FlightRecorderDump* d) { d->set_error(long_string); },
      [&](v1::FlightRecorderDump* d) { d->set_source(long_string); },
      [&](v1::FlightRecorderDump* d) { d->mutable_groups(0)->set_desc(long_string); },
      [&](v1::FlightRecorderDump* d) { d->mutable_status(0)->set_uid(long_string); },
      [&](v1::FlightRecorderDump* d) { d->mutable_entries(1)->set_pg_desc(long_string); },
      [&](v1::FlightRecorderDump* d) { d->mutable_entries(1)->set_input_dtypes(0, long_string); },
      [&](v1::FlightRecorderDump* d) {
        d->mutable_entries(1)->mutable_frames(0)->set_filename(long_string);
      }};
  for (size_t i = 0; i < setters.size(); ++i) {
    b = WithDump();
    setters[i](b.mutable_flight_recorder_dumps(0));
    EXPECT_EQ(DecodeOf(b), RejectReason::kBadString) << i;
  }
}

}  // namespace
}  // namespace rankwatch
