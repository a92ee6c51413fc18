// NodeAgent against a Kafka that takes nothing: a real BatchPublisher whose broker does not
// answer (nothing listens on its port) and whose local queue holds one batch, so the first
// sample fills it for good, as when a broker hangs. A trace file then waits for room for its
// publish timeout, is counted as failed, and the agent goes on; samples never wait.
#include "collectors/agent/node_agent.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>

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

}  // namespace
}  // namespace rankwatch
