// NodeAgent against a Kafka that takes nothing: a real BatchPublisher whose broker does not
// answer (nothing listens on its port) and whose local queue holds one batch, so the first
// sample fills it for good, as when a broker hangs. A trace file then waits for room for its
// publish timeout, is counted as failed, and the agent goes on; samples never wait.
#include "collectors/agent/node_agent.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <librdkafka/rdkafka.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <thread>

#include "ingest/embedded_broker.h"

namespace rankwatch {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr auto kTimeout = std::chrono::milliseconds(600);

class NodeAgentTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("node-agent-" + std::to_string(getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    PublisherOptions p;
    p.brokers = "127.0.0.1:1";  // nothing listens: nothing is ever delivered
    p.queue_max_messages = 1;
    p.when_full = PublisherOptions::WhenFull::kDropNewest;
    p.properties = {{"log_level", "0"}};
    auto publisher = BatchPublisher::Create(p);
    ASSERT_TRUE(publisher.ok()) << publisher.status();
    publisher_ = std::move(*publisher);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::unique_ptr<NodeAgent> Agent() {
    NodeAgentOptions o;
    o.training_job = "agent-test";
    o.world_size = 8;
    o.node = "node-0";
    o.trace_dir = dir_.string();
    o.nvml_library = "libnvidia-ml-absent.so.1";
    o.trace_publish_timeout = kTimeout;
    return std::make_unique<NodeAgent>(o, publisher_.get());
  }

  // One tick; returns how long it took.
  static std::chrono::milliseconds TimedTick(NodeAgent* agent) {
    const auto t0 = Clock::now();
    agent->Tick(1'700'000'000'000'000'000);
    return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0);
  }

  // A trace appears after the agent's first look, and is reported once it held still across
  // two polls: the third tick publishes it.
  void ExpectTraceFailsAfterItsTimeout(const fs::path& fixture, const std::string& name) {
    auto agent = Agent();
    TimedTick(agent.get());  // the sample fills the queue; the directory is empty
    EXPECT_EQ(agent->counters().batches_sent.load(), 1u);
    fs::copy_file(fixture, dir_ / name);
    EXPECT_LT(TimedTick(agent.get()), kTimeout);  // a sample dropped; the trace seen once
    EXPECT_EQ(agent->counters().batches_dropped.load(), 1u);
    const auto took = TimedTick(agent.get());
    EXPECT_GE(took, kTimeout);
    EXPECT_LT(took, kTimeout + std::chrono::seconds(2));
    EXPECT_EQ(agent->counters().trace_files_failed.load(), 1u);
    EXPECT_EQ(agent->counters().trace_files_published.load(), 0u);
    EXPECT_EQ(agent->counters().batches_sent.load(), 1u);
    EXPECT_EQ(agent->counters().trace_kernel_events.load(), 0u);  // none of them was sent
    EXPECT_EQ(agent->counters().trace_steps.load(), 0u);
    // The agent goes on at once: the file is not retried, samples are dropped, not waited on.
    EXPECT_LT(TimedTick(agent.get()), kTimeout);
    EXPECT_EQ(agent->counters().trace_files_failed.load(), 1u);
    EXPECT_EQ(agent->counters().batches_dropped.load(), 3u);
  }

  fs::path dir_;
  std::unique_ptr<BatchPublisher> publisher_;
};

TEST_F(NodeAgentTest, AKinetoTraceWaitsForKafkaForItsTimeoutThenCountsAsFailed) {
  ExpectTraceFailsAfterItsTimeout(
      fs::path(RANKWATCH_FIXTURES) / "kineto/hta-trace-filter-2rank/sampled_rank-0.json.gz",
      "worker0.1700000000000.pt.trace.json.gz");
}

TEST_F(NodeAgentTest, AnAscendIterationTraceWaitsForKafkaForItsTimeoutThenCountsAsFailed) {
  ExpectTraceFailsAfterItsTimeout(
      fs::path(RANKWATCH_FIXTURES) /
          "mindspore-step-trace-raw/cluster_propose/step_trace_raw_0_detail_time.csv",
      "step_trace_raw_0_detail_time.csv");
}

// Concurrency (run under TSan by scripts/test.sh --sanitize=thread): the agent ticks on a
// thread of its own against a broker that answers (the embedded broker), librdkafka's threads
// report deliveries, another thread reads the counters, and a Kineto trace appears in the
// watched directory meanwhile. The trace is published once, every batch the agent sent is on
// the topic, and the kernel events on it are the ones the counters say.
TEST(NodeAgentConcurrencyTest, TicksDeliveriesAndCounterReadsRaceWithoutLosingBatches) {
  const fs::path dir = fs::temp_directory_path() / ("node-agent-race-" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  auto broker = EmbeddedBroker::Start({"agent.telemetry", 1, 1, /*changelog_topic=*/false});
  ASSERT_TRUE(broker.ok()) << broker.status();
  PublisherOptions p;
  p.brokers = (*broker)->bootstrap();
  p.topic = "agent.telemetry";
  p.properties = {{"log_level", "0"}};
  auto publisher = BatchPublisher::Create(p);
  ASSERT_TRUE(publisher.ok()) << publisher.status();
  NodeAgentOptions o;
  o.training_job = "agent-race";
  o.world_size = 2;
  o.node = "node-0";
  o.trace_dir = dir.string();
  o.nvml_library = "libnvidia-ml-absent.so.1";
  NodeAgent agent(o, publisher->get());

  std::atomic<bool> stop{false};
  std::atomic<int> ticks{0};
  std::thread ticker([&] {
    while (!stop) {
      agent.Tick(1'700'000'000'000'000'000 + ticks * 10'000'000LL);
      ++ticks;
      (*publisher)->Poll(std::chrono::milliseconds(0));
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  });
  std::thread reader([&] {
    uint64_t last_sent = 0, last_samples = 0;
    while (!stop) {
      const uint64_t sent = agent.counters().batches_sent.load();
      const uint64_t samples = agent.counters().samples.load();
      EXPECT_GE(sent, last_sent);
      EXPECT_GE(samples, last_samples);
      last_sent = sent;
      last_samples = samples;
      std::this_thread::yield();
    }
  });
  while (ticks < 3) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  fs::copy_file(
      fs::path(RANKWATCH_FIXTURES) / "kineto/hta-trace-filter-2rank/sampled_rank-0.json.gz",
      dir / "worker0.1700000000000.pt.trace.json.gz");
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  while (agent.counters().trace_files_published.load() == 0 && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const int ticks_then = ticks;
  while (ticks < ticks_then + 5) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  stop = true;
  ticker.join();
  reader.join();
  ASSERT_TRUE((*publisher)->Flush(std::chrono::seconds(30)).ok());

  const NodeAgentCounters& c = agent.counters();
  EXPECT_EQ(c.trace_files_published.load(), 1u);
  EXPECT_EQ(c.trace_files_failed.load(), 0u);
  EXPECT_EQ(c.batches_dropped.load(), 0u);
  EXPECT_GT(c.samples.load(), 3u);
  EXPECT_GT(c.trace_kernel_events.load(), 0u);
  EXPECT_EQ((*publisher)->delivered(), c.batches_sent.load());

  // Everything on the topic, read back.
  rd_kafka_conf_t* conf = rd_kafka_conf_new();
  char err[256];
  rd_kafka_conf_set(conf, "bootstrap.servers", (*broker)->bootstrap().c_str(), err, sizeof(err));
  rd_kafka_conf_set(conf, "group.id", "agent-race", err, sizeof(err));
  rd_kafka_conf_set(conf, "log_level", "0", err, sizeof(err));
  rd_kafka_t* consumer = rd_kafka_new(RD_KAFKA_CONSUMER, conf, err, sizeof(err));
  ASSERT_NE(consumer, nullptr) << err;
  rd_kafka_topic_partition_list_t* parts = rd_kafka_topic_partition_list_new(1);
  rd_kafka_topic_partition_list_add(parts, "agent.telemetry", 0)->offset =
      RD_KAFKA_OFFSET_BEGINNING;
  rd_kafka_assign(consumer, parts);
  rd_kafka_topic_partition_list_destroy(parts);
  uint64_t batches = 0, kernels = 0;
  const auto read_deadline = Clock::now() + std::chrono::seconds(30);
  while (batches < c.batches_sent.load() && Clock::now() < read_deadline) {
    rd_kafka_message_t* m = rd_kafka_consumer_poll(consumer, 100);
    if (m == nullptr) continue;
    if (m->err == RD_KAFKA_RESP_ERR_NO_ERROR) {
      v1::Batch b;
      EXPECT_TRUE(b.ParseFromArray(m->payload, static_cast<int>(m->len)));
      ++batches;
      kernels += b.kernels_size();
    }
    rd_kafka_message_destroy(m);
  }
  rd_kafka_consumer_close(consumer);
  rd_kafka_destroy(consumer);
  EXPECT_EQ(batches, c.batches_sent.load());
  EXPECT_EQ(kernels, c.trace_kernel_events.load());
  fs::remove_all(dir);
}

}  // namespace
}  // namespace rankwatch
