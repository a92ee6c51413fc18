// The collector against a message size limit (issue #47): every message it produces fits
// max_message_bytes as librdkafka counts it (value + key + 36 bytes), however many ops a step
// has or events a capture has, and everything arrives; what cannot fit is dropped, counted and
// logged once, later data still arrives, and the producer is never recreated for it. Real
// producer, librdkafka's mock broker over TCP, read back with a consumer.
#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "collectors/lib/collector.h"
#include "collectors/lib/collector_test_support.h"
#include "collectors/lib/rankwatch_collector.h"

namespace rankwatch {
namespace {

constexpr uint64_t kUs = 1000;
constexpr uint64_t kMs = 1000 * kUs;

// librdkafka's count of a message against message.max.bytes.
size_t WireBytes(const MockKafka::Message& m) {
  return m.value_bytes + m.key_bytes + kKafkaRecordOverheadBytes;
}

// Reads the topic on a thread of its own while the collector produces (the mock broker keeps
// only the newest 5 MiB of a partition), until `silence` passes without a message.
class Reader {
 public:
  Reader(MockKafka* kafka, std::chrono::milliseconds silence)
      : thread_([this, kafka, silence] { messages_ = kafka->ReadAllMessages(silence); }) {}
  std::vector<MockKafka::Message> Join() {
    thread_.join();
    return std::move(messages_);
  }

 private:
  std::vector<MockKafka::Message> messages_;
  std::thread thread_;
};

// The default logger's lines while it lives.
class LogCapture {
 public:
  LogCapture() : previous_(spdlog::default_logger()) {
    auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(out_);
    spdlog::set_default_logger(std::make_shared<spdlog::logger>("capture", sink));
  }
  ~LogCapture() { spdlog::set_default_logger(previous_); }
  std::string Text() {
    spdlog::default_logger()->flush();
    return out_.str();
  }
  // Lines containing `text`.
  int Count(const std::string& text) {
    spdlog::default_logger()->flush();
    std::istringstream lines(out_.str());
    int n = 0;
    for (std::string line; std::getline(lines, line);) n += line.find(text) != std::string::npos;
    return n;
  }

 private:
  std::ostringstream out_;
  std::shared_ptr<spdlog::logger> previous_;
};

// Step `step` at `t` with `ops` ops of 0.7 us, one each microsecond.
void OpHeavyStep(Collector& c, uint64_t step, uint64_t t, uint32_t ops) {
  c.BeginStep(step, t);
  for (uint32_t i = 0; i < ops; ++i) {
    c.AddOp(static_cast<v1::OpType>(1 + i % 16), i % 64, i % 2, t + i * kUs, t + i * kUs + 700);
  }
  c.EndStep(t + ops * kUs + 5 * kMs);
}

// 256 KiB messages: 40 steps of 4,096 ops each (~60 KB a record), 20,000 live kernel events and
// a capture of 100,000 events (~9 MB), in messages that each fit, all of it arriving: the
// capture in batches of its own tagged with its id, its DONE reply after the last of them.
TEST(CollectorSizeTest, OpHeavyStepsKernelsAndA100kEventCaptureAllArriveInMessagesThatFit) {
  constexpr size_t kLimit = 256 << 10;
  constexpr int kSteps = 40;
  constexpr uint32_t kOps = 4096;
  constexpr int kLive = 20000, kCaptured = 100000;
  MockKafka kafka;
  Reader reader(&kafka, std::chrono::milliseconds(3000));
  CollectorOptions o;
  o.brokers = kafka.bootstrap();
  o.flush_interval_ms = 20;
  o.max_message_bytes = kLimit;
  o.max_capture_events = kCaptured;
  o.op_ring_capacity = 1 << 18;    // every op of the 40 steps, however far the sender lags
  o.max_pending_bytes = 32 << 20;  // message sizes here, not the backlog's bound
  auto c = Collector::Create(Identity(), o);
  ASSERT_TRUE(c.ok()) << c.status();
  Collector& rw = **c;
  EXPECT_EQ(rw.max_message_bytes(), kLimit);
  EXPECT_EQ(rw.max_batch_bytes(), MaxBatchPayloadBytes(kLimit));
  for (int step = 0; step < kSteps; ++step) {
    OpHeavyStep(rw, step, (1000 + 10 * step) * kMs, kOps);
    if (step % 10 == 9) {
      std::vector<KernelEventInput> live;
      for (int i = 0; i < kLive / 4; ++i) {
        const int n = step / 10 * (kLive / 4) + i;
        live.push_back(
            {"live_kernel_" + std::to_string(n % 500), "kernel", 1000 * n, 900, 7, n, step});
      }
      rw.RecordKernels(live);
    }
  }
  std::vector<KernelEventInput> captured;
  for (int i = 0; i < kCaptured; ++i) {
    captured.push_back({"aten::op_" + std::to_string(i % 2000), "cpu_op", 1000 * i, 700, -1, i,
                        41 + i / (kCaptured / 5), 99});
  }
  v1::ControlReply done;
  done.set_request_id("cap-big");
  done.set_state(v1::CONTROL_DONE);
  done.set_first_step(41);
  done.set_steps(5);
  const auto t0 = std::chrono::steady_clock::now();
  rw.SendCapture("cap-big", "torch.profiler", std::move(captured), done);
  ASSERT_TRUE(rw.Close(true, std::chrono::seconds(60)).ok());
  std::printf("closed %.1f s after the capture was handed over\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  const std::vector<MockKafka::Message> messages = reader.Join();
  ASSERT_FALSE(messages.empty());

  size_t largest = 0;
  int steps = 0, capture_batches = 0, last_capture = -1, done_at = -1;
  uint64_t ops = 0, live = 0, capture_events = 0;
  for (int i = 0; i < static_cast<int>(messages.size()); ++i) {
    const MockKafka::Message& m = messages[i];
    EXPECT_LE(WireBytes(m), kLimit) << "message " << i;
    EXPECT_LE(m.value_bytes, rw.max_batch_bytes()) << "message " << i;
    largest = std::max(largest, WireBytes(m));
    const v1::Batch& b = m.batch;
    for (const v1::StepRecord& s : b.steps()) {
      EXPECT_EQ(s.step(), static_cast<uint64_t>(steps));
      ++steps;
      ops += s.ops_size();
    }
    if (b.trace().capture_id() == "cap-big") {
      // The daemon reads a capture's batches as evidence only: nothing else rides in them.
      EXPECT_EQ(b.steps_size(), 0);
      EXPECT_EQ(b.control_replies_size(), 0);
      EXPECT_EQ(b.trace().source_format(), "torch.profiler");
      for (const v1::KernelEvent& k : b.kernels()) {
        ASSERT_LT(static_cast<int>(k.name()), b.strings_size());
        ASSERT_EQ(b.strings(k.name()).rfind("aten::op_", 0), 0u);
        EXPECT_EQ(k.tid(), 99u);
      }
      capture_events += b.kernels_size();
      ++capture_batches;
      last_capture = i;
    } else {
      EXPECT_TRUE(b.trace().capture_id().empty());
      live += b.kernels_size();
    }
    for (const v1::ControlReply& r : b.control_replies()) {
      if (r.request_id() == "cap-big" && r.state() == v1::CONTROL_DONE) {
        done_at = i;
        EXPECT_EQ(r.events(), static_cast<uint64_t>(kCaptured));
        EXPECT_EQ(r.first_step(), 41);
      }
    }
  }
  std::printf(
      "%zu messages (%d of the capture), the largest %zu bytes of %zu allowed; %d steps, %llu "
      "ops\n",
      messages.size(), capture_batches, largest, kLimit, steps,
      static_cast<unsigned long long>(ops));
  EXPECT_EQ(steps, kSteps);
  EXPECT_EQ(ops, uint64_t{kSteps} * kOps);
  EXPECT_EQ(live, static_cast<uint64_t>(kLive));
  EXPECT_EQ(capture_events, static_cast<uint64_t>(kCaptured));
  EXPECT_GT(capture_batches, 20);      // ~9 MB in 256 KiB messages
  EXPECT_GT(largest, kLimit * 3 / 4);  // batches are filled, not merely small
  ASSERT_GE(last_capture, 0);
  EXPECT_GT(done_at, last_capture);  // DONE after the capture's last batch
  EXPECT_TRUE(messages.back().batch.final());
  const CollectorStats s = rw.stats();
  EXPECT_EQ(s.messages_oversized, 0u);
  EXPECT_EQ(s.ops_oversized, 0u);
  EXPECT_EQ(s.ops_dropped, 0u);
  EXPECT_EQ(s.records_dropped, 0u);
  EXPECT_EQ(s.batches_failed, 0u);
  EXPECT_EQ(s.producer_restarts, 0u);
}

// 32 KiB messages: a step of 4,096 ops (~60 KB) cannot fit even alone. It goes without its ops
// (its timing still does), counted; a control reply too large alone is dropped, counted; each
// kind is logged once however often it happens; the steps after arrive with their ops, and no
// producer is recreated.
TEST(CollectorSizeTest, WhatCannotFitIsDroppedCountedAndLoggedOnceAndLaterStepsArrive) {
  constexpr size_t kLimit = 32 << 10;
  LogCapture log;
  MockKafka kafka;
  Reader reader(&kafka, std::chrono::milliseconds(1500));
  CollectorOptions o;
  o.brokers = kafka.bootstrap();
  o.flush_interval_ms = 20;
  o.max_message_bytes = kLimit;
  auto c = Collector::Create(Identity(), o);
  ASSERT_TRUE(c.ok()) << c.status();
  Collector& rw = **c;
  EXPECT_LT(rw.max_reply_bytes(), rw.max_batch_bytes());
  for (uint64_t step = 0; step < 3; ++step) {
    OpHeavyStep(rw, step, (1000 + 10 * step) * kMs, 4096);
    ASSERT_TRUE(rw.Flush(std::chrono::seconds(10)).ok());
  }
  for (int i = 0; i < 2; ++i) {
    v1::ControlReply huge;
    huge.set_request_id("stacks-" + std::to_string(i));
    huge.set_state(v1::CONTROL_DONE);
    huge.set_reason(std::string(kLimit, 'x'));
    rw.ReplyControl(std::move(huge));
  }
  v1::ControlReply small;
  small.set_request_id("stacks-2");
  small.set_state(v1::CONTROL_DONE);
  rw.ReplyControl(small);
  for (uint64_t step = 3; step < 6; ++step) OpHeavyStep(rw, step, (1000 + 10 * step) * kMs, 50);
  ASSERT_TRUE(rw.Close(true, std::chrono::seconds(10)).ok());
  const std::vector<MockKafka::Message> messages = reader.Join();

  std::map<uint64_t, int> ops_of_step;
  bool small_reply = false;
  for (const MockKafka::Message& m : messages) {
    EXPECT_LE(WireBytes(m), kLimit);
    for (const v1::StepRecord& s : m.batch.steps()) {
      ops_of_step[s.step()] = s.ops_size();
      EXPECT_GE(s.step_time_ns(), 4096 * kUs);
    }
    for (const v1::ControlReply& r : m.batch.control_replies()) {
      EXPECT_EQ(r.request_id(), "stacks-2");
      small_reply = true;
    }
  }
  EXPECT_TRUE(small_reply);
  EXPECT_EQ(ops_of_step,
            (std::map<uint64_t, int>{{0, 0}, {1, 0}, {2, 0}, {3, 50}, {4, 50}, {5, 50}}));
  const CollectorStats s = rw.stats();
  EXPECT_EQ(s.ops_oversized, 3u * 4096);
  EXPECT_EQ(s.ops_dropped, 3u * 4096);
  EXPECT_EQ(s.messages_oversized, 2u);  // the two replies
  EXPECT_EQ(s.producer_restarts, 0u);
  EXPECT_EQ(s.batches_failed, 0u);
  EXPECT_EQ(log.Count("sent without its ops"), 1);
  EXPECT_EQ(log.Count("does not fit a Kafka message"), 1);
  EXPECT_EQ(log.Count("recreating the Kafka producer"), 0);
}

// A message.max.bytes property wins over the option, and batches follow the limit in effect.
TEST(CollectorSizeTest, TheMessageMaxBytesPropertyIsTheLimitInEffect) {
  MockKafka kafka;
  Reader reader(&kafka, std::chrono::milliseconds(1500));
  CollectorOptions o;
  o.brokers = kafka.bootstrap();
  o.flush_interval_ms = 20;
  o.properties["message.max.bytes"] = "20000";
  auto c = Collector::Create(Identity(), o);
  ASSERT_TRUE(c.ok()) << c.status();
  Collector& rw = **c;
  EXPECT_EQ(rw.max_message_bytes(), 20000u);
  std::vector<KernelEventInput> kernels;
  for (int i = 0; i < 5000; ++i) {
    kernels.push_back({"k" + std::to_string(i % 100), "kernel", 1000 * i, 900, 7, i, 0});
  }
  rw.RecordKernels(kernels);
  ASSERT_TRUE(rw.Close(true, std::chrono::seconds(10)).ok());
  uint64_t events = 0;
  const std::vector<MockKafka::Message> messages = reader.Join();
  for (const MockKafka::Message& m : messages) {
    EXPECT_LE(WireBytes(m), 20000u);
    events += m.batch.kernels_size();
  }
  EXPECT_GT(messages.size(), 10u);
  EXPECT_EQ(events, 5000u);
  EXPECT_EQ(rw.stats().messages_oversized, 0u);
}

// Not a size problem: a fatal producer state (the broker refuses the idempotent producer its
// id, twice) makes the collector recreate the producer, at most once a backoff (1 s, then 2 s):
// two restarts in 4 s of steps every 20 ms, not one a round; the steps after arrive, and those
// lost with the fatal producers are counted.
TEST(CollectorSizeTest, AFatalProducerIsRecreatedWithABackoffNotInALoop) {
  LogCapture log;
  MockKafka kafka;
  kafka.FailProducerIds(2);
  Reader reader(&kafka, std::chrono::milliseconds(1500));
  CollectorOptions o;
  o.brokers = kafka.bootstrap();
  o.flush_interval_ms = 20;
  auto c = Collector::Create(Identity(), o);
  ASSERT_TRUE(c.ok()) << c.status();
  Collector& rw = **c;
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // the first id refused: fatal
  uint64_t steps = 0;
  for (const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(4);
       std::chrono::steady_clock::now() < until; ++steps) {
    rw.BeginStep(steps, Collector::NowNs());
    rw.EndStep(Collector::NowNs() + kMs);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_TRUE(rw.Close(true, std::chrono::seconds(10)).ok());
  std::map<uint64_t, int> arrived;
  for (const MockKafka::Message& m : reader.Join()) {
    for (const v1::StepRecord& s : m.batch.steps()) ++arrived[s.step()];
  }
  const CollectorStats s = rw.stats();
  std::printf("%llu steps, %zu arrived, %llu records dropped, %llu restarts\n",
              static_cast<unsigned long long>(steps), arrived.size(),
              static_cast<unsigned long long>(s.records_dropped),
              static_cast<unsigned long long>(s.producer_restarts));
  EXPECT_EQ(s.producer_restarts, 2u);
  EXPECT_EQ(log.Count("recreating the Kafka producer"), 2);
  EXPECT_EQ(s.steps_recorded, steps);
  EXPECT_EQ(arrived.size() + s.records_dropped, steps);  // each step arrived or is counted
  for (const auto& [step, n] : arrived) EXPECT_EQ(n, 1) << "step " << step;
  ASSERT_FALSE(arrived.empty());
  EXPECT_EQ(arrived.rbegin()->first, steps - 1);
  EXPECT_GT(arrived.size(), steps / 2);
  EXPECT_EQ(s.messages_oversized, 0u);
}

// A producer that never recovers (every one is refused its id): recreated at 0, 1 and 3 s
// (the backoff doubles), not every round, and a batch that a fresh producer refuses too is
// dropped and counted rather than holding the rest back forever.
TEST(CollectorSizeTest, AProducerThatNeverRecoversIsRecreatedLessAndLessOften) {
  LogCapture log;
  MockKafka kafka;
  kafka.FailProducerIds(1000);
  CollectorOptions o;
  o.brokers = kafka.bootstrap();
  o.flush_interval_ms = 20;
  auto c = Collector::Create(Identity(), o);
  ASSERT_TRUE(c.ok()) << c.status();
  Collector& rw = **c;
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  uint64_t steps = 0;
  for (const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(4);
       std::chrono::steady_clock::now() < until; ++steps) {
    rw.BeginStep(steps, Collector::NowNs());
    rw.EndStep(Collector::NowNs() + kMs);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const CollectorStats s = rw.stats();
  (void)rw.Close(false, std::chrono::milliseconds(200));
  std::printf("%llu steps, %llu records dropped, %llu batches dropped, %llu restarts\n",
              static_cast<unsigned long long>(steps),
              static_cast<unsigned long long>(s.records_dropped),
              static_cast<unsigned long long>(s.batches_dropped),
              static_cast<unsigned long long>(s.producer_restarts));
  EXPECT_GE(s.producer_restarts, 2u);
  EXPECT_LE(s.producer_restarts, 3u);
  EXPECT_LE(log.Count("recreating the Kafka producer"), 3) << log.Text();
  EXPECT_GT(s.records_dropped, 0u);
  EXPECT_EQ(s.batches_delivered, 0u);
}

TEST(CollectorSizeTest, ALimitBelow16KiBIsRefused) {
  CollectorOptions o;
  o.brokers = "127.0.0.1:1";
  o.max_message_bytes = 8 << 10;
  auto c = Collector::Create(Identity(), o);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  o.max_message_bytes = kMinMaxMessageBytes;
  o.properties["message.max.bytes"] = "4000";
  c = Collector::Create(Identity(), o);
  EXPECT_FALSE(c.ok());
}

// The C API's setting and counters.
TEST(CollectorSizeCApiTest, MaxMessageBytesAndTheOversizedCounters) {
  MockKafka kafka;
  Reader reader(&kafka, std::chrono::milliseconds(1500));
  rw_identity id{};
  id.training_job = "job-c";
  id.world_size = 1;
  rw_options o{};
  o.brokers = kafka.bootstrap().c_str();
  o.flush_interval_ms = 20;
  o.max_message_bytes = 20000;
  char error[256] = {};
  rw_collector* c = rw_collector_create(&id, &o, error, sizeof(error));
  ASSERT_NE(c, nullptr) << error;
  rw_step_begin(c, 0);
  for (uint32_t i = 0; i < 4096; ++i) {
    const uint64_t t = rw_now_ns();
    ASSERT_EQ(rw_op_add(c, RW_OP_FORWARD_COMPUTE, i, 0, t, t + 1000), 0);
  }
  rw_step_end(c);
  rw_step_begin(c, 1);
  rw_step_end(c);
  ASSERT_EQ(rw_flush(c, 10000), 0);
  rw_stats s{};
  rw_stats_get(c, &s);
  EXPECT_EQ(s.ops_oversized, 4096u);
  EXPECT_EQ(s.ops_dropped, 4096u);
  EXPECT_EQ(s.messages_oversized, 0u);
  EXPECT_EQ(s.producer_restarts, 0u);
  EXPECT_EQ(s.steps_recorded, 2u);
  rw_collector_destroy(c, 1, 10000);
  int steps = 0;
  for (const MockKafka::Message& m : reader.Join()) {
    EXPECT_LE(WireBytes(m), 20000u);
    steps += m.batch.steps_size();
  }
  EXPECT_EQ(steps, 2);

  o.max_message_bytes = 1000;
  EXPECT_EQ(rw_collector_create(&id, &o, error, sizeof(error)), nullptr);
  EXPECT_NE(std::string(error).find("max_message_bytes"), std::string::npos) << error;
}

}  // namespace
}  // namespace rankwatch
