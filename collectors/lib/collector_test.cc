#include "collectors/lib/collector.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <thread>

#include "collectors/lib/collector_test_support.h"
#include "collectors/lib/rankwatch_collector.h"
#include "common/wall_clock.h"

namespace rankwatch {
namespace {

// A capture of `steps` steps for `rank` of `job`, due in a minute.
v1::ControlRequest CaptureRequest(const std::string& id, const std::string& job, uint32_t rank,
                                  uint32_t steps) {
  v1::ControlRequest request;
  request.set_id(id);
  request.set_training_job(job);
  request.add_ranks(rank);
  request.set_deadline_unix_ns(WallNowUnixNs() + 60'000'000'000);
  request.mutable_capture()->set_steps(steps);
  return request;
}

TEST(CollectorTest, RejectsABadIdentity) {
  CollectorIdentity id = Identity();
  id.rank = 4;
  CollectorOptions o;
  o.brokers = "127.0.0.1:1";
  EXPECT_FALSE(Collector::Create(id, o).ok());
  id = Identity();
  id.training_job.clear();
  EXPECT_FALSE(Collector::Create(id, o).ok());
}

TEST(CollectorTest, PublishesStepsWithTheirPhasesIdentityAndAFinalBatch) {
  MockKafka kafka;
  CollectorOptions o;
  o.brokers = kafka.bootstrap();
  o.flush_interval_ms = 20;
  auto c = Collector::Create(Identity(), o);
  ASSERT_TRUE(c.ok()) << c.status();
  const uint64_t ms = 1'000'000;
  for (uint64_t step = 0; step < 5; ++step) {
    const uint64_t t0 = 1000 * ms * (step + 1);
    (*c)->AddPhase(StepPhase::kDataloader, t0, t0 + 2 * ms);  // fetched before the step opens
    (*c)->BeginStep(step, t0 + 2 * ms);
    (*c)->AddPhase(StepPhase::kForward, t0 + 2 * ms, t0 + 5 * ms);
    (*c)->AddPhase(StepPhase::kBackward, t0 + 5 * ms, t0 + 11 * ms);
    (*c)->AddPhase(StepPhase::kCollective, t0 + 9 * ms, t0 + 11 * ms);
    (*c)->RecordMemory(100 + step, 200, 0);
    (*c)->RecordMemory(50, 300, 0);
    (*c)->EndStep(t0 + 12 * ms);
  }
  ASSERT_TRUE((*c)->Close(true, std::chrono::seconds(10)).ok());
  const std::vector<v1::Batch> batches = kafka.ReadAll(std::chrono::milliseconds(1500));
  ASSERT_FALSE(batches.empty());
  EXPECT_TRUE(batches.back().final());
  const std::vector<v1::StepRecord> steps = Steps(batches);
  ASSERT_EQ(steps.size(), 5u);
  for (uint64_t i = 0; i < 5; ++i) {
    const v1::StepRecord& s = steps[i];
    EXPECT_EQ(s.step(), i);
    EXPECT_EQ(s.step_time_ns(), 12 * ms);  // from the dataloader fetch to the step's end
    EXPECT_EQ(s.dataloader_ns(), 2 * ms);
    EXPECT_EQ(s.forward_ns(), 3 * ms);
    EXPECT_EQ(s.backward_ns(), 6 * ms);
    EXPECT_EQ(s.collective_ns(), 2 * ms);
    EXPECT_FALSE(s.has_optimizer_ns());  // never timed: absent, not zero
    EXPECT_EQ(s.peak_allocated_bytes(), 100 + i);
    EXPECT_EQ(s.peak_reserved_bytes(), 300u);
    EXPECT_FALSE(s.has_device_capacity_bytes());
    EXPECT_GT(s.end_unix_ns(), 0);
  }
  const v1::SourceIdentity& src = batches.front().source();
  EXPECT_EQ(src.training_job(), "job-a");
  EXPECT_EQ(src.rank(), 2u);
  EXPECT_EQ(src.world_size(), 4u);
  EXPECT_EQ(src.node(), "host-1");
  EXPECT_GT(src.pid(), 0u);
  EXPECT_EQ(src.training_strategy(), "");  // not said
  EXPECT_FALSE(src.sharded());
  EXPECT_EQ(batches.front().schema_version(), 1u);
  for (size_t i = 0; i < batches.size(); ++i) EXPECT_EQ(batches[i].sequence(), i);
}

TEST(CollectorTest, BatchesCarryTheTrainingStrategySetLast) {
  MockKafka kafka;
  CollectorOptions o;
  o.brokers = kafka.bootstrap();
  o.flush_interval_ms = 20;
  CollectorIdentity id = Identity();
  id.training_strategy = "ddp";
  auto c = Collector::Create(id, o);
  ASSERT_TRUE(c.ok()) << c.status();
  (*c)->BeginStep(0, 1000);
  (*c)->EndStep(2000);
  ASSERT_TRUE((*c)->Flush(std::chrono::seconds(10)).ok());
  (*c)->SetTrainingStrategy("fsdp", true);
  EXPECT_EQ((*c)->identity().training_strategy, "fsdp");
  EXPECT_TRUE((*c)->identity().sharded);
  (*c)->BeginStep(1, 3000);
  (*c)->EndStep(4000);
  ASSERT_TRUE((*c)->Close(true, std::chrono::seconds(10)).ok());
  const std::vector<v1::Batch> batches = kafka.ReadAll(std::chrono::milliseconds(1500));
  ASSERT_GE(batches.size(), 2u);
  EXPECT_EQ(batches.front().source().training_strategy(), "ddp");
  EXPECT_FALSE(batches.front().source().sharded());
  EXPECT_EQ(batches.back().source().training_strategy(), "fsdp");
  EXPECT_TRUE(batches.back().source().sharded());
}

TEST(CollectorTest, KernelEventsAreInternedIntoTheBatch) {
  MockKafka kafka;
  CollectorOptions o;
  o.brokers = kafka.bootstrap();
  o.flush_interval_ms = 20;
  auto c = Collector::Create(Identity(), o);
  ASSERT_TRUE(c.ok());
  std::vector<KernelEventInput> events(3);
  for (int i = 0; i < 3; ++i) {
    events[i].name = i == 1 ? "nccl:all_reduce" : "gemm";
    events[i].category = "kernel";
    events[i].ts_ns = 1000 * i;
    events[i].dur_ns = 500;
    events[i].stream = 7;
    events[i].step = 3;
  }
  (*c)->RecordKernels(events);
  ASSERT_TRUE((*c)->Flush(std::chrono::seconds(10)).ok());
  const std::vector<v1::Batch> batches = kafka.ReadAll(std::chrono::milliseconds(500));
  ASSERT_EQ(batches.size(), 1u);
  const v1::Batch& b = batches[0];
  ASSERT_EQ(b.kernels_size(), 3);
  EXPECT_EQ(b.strings_size(), 4);  // "", gemm, kernel, nccl:all_reduce
  EXPECT_EQ(b.strings(b.kernels(1).name()), "nccl:all_reduce");
  EXPECT_EQ(b.kernels(0).name(), b.kernels(2).name());
  EXPECT_EQ(b.strings(b.kernels(2).category()), "kernel");
  EXPECT_EQ(b.kernels(2).ts_ns(), 2000);
  EXPECT_EQ(b.kernels(0).step(), 3);
  EXPECT_EQ(b.trace().source_format(), "collector");
}

// Kernel events that half fill their buffer are shipped at once, not at the next interval
// (here a minute away), so a long interval does not turn a burst of kernels into drops.
TEST(CollectorTest, AHalfFullKernelBufferShipsBeforeTheInterval) {
  MockKafka kafka;
  CollectorOptions o;
  o.brokers = kafka.bootstrap();
  o.flush_interval_ms = 60'000;
  o.max_kernel_events = 64;
  auto c = Collector::Create(Identity(), o);
  ASSERT_TRUE(c.ok());
  auto gemms = [](size_t n) {
    std::vector<KernelEventInput> events(n);
    for (KernelEventInput& e : events) {
      e.name = "gemm";
      e.category = "kernel";
    }
    return events;
  };
  (*c)->RecordKernels(gemms(24));  // 24 of 64: below half
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ((*c)->stats().batches_produced, 0u) << "shipped before the buffer was half full";
  (*c)->RecordKernels(gemms(16));  // 40 of 64
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while ((*c)->stats().batches_produced == 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ((*c)->stats().batches_produced, 1u);
  int kernels = 0;
  for (const v1::Batch& b : kafka.ReadAll(std::chrono::milliseconds(300)))
    kernels += b.kernels_size();
  EXPECT_EQ(kernels, 40);
  EXPECT_EQ((*c)->stats().records_dropped, 0u);
  ASSERT_TRUE((*c)->Close(true, std::chrono::seconds(10)).ok());
}

// The broker goes away: recording stays fast, memory stays bounded, drops are counted and
// reported, and delivery resumes by itself when the broker returns.
TEST(CollectorTest, BrokerDownNeverBlocksBoundsMemoryAndRecovers) {
  MockKafka kafka;
  CollectorOptions o;
  o.brokers = kafka.bootstrap();
  o.flush_interval_ms = 10;
  o.max_pending_bytes = 2048;
  o.kafka_queue_max_messages = 4;
  o.kafka_queue_max_kbytes = 64;
  auto c = Collector::Create(Identity(), o);
  ASSERT_TRUE(c.ok());
  uint64_t step = 0;
  auto record = [&](int n) {
    uint64_t worst_ns = 0;
    for (int i = 0; i < n; ++i, ++step) {
      const uint64_t t0 = Collector::NowNs();
      (*c)->BeginStep(step, t0);
      (*c)->AddPhase(StepPhase::kForward, t0, t0 + 1000);
      (*c)->EndStep(t0 + 2000);
      worst_ns = std::max(worst_ns, Collector::NowNs() - t0);
      if (i % 8 == 7) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return worst_ns;
  };
  record(20);
  ASSERT_TRUE((*c)->Flush(std::chrono::seconds(10)).ok());
  kafka.SetDown(true);
  const uint64_t worst_down_ns = record(3000);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  CollectorStats down = (*c)->stats();
  EXPECT_LT(worst_down_ns, 5'000'000u) << "recording waited for Kafka";
  EXPECT_GT(down.records_dropped, 0u);
  EXPECT_GT(down.batches_dropped, 0u);
  EXPECT_LE(down.max_buffered_bytes, o.max_pending_bytes + 64 * 1024 + 4096);
  EXPECT_LE(down.max_buffered_bytes, down.memory_bound_bytes);

  kafka.SetDown(false);
  record(20);
  ASSERT_TRUE((*c)->Flush(std::chrono::seconds(30)).ok());
  const std::vector<v1::Batch> batches = kafka.ReadAll(std::chrono::milliseconds(1500));
  const std::vector<v1::StepRecord> steps = Steps(batches);
  ASSERT_FALSE(steps.empty());
  EXPECT_EQ(steps.back().step(), step - 1);  // the newest data made it
  uint64_t reported = 0;
  for (const v1::Batch& b : batches) reported += b.dropped_records();
  const CollectorStats after = (*c)->stats();
  EXPECT_EQ(steps.size() + after.records_dropped, step);  // every step delivered or counted
  EXPECT_GT(reported, 0u);
  EXPECT_LE(reported, after.records_dropped);
}

// Concurrency (run under TSan by scripts/test.sh --sanitize=thread): the training thread opens
// and closes steps while four threads record kernel events, one adds phases and raises memory
// peaks, one changes the training strategy, and one reads stats and flushes, all while the
// sender thread seals and produces batches every 5 ms. Nothing is dropped: every step arrives
// once and in order, every kernel event arrives once and in each thread's order, the phase time
// added adds up, and the strategy set last is on the final batch.
TEST(CollectorTest, ManyRecordingThreadsRaceTheSenderWithoutLosingAnything) {
  MockKafka kafka;
  CollectorOptions o;
  o.brokers = kafka.bootstrap();
  o.flush_interval_ms = 5;
  o.max_pending_bytes = 64u << 20;  // room for everything: any loss is a bug, not a bound
  auto c = Collector::Create(Identity(), o);
  ASSERT_TRUE(c.ok()) << c.status();
  Collector& collector = **c;
  constexpr int kKernelThreads = 4, kKernelBatches = 100, kPerBatch = 10;
  constexpr uint64_t kSteps = 300, kPhaseAdds = 2000, kPhaseNs = 7;
  std::atomic<bool> done{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < kKernelThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int b = 0; b < kKernelBatches; ++b) {
        std::vector<KernelEventInput> events(kPerBatch);
        for (int i = 0; i < kPerBatch; ++i) {
          events[i].name = "kernel-" + std::to_string(t);
          events[i].category = "kernel";
          events[i].ts_ns = b * kPerBatch + i;  // this thread's order
          events[i].dur_ns = 1;
          events[i].stream = t;
        }
        collector.RecordKernels(events);
        if (b % 10 == 9) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    });
  }
  threads.emplace_back([&] {
    for (uint64_t i = 0; i < kPhaseAdds; ++i) {
      collector.AddPhase(StepPhase::kForward, 1000, 1000 + kPhaseNs);
      collector.RecordMemory(i, 2 * i, 0);
    }
  });
  threads.emplace_back([&] {
    for (int i = 0; i < 200; ++i) {
      collector.SetTrainingStrategy(i % 2 ? "fsdp" : "ddp", i % 2 == 1);
      EXPECT_FALSE(collector.identity().training_strategy.empty());
    }
    collector.SetTrainingStrategy("deepspeed_zero3", true);
  });
  std::thread observer([&] {
    uint64_t last_steps = 0;
    while (!done) {
      const CollectorStats s = collector.stats();
      EXPECT_GE(s.steps_recorded, last_steps);
      last_steps = s.steps_recorded;
      EXPECT_TRUE(collector.Flush(std::chrono::seconds(30)).ok());
    }
  });
  // The training thread; its last step opens after every other recorder finished, so every
  // phase added lands in some step.
  for (uint64_t step = 0; step + 1 < kSteps; ++step) {
    collector.BeginStep(step, 10 * step);
    collector.EndStep(10 * step + 5);
    if (step % 50 == 49) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  for (std::thread& t : threads) t.join();
  collector.BeginStep(kSteps - 1, 10 * kSteps);
  collector.EndStep(10 * kSteps + 5);
  done = true;
  observer.join();
  ASSERT_TRUE(collector.Close(true, std::chrono::seconds(30)).ok());

  const CollectorStats stats = collector.stats();
  EXPECT_EQ(stats.records_dropped, 0u);
  EXPECT_EQ(stats.steps_recorded, kSteps);
  EXPECT_EQ(stats.kernels_recorded, uint64_t{kKernelThreads * kKernelBatches * kPerBatch});
  const std::vector<v1::Batch> batches = kafka.ReadAll(std::chrono::milliseconds(1500));
  ASSERT_FALSE(batches.empty());
  EXPECT_TRUE(batches.back().final());
  EXPECT_EQ(batches.back().source().training_strategy(), "deepspeed_zero3");
  const std::vector<v1::StepRecord> steps = Steps(batches);
  ASSERT_EQ(steps.size(), kSteps);
  uint64_t forward_ns = 0;
  for (uint64_t i = 0; i < kSteps; ++i) {
    EXPECT_EQ(steps[i].step(), i);
    forward_ns += steps[i].forward_ns();
  }
  EXPECT_EQ(forward_ns, kPhaseAdds * kPhaseNs);
  std::vector<std::vector<int64_t>> per_thread(kKernelThreads);
  for (size_t i = 0; i < batches.size(); ++i) {
    EXPECT_EQ(batches[i].sequence(), i);
    for (const auto& k : batches[i].kernels()) {
      ASSERT_GE(k.stream(), 0);
      ASSERT_LT(k.stream(), kKernelThreads);
      EXPECT_EQ(batches[i].strings(k.name()), "kernel-" + std::to_string(k.stream()));
      per_thread[k.stream()].push_back(k.ts_ns());
    }
  }
  for (int t = 0; t < kKernelThreads; ++t) {
    ASSERT_EQ(per_thread[t].size(), size_t{kKernelBatches * kPerBatch}) << "thread " << t;
    for (size_t i = 0; i < per_thread[t].size(); ++i) {
      EXPECT_EQ(per_thread[t][i], static_cast<int64_t>(i)) << "thread " << t;
    }
  }
}

// A capture request produced on the control topic reaches the training side; the capture's
// events ship in batches of their own, tagged with the request id, before its DONE reply.
TEST(CollectorTest, AControlRequestIsTakenAndACaptureShipsTaggedBeforeItsReply) {
  MockKafka kafka;
  CollectorOptions o;
  o.brokers = kafka.bootstrap();
  o.flush_interval_ms = 20;
  o.max_capture_events = 3;
  auto c = Collector::Create(Identity(), o);
  ASSERT_TRUE(c.ok()) << c.status();
  for (int i = 0; i < 1000 && !(*c)->stats().control.reading; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE((*c)->stats().control.reading);
  EXPECT_FALSE((*c)->control_pending());

  kafka.SendControl(CaptureRequest("cap-7", "job-a", 2, 2));

  for (int i = 0; i < 1000 && !(*c)->control_pending(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE((*c)->control_pending());
  const std::vector<v1::ControlRequest> taken = (*c)->TakeControlRequests();
  ASSERT_EQ(taken.size(), 1u);
  EXPECT_EQ(taken[0].id(), "cap-7");
  EXPECT_EQ(taken[0].capture().steps(), 2u);
  EXPECT_FALSE((*c)->control_pending());

  // Live kernel events and a capture in the same round: separate batches.
  (*c)->RecordKernels({{"live", "kernel", 1, 2, 7, 1, 10}});
  std::vector<KernelEventInput> captured = {{"aten::mm", "cpu_op", 100, 50, -1, -1, 11, 99},
                                            {"aten::add", "cpu_op", 160, 5, -1, -1, 12, 99},
                                            {"aten::mm", "cpu_op", 200, 50, -1, -1, 12, 99},
                                            {"aten::relu", "cpu_op", 260, 5, -1, -1, 12, 99}};
  v1::ControlReply done;
  done.set_request_id("cap-7");
  done.set_state(v1::CONTROL_DONE);
  done.set_first_step(11);
  done.set_steps(2);
  (*c)->SendCapture("cap-7", "torch.profiler", captured, done);
  ASSERT_TRUE((*c)->Close(true, std::chrono::seconds(10)).ok());
  EXPECT_EQ((*c)->stats().captures_sent, 1u);

  const std::vector<v1::Batch> batches = kafka.ReadAll(std::chrono::milliseconds(1500));
  int accepted_at = -1, capture_at = -1, done_at = -1, live_at = -1;
  for (int i = 0; i < static_cast<int>(batches.size()); ++i) {
    const v1::Batch& b = batches[i];
    for (const v1::ControlReply& r : b.control_replies()) {
      EXPECT_EQ(r.request_id(), "cap-7");
      if (r.state() == v1::CONTROL_ACCEPTED) accepted_at = i;
      if (r.state() == v1::CONTROL_DONE) {
        done_at = i;
        EXPECT_EQ(r.events(), 3u);  // max_capture_events: one cut, and the reply says so
        EXPECT_NE(r.reason().find("1 of 4 events cut"), std::string::npos) << r.reason();
        EXPECT_EQ(r.first_step(), 11);
      }
    }
    if (b.trace().capture_id() == "cap-7") {
      capture_at = i;
      EXPECT_EQ(b.trace().source_format(), "torch.profiler");
      ASSERT_EQ(b.kernels_size(), 3);
      EXPECT_EQ(b.strings(b.kernels(0).name()), "aten::mm");
      EXPECT_EQ(b.kernels(0).tid(), 99u);
      EXPECT_EQ(b.kernels(2).step(), 12);
    } else if (b.kernels_size() > 0) {
      live_at = i;
      EXPECT_EQ(b.trace().source_format(), "collector");
      EXPECT_TRUE(b.trace().capture_id().empty());
      EXPECT_EQ(b.strings(b.kernels(0).name()), "live");
    }
  }
  EXPECT_GE(accepted_at, 0);
  EXPECT_GE(live_at, 0);
  ASSERT_GE(capture_at, 0);
  EXPECT_GT(done_at, capture_at);
}

TEST(CollectorCApiTest, CreateRecordFlushDestroy) {
  MockKafka kafka;
  char error[256] = {};
  rw_identity id{"job-c", 5, 4, "h", 0, 0, nullptr};
  rw_options o{};
  o.brokers = kafka.bootstrap().c_str();
  o.flush_interval_ms = 20;
  EXPECT_EQ(rw_collector_create(&id, &o, error, sizeof(error)), nullptr);
  EXPECT_NE(std::string(error).find("world size"), std::string::npos) << error;
  id.rank = 1;
  rw_collector* c = rw_collector_create(&id, &o, error, sizeof(error));
  ASSERT_NE(c, nullptr) << error;
  rw_training_strategy_set(c, "deepspeed_zero3", 1);  // before any batch is sealed
  const uint64_t t = rw_now_ns();
  rw_step_begin(c, 7);
  rw_phase_add(c, RW_PHASE_OPTIMIZER, t, t + 10);
  rw_memory_peak(c, 1, 2, 3);
  rw_step_end(c);
  rw_kernel_event k{"k", "kernel", 0, 5, 1, -1, 7};
  rw_kernels_record(c, &k, 1);
  EXPECT_EQ(rw_flush(c, 10000), 0);
  rw_stats s;
  rw_stats_get(c, &s);
  EXPECT_EQ(s.steps_recorded, 1u);
  EXPECT_EQ(s.kernels_recorded, 1u);
  EXPECT_GE(s.batches_delivered, 1u);
  rw_collector_destroy(c, 1, 5000);
  const std::vector<v1::Batch> batches = kafka.ReadAll(std::chrono::milliseconds(500));
  ASSERT_FALSE(batches.empty());
  EXPECT_EQ(batches.front().source().training_strategy(), "deepspeed_zero3");
  EXPECT_TRUE(batches.front().source().sharded());
  const std::vector<v1::StepRecord> steps = Steps(batches);
  ASSERT_EQ(steps.size(), 1u);
  EXPECT_EQ(steps[0].step(), 7u);
  EXPECT_EQ(steps[0].optimizer_ns(), 10u);
  EXPECT_EQ(steps[0].device_capacity_bytes(), 3u);
}

// The C API's control channel, as a C program would use it: captures taken at step
// boundaries and answered with their events, or refused when the application takes none.
TEST(CollectorCApiTest, CapturesAreTakenAndAnsweredOrRefusedWhenNotTaken) {
  MockKafka kafka;
  char error[256] = {};
  rw_identity taker_id{"job-c", 1, 4, "h", 0, 0, nullptr};
  rw_identity other_id{"job-c", 3, 4, "h", 0, 0, nullptr};
  rw_options o{};
  o.brokers = kafka.bootstrap().c_str();
  o.flush_interval_ms = 20;
  o.take_captures = 1;
  rw_collector* taker = rw_collector_create(&taker_id, &o, error, sizeof(error));
  ASSERT_NE(taker, nullptr) << error;
  o.take_captures = 0;
  rw_collector* other = rw_collector_create(&other_id, &o, error, sizeof(error));
  ASSERT_NE(other, nullptr) << error;
  // Sent while the listeners may still be connecting: they look back 1,000 messages.
  kafka.SendControl(CaptureRequest("cap-c1", "job-c", 1, 2));
  kafka.SendControl(CaptureRequest("cap-c3", "job-c", 3, 2));

  rw_capture_request r{};
  int taken = 0;
  for (int i = 0; i < 1000 && taken == 0; ++i) {
    rw_step_begin(taker, static_cast<uint64_t>(i));
    rw_step_end(taker);
    taken = rw_capture_take(taker, &r);
    if (taken == 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(taken, 1);
  EXPECT_STREQ(r.id, "cap-c1");
  EXPECT_EQ(r.steps, 2u);
  EXPECT_EQ(r.cuda, 0);
  EXPECT_GT(r.deadline_unix_ns, 0);
  EXPECT_EQ(rw_capture_take(taker, &r), 0);  // taken once
  const rw_kernel_event events[] = {{"my_gemm", "cpu_op", 100, 40, -1, -1, 20},
                                    {"my_gemm", "cpu_op", 200, 40, -1, -1, 21}};
  rw_capture_send(taker, "cap-c1", "my_profiler", 20, 2, 1'000'000, events, 2);
  rw_capture_fail(taker, "cap-nope", "the profiler would not start");
  // The other application takes no captures: nothing to take, and its request was refused.
  EXPECT_EQ(rw_capture_take(other, &r), 0);
  rw_stats s;
  for (int i = 0; i < 1000; ++i) {
    rw_stats_get(other, &s);
    if (s.control_refused > 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(s.control_refused, 1u);
  EXPECT_EQ(s.control_accepted, 0u);
  rw_stats_get(taker, &s);
  EXPECT_EQ(s.control_accepted, 1u);
  EXPECT_EQ(s.captures_sent, 1u);
  rw_collector_destroy(taker, 1, 5000);
  rw_collector_destroy(other, 1, 5000);

  std::map<std::string, std::vector<v1::ControlState>> states;
  std::string refused_reason, failed_reason;
  int capture_batches = 0;
  for (const v1::Batch& b : kafka.ReadAll(std::chrono::milliseconds(1000))) {
    for (const v1::ControlReply& reply : b.control_replies()) {
      states[reply.request_id()].push_back(reply.state());
      if (reply.state() == v1::CONTROL_REFUSED) refused_reason = reply.reason();
      if (reply.state() == v1::CONTROL_FAILED) failed_reason = reply.reason();
      if (reply.state() == v1::CONTROL_DONE) {
        EXPECT_EQ(reply.events(), 2u);
        EXPECT_EQ(reply.first_step(), 20);
        EXPECT_EQ(reply.profiled_step_ns(), 1'000'000u);
        EXPECT_EQ(b.source().rank(), 1u);
      }
    }
    if (b.trace().capture_id() == "cap-c1") {
      ++capture_batches;
      EXPECT_EQ(b.source().rank(), 1u);
      EXPECT_EQ(b.trace().source_format(), "my_profiler");
      ASSERT_EQ(b.kernels_size(), 2);
      EXPECT_EQ(b.strings(b.kernels(1).name()), "my_gemm");
      EXPECT_EQ(b.kernels(1).step(), 21);
    }
  }
  EXPECT_EQ(capture_batches, 1);
  EXPECT_EQ(states["cap-c1"],
            (std::vector<v1::ControlState>{v1::CONTROL_ACCEPTED, v1::CONTROL_DONE}));
  EXPECT_EQ(states["cap-c3"], std::vector<v1::ControlState>{v1::CONTROL_REFUSED});
  EXPECT_NE(refused_reason.find("takes no captures"), std::string::npos) << refused_reason;
  EXPECT_EQ(states["cap-nope"], std::vector<v1::ControlState>{v1::CONTROL_FAILED});
  EXPECT_EQ(failed_reason, "the profiler would not start");
}

}  // namespace
}  // namespace rankwatch
