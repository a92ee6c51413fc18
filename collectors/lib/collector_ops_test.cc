// The collector's ops, GC pauses and parallel layout (collectors/lib/collector.h,
// step_ops.h): what a step record carries of them, the per-step bound, the C API, and the
// bytes a pipeline-parallel rank-step costs on the wire (docs/whatif.md, "Bytes").
#include <gtest/gtest.h>

#include <google/protobuf/io/coded_stream.h>

#include <cstdio>
#include <thread>

#include "collectors/lib/collector.h"
#include "collectors/lib/collector_test_support.h"
#include "collectors/lib/rankwatch_collector.h"
#include "collectors/lib/step_ops.h"
#include "wire/schema.h"

namespace rankwatch {
namespace {

constexpr uint64_t kUs = 1000, kMs = 1'000'000;

StepOp Op(v1::OpType type, uint64_t begin_ns, uint64_t end_ns, uint32_t microbatch = 0) {
  StepOp op;
  op.type = type;
  op.begin_ns = begin_ns;
  op.end_ns = end_ns;
  op.microbatch = microbatch;
  return op;
}

TEST(AppendStepOpsTest, SortsByStartAndRoundsEndsToMicrosecondsFromTheStepStart) {
  const uint64_t begin = 5'000 * kMs;
  std::vector<StepOp> ops = {Op(v1::OP_BACKWARD_COMPUTE, begin + 3'000'400, begin + 5'000'600, 1),
                             Op(v1::OP_FORWARD_COMPUTE, begin + 1'499, begin + 2'000'501, 1)};
  v1::StepRecord r;
  AppendStepOps(ops, begin, begin + 6 * kMs, 1'700'000'000'006'000'000, &r);
  EXPECT_EQ(r.ops_origin_unix_ns(), 1'700'000'000'000'000'000);
  ASSERT_EQ(r.ops_size(), 2);
  EXPECT_EQ(r.ops(0).type(), v1::OP_FORWARD_COMPUTE);  // in start order
  EXPECT_EQ(r.ops(0).microbatch(), 1u);
  EXPECT_EQ(r.ops(0).start_offset_us(), 1u);      // 1.499 us rounds down
  EXPECT_EQ(r.ops(0).duration_us(), 2'001u - 1);  // ends at 2,000.501 us -> 2,001
  EXPECT_EQ(r.ops(1).start_offset_us(), 3'000u);
  EXPECT_EQ(r.ops(1).duration_us(), 2'001u);  // 3,000 .. 5,001: the rounded end
}

TEST(AppendStepOpsTest, AnOpStartingBeforeTheStepMovesTheOrigin) {
  const uint64_t begin = 100 * kMs;
  std::vector<StepOp> ops = {Op(v1::OP_FORWARD_COMPUTE, begin, begin + kMs),
                             Op(v1::OP_GC, begin - 2 * kMs, begin - kMs)};
  v1::StepRecord r;
  AppendStepOps(ops, begin, begin + 10 * kMs, 2'000'000'000, &r);
  EXPECT_EQ(r.ops_origin_unix_ns(), 2'000'000'000 - 12 * int64_t{kMs});
  EXPECT_EQ(r.ops(0).type(), v1::OP_GC);
  EXPECT_EQ(r.ops(0).start_offset_us(), 0u);
  EXPECT_EQ(r.ops(1).start_offset_us(), 2'000u);
  std::vector<StepOp> none;
  v1::StepRecord empty;
  AppendStepOps(none, begin, begin + kMs, 2'000'000'000, &empty);
  EXPECT_EQ(empty.ops_origin_unix_ns(), 0);  // no ops: no origin
}

TEST(CollectorOpsTest, OpsLayoutAndGcPausesShipInTheirSteps) {
  MockKafka kafka;
  CollectorOptions o;
  o.brokers = kafka.bootstrap();
  o.flush_interval_ms = 20;
  o.watch_gc = true;
  CollectorIdentity id = Identity();  // rank 2 of 4
  id.layout = RankLayout{.data_rank = 1, .data_size = 2, .pipeline_rank = 0, .pipeline_size = 2};
  auto c = Collector::Create(id, o);
  ASSERT_TRUE(c.ok()) << c.status();
  Collector& rw = **c;
  const uint64_t t0 = 1000 * kMs;
  // The set-up's collections, before anything of step 0: no step's time.
  rw.AddGcPause(t0 - 900 * kMs, t0 - 500 * kMs);
  rw.AddGcPause(t0 - 100 * kMs, t0 - 90 * kMs);
  rw.AddOp(v1::OP_DATA_LOADING, 0, 0, t0, t0 + kMs);  // before the step opens: it starts it
  rw.BeginStep(0, t0 + kMs);
  rw.AddOp(v1::OP_FORWARD_COMPUTE, 0, 0, t0 + kMs, t0 + 3 * kMs);
  rw.AddGcPause(t0 + 3 * kMs, t0 + 5 * kMs);  // 2 ms: an op too
  rw.AddOp(v1::OP_FORWARD_SEND, 0, 0, t0 + 5 * kMs, t0 + 5 * kMs + 400 * kUs);
  rw.AddGcPause(t0 + 6 * kMs, t0 + 6 * kMs + 10 * kUs);  // 10 us: counted, no op
  rw.AddOp(v1::OP_BACKWARD_COMPUTE, 1, 0, t0 + 7 * kMs, t0 + 9 * kMs);
  rw.EndStep(t0 + 10 * kMs);
  rw.BeginStep(1, t0 + 10 * kMs);  // no ops, no pauses
  rw.EndStep(t0 + 20 * kMs);
  ASSERT_TRUE(rw.Flush(std::chrono::seconds(10)).ok());         // shipped with the first layout
  EXPECT_FALSE(rw.SetLayout(RankLayout{.data_size = 3}).ok());  // 3 does not divide 4
  ASSERT_TRUE(rw.SetLayout(RankLayout{.data_rank = 2, .data_size = 4}).ok());
  EXPECT_EQ(rw.identity().layout->data_rank, 2u);
  rw.BeginStep(2, t0 + 20 * kMs);
  rw.EndStep(t0 + 21 * kMs);
  ASSERT_TRUE(rw.Close(true, std::chrono::seconds(10)).ok());
  const CollectorStats stats = rw.stats();
  EXPECT_EQ(stats.ops_recorded, 5u);
  EXPECT_EQ(stats.ops_dropped, 0u);
  EXPECT_EQ(stats.gc_pauses, 4u);
  EXPECT_EQ(stats.gc_pauses_before_first_step, 2u);

  const std::vector<v1::Batch> batches = kafka.ReadAll(std::chrono::milliseconds(700));
  const std::vector<v1::StepRecord> steps = Steps(batches);
  ASSERT_EQ(steps.size(), 3u);
  const v1::StepRecord& s = steps[0];
  EXPECT_EQ(s.step_time_ns(), 10 * kMs);  // from the data-loading op, not the set-up's GC
  EXPECT_EQ(s.gc_ns(), 2 * kMs + 10 * kUs);
  EXPECT_EQ(s.gc_count(), 2u);
  EXPECT_EQ(s.ops_origin_unix_ns(), s.end_unix_ns() - static_cast<int64_t>(s.step_time_ns()));
  ASSERT_EQ(s.ops_size(), 5);
  const v1::OpType types[] = {v1::OP_DATA_LOADING, v1::OP_FORWARD_COMPUTE, v1::OP_GC,
                              v1::OP_FORWARD_SEND, v1::OP_BACKWARD_COMPUTE};
  const uint64_t starts[] = {0, 1000, 3000, 5000, 7000},
                 durations[] = {1000, 2000, 2000, 400, 2000};
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(s.ops(i).type(), types[i]) << i;
    EXPECT_EQ(s.ops(i).start_offset_us(), starts[i]) << i;
    EXPECT_EQ(s.ops(i).duration_us(), durations[i]) << i;
  }
  EXPECT_EQ(s.ops(4).microbatch(), 1u);
  // Watched: a step without pauses says 0; without ops it has no origin.
  EXPECT_TRUE(steps[1].has_gc_ns());
  EXPECT_EQ(steps[1].gc_ns(), 0u);
  EXPECT_EQ(steps[1].gc_count(), 0u);
  EXPECT_EQ(steps[1].ops_size(), 0);
  EXPECT_EQ(steps[1].ops_origin_unix_ns(), 0);

  const v1::ParallelLayout& first = batches.front().source().layout();
  EXPECT_EQ(first.data_rank(), 1u);
  EXPECT_EQ(first.data_size(), 2u);
  EXPECT_EQ(first.pipeline_size(), 2u);
  EXPECT_EQ(first.tensor_size(), 1u);
  EXPECT_EQ(batches.back().source().layout().data_rank(), 2u);  // set later
  EXPECT_EQ(batches.back().source().layout().data_size(), 4u);
}

TEST(CollectorOpsTest, OpsPastTheLimitOfAStepAreDroppedAndCountedAndGcUnwatchedIsAbsent) {
  MockKafka kafka;
  CollectorOptions o;
  o.brokers = kafka.bootstrap();
  o.flush_interval_ms = 20;
  o.max_ops_per_step = 3;
  auto c = Collector::Create(Identity(), o);
  ASSERT_TRUE(c.ok()) << c.status();
  Collector& rw = **c;
  rw.BeginStep(0, 10 * kMs);
  for (uint32_t mb = 0; mb < 5; ++mb) {
    rw.AddOp(v1::OP_FORWARD_COMPUTE, mb, 0, (11 + mb) * kMs, (12 + mb) * kMs);
  }
  rw.EndStep(20 * kMs);
  rw.BeginStep(1, 20 * kMs);
  rw.AddOp(v1::OP_OPTIMIZER, 0, 0, 21 * kMs, 22 * kMs);  // the next step starts afresh
  rw.EndStep(30 * kMs);
  rw.BeginStep(2, 30 * kMs);  // unwatched and no pause: absent
  rw.EndStep(31 * kMs);
  ASSERT_TRUE(rw.Close(true, std::chrono::seconds(10)).ok());
  EXPECT_EQ(rw.stats().ops_recorded, 4u);
  EXPECT_EQ(rw.stats().ops_dropped, 2u);
  const std::vector<v1::StepRecord> steps = Steps(kafka.ReadAll(std::chrono::milliseconds(700)));
  ASSERT_EQ(steps.size(), 3u);
  ASSERT_EQ(steps[0].ops_size(), 3);  // the first three
  EXPECT_EQ(steps[0].ops(2).microbatch(), 2u);
  ASSERT_EQ(steps[1].ops_size(), 1);
  EXPECT_EQ(steps[1].ops(0).type(), v1::OP_OPTIMIZER);
  EXPECT_FALSE(steps[2].has_gc_ns());
  EXPECT_FALSE(steps[2].has_gc_count());
}

TEST(CollectorOpsTest, ALayoutThatDoesNotFitTheWorldIsRefused) {
  CollectorOptions o;
  o.brokers = "127.0.0.1:1";
  o.control_topic.clear();
  CollectorIdentity id = Identity();  // world size 4
  id.layout = RankLayout{.pipeline_rank = 4, .pipeline_size = 4};
  auto bad = Collector::Create(id, o);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("pipeline rank 4 is not below its size 4"),
            std::string::npos)
      << bad.status();
  id.layout = RankLayout{.pipeline_size = 2, .tensor_size = 4};  // 8 ranks
  EXPECT_FALSE(Collector::Create(id, o).ok());
  id.layout = RankLayout{.data_size = 4, .expert_size = 4};  // experts regroup a stage's 4
  EXPECT_TRUE(Collector::Create(id, o).ok());
  id.layout = RankLayout{.data_size = 2, .pipeline_size = 2, .expert_size = 4};  // 2 a stage
  EXPECT_FALSE(Collector::Create(id, o).ok());
  o.max_ops_per_step = BatchLimits{}.max_ops_per_step + 1;
  id.layout.reset();
  EXPECT_FALSE(Collector::Create(id, o).ok());
}

// Without a control channel no stacks request can come: a waiter waits out its timeout (a
// caller's loop around it must not spin a core), until woken or the collector closes.
TEST(CollectorOpsTest, WaitingForStacksWithoutAControlChannelWaitsItsTimeout) {
  CollectorOptions o;
  o.brokers = "127.0.0.1:1";
  o.control_topic.clear();
  auto c = Collector::Create(Identity(), o);
  ASSERT_TRUE(c.ok()) << c.status();
  Collector& rw = **c;
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_TRUE(rw.WaitStacksRequests(std::chrono::milliseconds(200)).empty());
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(200));
  // Woken from another thread long before its timeout.
  std::thread waker([&rw] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    rw.WakeStacksWaiters();
  });
  t0 = std::chrono::steady_clock::now();
  EXPECT_TRUE(rw.WaitStacksRequests(std::chrono::seconds(60)).empty());
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(30));
  waker.join();
  // Closing: a waiter returns, and later calls return at once.
  std::thread closer([&rw] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    (void)rw.Close(false, std::chrono::milliseconds(0));
  });
  t0 = std::chrono::steady_clock::now();
  EXPECT_TRUE(rw.WaitStacksRequests(std::chrono::seconds(60)).empty());
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(30));
  closer.join();
  t0 = std::chrono::steady_clock::now();
  EXPECT_TRUE(rw.WaitStacksRequests(std::chrono::seconds(60)).empty());
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(30));
}

// GC pauses reported from another thread while the training thread runs steps: each lands in
// exactly one step.
TEST(CollectorOpsTest, GcPausesFromAnotherThreadAreEachCountedOnce) {
  MockKafka kafka;
  CollectorOptions o;
  o.brokers = kafka.bootstrap();
  o.flush_interval_ms = 5;
  o.watch_gc = true;
  auto c = Collector::Create(Identity(), o);
  ASSERT_TRUE(c.ok()) << c.status();
  Collector& rw = **c;
  constexpr uint64_t kPauses = 20000, kSteps = 200;
  // Step 0 opens before the pauses start: earlier ones would be the set-up's, in no step (on a
  // loaded machine the thread made all of them before the loop began).
  rw.BeginStep(0, 0);
  std::thread gc([&] {
    for (uint64_t i = 0; i < kPauses; ++i) rw.AddGcPause(1000, 1000 + 3 * kUs);
  });
  rw.EndStep(5);
  for (uint64_t step = 1; step + 1 < kSteps; ++step) {
    rw.BeginStep(step, 10 * step);
    rw.EndStep(10 * step + 5);
  }
  gc.join();
  rw.BeginStep(kSteps - 1, 10 * kSteps);  // after every pause
  rw.EndStep(10 * kSteps + 5);
  ASSERT_TRUE(rw.Close(true, std::chrono::seconds(30)).ok());
  uint64_t count = 0, ns = 0;
  for (const v1::StepRecord& s : Steps(kafka.ReadAll(std::chrono::milliseconds(700)))) {
    count += s.gc_count();
    ns += s.gc_ns();
    EXPECT_EQ(s.ops_size(), 0);  // 3 us: below gc_op_min_ns
  }
  EXPECT_EQ(count, kPauses);
  EXPECT_EQ(ns, kPauses * 3 * kUs);
}

// The bytes one rank-step of a pipeline-parallel job costs: a middle stage (1 of 4) of a 1F1B
// schedule with 8 microbatches, each a forward and a backward with their four sends and
// receives, then the data-parallel collectives and the optimizer: 54 ops, realistic durations
// (tens of ms of compute, sub-ms to ms transfers) and a 0.8 s step. Budget: 1 KiB
// (docs/whatif.md, "Bytes").
TEST(CollectorOpsTest, A1F1BRankStepOfEightMicrobatchesFitsTheBytesBudget) {
  MockKafka kafka;
  CollectorOptions o;
  o.brokers = kafka.bootstrap();
  o.flush_interval_ms = 20;
  o.watch_gc = true;
  CollectorIdentity id = Identity();
  id.world_size = 64;
  id.rank = 21;
  id.layout = RankLayout{.data_rank = 2,
                         .data_size = 4,
                         .pipeline_rank = 1,
                         .pipeline_size = 4,
                         .tensor_rank = 1,
                         .tensor_size = 4};
  auto c = Collector::Create(id, o);
  ASSERT_TRUE(c.ok()) << c.status();
  Collector& rw = **c;
  uint64_t t = 7'000 * kMs;
  uint32_t jitter = 12345;
  auto op = [&](v1::OpType type, uint32_t mb, uint64_t ns) {
    jitter = jitter * 1103515245u + 12345u;
    const uint64_t d = ns + ns / 1000 * ((jitter >> 16) % 200);  // +0..20 %, odd values
    rw.AddOp(type, mb, 0, t, t + d);
    t += d + 37 * kUs;  // a launch gap
  };
  const uint32_t kMicrobatches = 8, kStages = 4, kStage = 1;
  rw.BeginStep(0, t);
  op(v1::OP_DATA_LOADING, 0, 4 * kMs);
  auto forward = [&](uint32_t mb) {
    op(v1::OP_FORWARD_RECV, mb, 1500 * kUs);
    op(v1::OP_FORWARD_COMPUTE, mb, 25 * kMs);
    op(v1::OP_FORWARD_SEND, mb, 350 * kUs);
  };
  auto backward = [&](uint32_t mb) {
    op(v1::OP_BACKWARD_RECV, mb, 2 * kMs);
    op(v1::OP_BACKWARD_COMPUTE, mb, 50 * kMs);
    op(v1::OP_BACKWARD_SEND, mb, 350 * kUs);
  };
  const uint32_t warmup = kStages - kStage - 1;
  for (uint32_t mb = 0; mb < warmup; ++mb) forward(mb);
  for (uint32_t i = 0; i + warmup < kMicrobatches; ++i) {
    forward(warmup + i);
    backward(i);
  }
  for (uint32_t mb = kMicrobatches - warmup; mb < kMicrobatches; ++mb) backward(mb);
  op(v1::OP_LAYERNORM_GRADS_ALL_REDUCE, 0, 800 * kUs);
  op(v1::OP_GRADS_REDUCE_SCATTER, 0, 30 * kMs);
  op(v1::OP_OPTIMIZER_CLIP_MAIN_GRAD, 0, 2 * kMs);
  op(v1::OP_OPTIMIZER, 0, 15 * kMs);
  op(v1::OP_PARAMS_ALL_GATHER, 0, 25 * kMs);
  rw.EndStep(t);
  ASSERT_TRUE(rw.Close(true, std::chrono::seconds(10)).ok());
  const std::vector<v1::Batch> batches = kafka.ReadAll(std::chrono::milliseconds(700));
  const std::vector<v1::StepRecord> steps = Steps(batches);
  ASSERT_EQ(steps.size(), 1u);
  const v1::StepRecord& s = steps[0];
  ASSERT_EQ(s.ops_size(), 54);
  EXPECT_GT(s.step_time_ns(), 700 * kMs);
  // What the record adds to a batch: its field tag, its length and itself.
  const size_t body = s.ByteSizeLong();
  const size_t record_bytes =
      1 + google::protobuf::io::CodedOutputStream::VarintSize32(static_cast<uint32_t>(body)) + body;
  size_t op_bytes = 0;
  for (const v1::OpRecord& r : s.ops()) {
    op_bytes += 1 +
                google::protobuf::io::CodedOutputStream::VarintSize32(
                    static_cast<uint32_t>(r.ByteSizeLong())) +
                r.ByteSizeLong();
  }
  const v1::Batch* with_step = nullptr;
  for (const v1::Batch& b : batches) {
    if (b.steps_size() == 1) with_step = &b;
  }
  ASSERT_NE(with_step, nullptr);
  std::printf(
      "1F1B rank-step, 8 microbatches, %d ops, step %.0f ms: %zu bytes serialized (%zu of "
      "them ops, %.1f bytes an op); its batch of one step %zu bytes\n",
      s.ops_size(), static_cast<double>(s.step_time_ns()) * 1e-6, record_bytes, op_bytes,
      static_cast<double>(op_bytes) / s.ops_size(), with_step->ByteSizeLong());
  RecordProperty("rank_step_bytes", static_cast<int>(record_bytes));
  EXPECT_LE(record_bytes, 1024u);
}

TEST(CollectorCApiOpsTest, LayoutOpsAndGcPauses) {
  MockKafka kafka;
  char error[256] = {};
  rw_identity id{"job-ops", 3, 4, "h", 0, 0, nullptr};
  rw_options o{};
  o.brokers = kafka.bootstrap().c_str();
  o.flush_interval_ms = 20;
  o.control_topic = "";
  o.watch_gc = 1;
  rw_collector* c = rw_collector_create(&id, &o, error, sizeof(error));
  ASSERT_NE(c, nullptr) << error;
  rw_layout bad{};
  bad.pipeline_rank = 1;  // size 0 means 1
  EXPECT_EQ(rw_layout_set(c, &bad, error, sizeof(error)), -1);
  EXPECT_NE(std::string(error).find("pipeline rank 1"), std::string::npos) << error;
  rw_layout layout{};
  layout.pipeline_rank = 1;
  layout.pipeline_size = 2;
  layout.data_rank = 1;
  layout.data_size = 2;
  layout.virtual_stages = 2;
  ASSERT_EQ(rw_layout_set(c, &layout, error, sizeof(error)), 0) << error;
  rw_step_begin(c, 4);
  rw_op_scope fwd = rw_op_begin(RW_OP_FORWARD_COMPUTE, 3, 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(2));
  EXPECT_EQ(rw_op_end(c, &fwd), 0);
  const uint64_t now = rw_now_ns();
  EXPECT_EQ(rw_op_add(c, RW_OP_BACKWARD_SEND, 3, 1, now, now + 5000), 0);
  EXPECT_EQ(rw_op_add(c, static_cast<rw_op_type>(99), 0, 0, now, now + 5000), -1);
  rw_gc_pause_add(c, now, now + 3 * kMs);
  rw_step_end(c);
  rw_stats s;
  rw_stats_get(c, &s);
  EXPECT_EQ(s.ops_recorded, 3u);
  EXPECT_EQ(s.ops_dropped, 0u);
  rw_collector_destroy(c, 1, 5000);
  const std::vector<v1::Batch> batches = kafka.ReadAll(std::chrono::milliseconds(500));
  ASSERT_FALSE(batches.empty());
  EXPECT_EQ(batches.front().source().layout().pipeline_rank(), 1u);
  EXPECT_EQ(batches.front().source().layout().virtual_stages(), 2u);
  const std::vector<v1::StepRecord> steps = Steps(batches);
  ASSERT_EQ(steps.size(), 1u);
  ASSERT_EQ(steps[0].ops_size(), 3);
  EXPECT_EQ(steps[0].ops(0).type(), v1::OP_FORWARD_COMPUTE);
  EXPECT_EQ(steps[0].ops(0).microbatch(), 3u);
  EXPECT_EQ(steps[0].ops(0).model_chunk(), 1u);
  EXPECT_GE(steps[0].ops(0).duration_us(), 2000u);
  EXPECT_EQ(steps[0].gc_count(), 1u);
  EXPECT_EQ(steps[0].gc_ns(), 3 * kMs);
  int gc_ops = 0;
  for (const v1::OpRecord& r : steps[0].ops()) gc_ops += r.type() == v1::OP_GC;
  EXPECT_EQ(gc_ops, 1);
}

}  // namespace
}  // namespace rankwatch
