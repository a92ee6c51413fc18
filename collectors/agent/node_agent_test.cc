// NodeAgent against a Kafka that takes nothing: a real BatchPublisher whose broker does not
// answer (nothing listens on its port) and whose local queue holds one batch, so the first
// sample fills it for good, as when a broker hangs. A trace file then waits for room for its
// publish timeout, is counted as failed, and the agent goes on; samples never wait.
#include "collectors/agent/node_agent.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <librdkafka/rdkafka.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <thread>

#include "common/wall_clock.h"
#include "kafka/embedded_broker.h"
#include "kafka/kafka_properties.h"

namespace rankwatch {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr auto kTimeout = std::chrono::milliseconds(600);

// Every batch on partition 0 of `topic`, from the start, until `expected` were read (at most
// 30 s), in order; with `wire_bytes`, each message's size as librdkafka counts it against
// message.max.bytes (value + key + 36 bytes).
std::vector<v1::Batch> ReadBatches(const std::string& bootstrap, const std::string& topic,
                                   uint64_t expected, std::vector<size_t>* wire_bytes = nullptr) {
  std::vector<v1::Batch> out;
  rd_kafka_conf_t* conf = rd_kafka_conf_new();
  char err[256];
  rd_kafka_conf_set(conf, "bootstrap.servers", bootstrap.c_str(), err, sizeof(err));
  rd_kafka_conf_set(conf, "group.id", "node-agent-test", err, sizeof(err));
  rd_kafka_conf_set(conf, "log_level", "0", err, sizeof(err));
  rd_kafka_t* consumer = rd_kafka_new(RD_KAFKA_CONSUMER, conf, err, sizeof(err));
  EXPECT_NE(consumer, nullptr) << err;
  if (consumer == nullptr) return out;
  rd_kafka_topic_partition_list_t* parts = rd_kafka_topic_partition_list_new(1);
  rd_kafka_topic_partition_list_add(parts, topic.c_str(), 0)->offset = RD_KAFKA_OFFSET_BEGINNING;
  rd_kafka_assign(consumer, parts);
  rd_kafka_topic_partition_list_destroy(parts);
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  while (out.size() < expected && Clock::now() < deadline) {
    rd_kafka_message_t* m = rd_kafka_consumer_poll(consumer, 100);
    if (m == nullptr) continue;
    if (m->err == RD_KAFKA_RESP_ERR_NO_ERROR) {
      EXPECT_TRUE(out.emplace_back().ParseFromArray(m->payload, static_cast<int>(m->len)));
      if (wire_bytes != nullptr) {
        wire_bytes->push_back(m->len + m->key_len + kKafkaRecordOverheadBytes);
      }
    }
    rd_kafka_message_destroy(m);
  }
  rd_kafka_consumer_close(consumer);
  rd_kafka_destroy(consumer);
  return out;
}

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
  const std::vector<v1::Batch> read =
      ReadBatches((*broker)->bootstrap(), "agent.telemetry", c.batches_sent.load());
  uint64_t batches = read.size(), kernels = 0;
  for (const v1::Batch& b : read) kernels += b.kernels_size();
  EXPECT_EQ(batches, c.batches_sent.load());
  EXPECT_EQ(kernels, c.trace_kernel_events.load());
  fs::remove_all(dir);
}

// An agent of job `job` against the embedded broker, with a control listener for every rank,
// and a producer of control requests: what the capture and Flight Recorder tests share.
class AgentOnBroker {
 public:
  // Sets `*ok` false (with a test failure) when something did not start. `max_message_bytes`:
  // the publisher's (0: its default).
  AgentOnBroker(NodeAgentOptions o, bool* ok, int max_message_bytes = 0) {
    *ok = false;
    auto broker = EmbeddedBroker::Start({"agent.telemetry", 1, 1, /*changelog_topic=*/false});
    if (!broker.ok()) {
      ADD_FAILURE() << broker.status();
      return;
    }
    broker_ = std::move(*broker);
    PublisherOptions p;
    p.brokers = broker_->bootstrap();
    p.topic = "agent.telemetry";
    p.properties = {{"log_level", "0"}};
    if (max_message_bytes > 0) p.max_message_bytes = max_message_bytes;
    auto publisher = BatchPublisher::Create(p);
    if (!publisher.ok()) {
      ADD_FAILURE() << publisher.status();
      return;
    }
    publisher_ = std::move(*publisher);
    ControlListenerOptions lo;
    lo.brokers = broker_->bootstrap();
    lo.training_job = o.training_job;
    lo.rank = kEveryRank;
    lo.limits.max_stack_frames = 0;  // as `rankwatch agent` runs it
    lo.properties = {{"log_level", "0"}};
    auto listener = ControlListener::Start(lo, nullptr);
    if (!listener.ok()) {
      ADD_FAILURE() << listener.status();
      return;
    }
    control_ = listener->get();
    o.nvml_library = "libnvidia-ml-absent.so.1";
    job_ = o.training_job;
    agent_ = std::make_unique<NodeAgent>(o, publisher_.get(), std::move(*listener));
    rd_kafka_conf_t* conf = rd_kafka_conf_new();
    char err[256];
    rd_kafka_conf_set(conf, "bootstrap.servers", broker_->bootstrap().c_str(), err, sizeof(err));
    rd_kafka_conf_set(conf, "log_level", "0", err, sizeof(err));
    producer_ = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof(err));
    if (producer_ == nullptr) {
      ADD_FAILURE() << err;
      return;
    }
    *ok = true;
  }
  ~AgentOnBroker() {
    if (producer_ != nullptr) rd_kafka_destroy(producer_);
  }

  NodeAgent& agent() { return *agent_; }
  const NodeAgentCounters& counters() { return agent_->counters(); }
  ControlListener* control() { return control_; }

  // One tick at wall time + `ahead_ns`.
  void Tick(int64_t ahead_ns = 0) {
    agent_->Tick(WallNowUnixNs() + ahead_ns);
    publisher_->Poll(std::chrono::milliseconds(0));
  }
  // Ticks until `done` (at most 60 s).
  bool TickUntil(const std::function<bool()>& done) {
    const auto deadline = Clock::now() + std::chrono::seconds(60);
    while (!done() && Clock::now() < deadline) {
      Tick();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return done();
  }
  // Produces `r` (its job and times set here) on the control topic.
  void Send(v1::ControlRequest r, std::vector<uint32_t> ranks, int64_t deadline_ns) {
    r.set_training_job(job_);
    for (uint32_t rank : ranks) r.add_ranks(rank);
    r.set_issued_unix_ns(WallNowUnixNs());
    r.set_deadline_unix_ns(deadline_ns);
    const std::string bytes = r.SerializeAsString();
    ASSERT_EQ(rd_kafka_producev(producer_, RD_KAFKA_V_TOPIC("rankwatch.control"),
                                RD_KAFKA_V_KEY(job_.data(), job_.size()),
                                RD_KAFKA_V_VALUE(const_cast<char*>(bytes.data()), bytes.size()),
                                RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_END),
              RD_KAFKA_RESP_ERR_NO_ERROR);
    ASSERT_EQ(rd_kafka_flush(producer_, 10000), RD_KAFKA_RESP_ERR_NO_ERROR);
  }
  // Everything the agent sent, read back from the telemetry topic (with `wire_bytes`, each
  // message's size as ReadBatches gives it).
  std::vector<v1::Batch> Published(std::vector<size_t>* wire_bytes = nullptr) {
    EXPECT_TRUE(publisher_->Flush(std::chrono::seconds(30)).ok());
    return ReadBatches(broker_->bootstrap(), "agent.telemetry",
                       agent_->counters().batches_sent.load(), wire_bytes);
  }
  BatchPublisher& publisher() { return *publisher_; }

 private:
  std::unique_ptr<EmbeddedBroker> broker_;
  std::unique_ptr<BatchPublisher> publisher_;
  ControlListener* control_ = nullptr;
  std::unique_ptr<NodeAgent> agent_;
  rd_kafka_t* producer_ = nullptr;
  std::string job_;
};

// Captures through the agent, against the embedded broker: the control topic read for every
// rank, the answers and the traces on the telemetry topic read back.
// - cap-a asks ranks 0 and 1 for 2 steps. The agent has seen a trace of rank 0 already: it
//   accepts for rank 0 at once, and for rank 1 when rank 1's first trace appears; each rank's
//   next trace is sent tagged with cap-a (its first 2 profiler steps), then DONE.
// - cap-b asks rank 0 for 1 step; no trace comes before its deadline: FAILED, with the reason.
// - cap-c asks rank 7, whose traces this agent never saw: it never answers for it.
TEST(NodeAgentCaptureTest, CapturesAreAnsweredWithTheNextTraceOfEachAddressedRank) {
  const fs::path dir =
      fs::temp_directory_path() / ("node-agent-capture-" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const fs::path fixtures = fs::path(RANKWATCH_FIXTURES) / "kineto/hta-trace-filter-2rank";
  NodeAgentOptions o;
  o.training_job = "agent-cap";
  o.world_size = 8;
  o.node = "node-0";
  o.trace_dir = dir.string();
  bool started = false;
  AgentOnBroker a(o, &started);
  ASSERT_TRUE(started);
  const NodeAgentCounters& c = a.counters();
  a.Tick();
  fs::copy_file(fixtures / "sampled_rank-0.json.gz", dir / "a.0.pt.trace.json.gz");
  ASSERT_TRUE(a.TickUntil([&] { return c.trace_files_published.load() == 1; }));

  auto send = [&](const std::string& id, std::vector<uint32_t> ranks, uint32_t steps,
                  int64_t deadline_ns) {
    v1::ControlRequest r;
    r.set_id(id);
    r.mutable_capture()->set_steps(steps);
    a.Send(r, std::move(ranks), deadline_ns);
  };
  send("cap-a", {0, 1}, 2, WallNowUnixNs() + 120'000'000'000);
  send("cap-c", {7}, 2, WallNowUnixNs() + 120'000'000'000);
  ASSERT_TRUE(a.TickUntil([&] { return c.capture_requests.load() == 2; }));
  // The next traces: rank 1's first, then rank 0's second.
  fs::copy_file(fixtures / "sampled_rank-1.json.gz", dir / "a.1.pt.trace.json.gz");
  ASSERT_TRUE(a.TickUntil([&] { return c.trace_files_published.load() == 2; }));
  fs::copy_file(fixtures / "sampled_rank-0.json.gz", dir / "b.0.pt.trace.json.gz");
  ASSERT_TRUE(a.TickUntil([&] { return c.trace_files_published.load() == 3; }));
  EXPECT_EQ(c.capture_ranks_done.load(), 2u);

  send("cap-b", {0}, 1, WallNowUnixNs() + 30'000'000'000);
  ASSERT_TRUE(a.TickUntil([&] { return c.capture_requests.load() == 3; }));
  a.Tick(60'000'000'000);  // a minute on: cap-b's (and not cap-a's or cap-c's) deadline passed
  EXPECT_EQ(c.capture_ranks_failed.load(), 1u);
  EXPECT_EQ(a.control()->stats().accepted, 3u);

  // Everything on the telemetry topic, read back.
  std::map<std::pair<std::string, uint32_t>, std::vector<v1::ControlState>> states;
  std::map<std::pair<std::string, uint32_t>, v1::ControlReply> last;
  std::map<uint32_t, uint64_t> capture_events;  // cap-a's events by rank
  std::map<uint32_t, std::set<int64_t>> capture_steps;
  std::map<uint32_t, size_t> done_at, first_capture_at;
  const std::vector<v1::Batch> read = a.Published();
  const uint64_t batches = read.size();
  for (size_t i = 0; i < read.size(); ++i) {
    const v1::Batch& b = read[i];
    const uint32_t rank = b.source().rank();
    for (const v1::ControlReply& r : b.control_replies()) {
      states[{r.request_id(), rank}].push_back(r.state());
      last[{r.request_id(), rank}] = r;
      if (r.request_id() == "cap-a" && r.state() == v1::CONTROL_DONE) done_at[rank] = i;
    }
    if (!b.trace().capture_id().empty()) {
      EXPECT_EQ(b.trace().capture_id(), "cap-a");
      EXPECT_FALSE(b.trace().end_of_file());
      first_capture_at.try_emplace(rank, i);
      capture_events[rank] += b.kernels_size();
      for (const v1::KernelEvent& k : b.kernels()) capture_steps[rank].insert(k.step());
    }
  }
  EXPECT_EQ(batches, c.batches_sent.load());

  using S = std::vector<v1::ControlState>;
  EXPECT_EQ((states[{"cap-a", 0}]), (S{v1::CONTROL_ACCEPTED, v1::CONTROL_DONE}));
  EXPECT_EQ((states[{"cap-a", 1}]), (S{v1::CONTROL_ACCEPTED, v1::CONTROL_DONE}));
  EXPECT_EQ((states[{"cap-b", 0}]), (S{v1::CONTROL_ACCEPTED, v1::CONTROL_FAILED}));
  const std::string cap_b_reason = last[{"cap-b", 0}].reason();
  EXPECT_NE(cap_b_reason.find("no trace of rank 0"), std::string::npos) << cap_b_reason;
  EXPECT_EQ(states.count({"cap-c", 7}), 0u);
  for (uint32_t rank : {0u, 1u}) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    const v1::ControlReply& done = last[{"cap-a", rank}];
    ASSERT_EQ(capture_steps[rank].size(), 2u);  // the first two profiler steps of the trace
    EXPECT_EQ(done.steps(), 2u);
    EXPECT_EQ(done.first_step(), *capture_steps[rank].begin());
    EXPECT_EQ(done.events(), capture_events[rank]);
    EXPECT_GT(done.events(), 0u);
    EXPECT_GT(done.profiled_step_ns(), 0u);
    EXPECT_GT(done_at[rank], first_capture_at[rank]);  // the events come before DONE
  }
  fs::remove_all(dir);
}

// Flight Recorder dumps through the agent, against the embedded broker. Real dumps of a
// 16-rank job (tests/fixtures/flight-recorder) are written where the job's
// TORCH_NCCL_DEBUG_INFO_TEMP_FILE points, and FIFOs where its TORCH_NCCL_DEBUG_INFO_PIPE_FILE
// does, as PyTorch's NCCL watchdog makes them:
// - the dumps of ranks 0 (entries), 9 (empty) and 5 (not a dump) are published, one batch each
//   with the rank's identity; a file of a wrong name is not;
// - fr-a asks every rank: rank 0's pipe has a reader (it gets one byte; ACCEPTED), rank 1's has
//   none (FAILED at once); when rank 0 writes its dump again it is published with fr-a's id,
//   then DONE. Ranks without a pipe here are not answered;
// - fr-b asks rank 0, which writes nothing by the deadline: FAILED.
TEST(NodeAgentFlightRecorderTest, DumpsArePublishedAndRequestsGoThroughThePipes) {
  const fs::path dir = fs::temp_directory_path() / ("node-agent-fr-" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const fs::path fixtures = fs::path(RANKWATCH_FIXTURES) / "flight-recorder/nvrx-lock_gil_1st";
  const std::string prefix = (dir / "nccl_trace_rank_").string();
  const std::string pipes = (dir / "nccl_pipe_").string();
  NodeAgentOptions o;
  o.training_job = "agent-fr";
  o.world_size = 16;
  o.node = "node-0";
  o.flight_recorder_prefixes = {prefix};
  o.flight_recorder_pipe_prefixes = {pipes};
  bool started = false;
  AgentOnBroker a(o, &started);
  ASSERT_TRUE(started);
  const NodeAgentCounters& c = a.counters();
  a.Tick();
  fs::copy_file(fixtures / "_dump_0", prefix + "0");
  fs::copy_file(fixtures / "_dump_9", prefix + "9");
  std::ofstream(prefix + "5") << "not a dump";
  std::ofstream(prefix + "7.tmp") << "half a dump";
  ASSERT_TRUE(a.TickUntil(
      [&] { return c.fr_dumps_published.load() == 2 && c.fr_dumps_unreadable.load() == 1; }));

  ASSERT_EQ(mkfifo((pipes + "0.pipe").c_str(), 0666), 0);
  ASSERT_EQ(mkfifo((pipes + "1.pipe").c_str(), 0666), 0);
  const int reader = open((pipes + "0.pipe").c_str(), O_RDONLY | O_NONBLOCK);
  ASSERT_GE(reader, 0);
  v1::ControlRequest fr;
  fr.mutable_flight_recorder();
  fr.set_id("fr-a");
  a.Send(fr, {}, WallNowUnixNs() + 120'000'000'000);
  ASSERT_TRUE(a.TickUntil([&] { return c.fr_requests.load() == 1; }));
  EXPECT_EQ(c.fr_ranks_triggered.load(), 1u);
  EXPECT_EQ(c.fr_ranks_failed.load(), 1u);  // rank 1: nobody reads its pipe
  char byte = 0;
  EXPECT_EQ(read(reader, &byte, 1), 1);  // what PyTorch's watchdog reads to dump
  // Rank 0 dumps again (a new modification time).
  fs::copy_file(fixtures / "_dump_0", prefix + "0", fs::copy_options::overwrite_existing);
  fs::last_write_time(prefix + "0", fs::last_write_time(prefix + "0") + std::chrono::seconds(5));
  ASSERT_TRUE(a.TickUntil([&] { return c.fr_ranks_done.load() == 1; }));
  EXPECT_EQ(c.fr_dumps_published.load(), 3u);

  fr.set_id("fr-b");
  a.Send(fr, {0}, WallNowUnixNs() + 30'000'000'000);
  ASSERT_TRUE(a.TickUntil([&] { return c.fr_requests.load() == 2; }));
  EXPECT_EQ(c.fr_ranks_triggered.load(), 2u);
  a.Tick(60'000'000'000);  // a minute on: fr-b's deadline passed
  EXPECT_EQ(c.fr_ranks_failed.load(), 2u);
  close(reader);

  std::map<std::pair<std::string, uint32_t>, std::vector<v1::ControlState>> states;
  std::map<std::pair<std::string, uint32_t>, std::string> reasons;
  std::vector<v1::FlightRecorderDump> dumps;
  size_t done_at = 0, dump_at = 0;
  const std::vector<v1::Batch> read_back = a.Published();
  for (size_t i = 0; i < read_back.size(); ++i) {
    const v1::Batch& b = read_back[i];
    for (const v1::ControlReply& r : b.control_replies()) {
      states[{r.request_id(), b.source().rank()}].push_back(r.state());
      reasons[{r.request_id(), b.source().rank()}] = r.reason();
      if (r.request_id() == "fr-a" && r.state() == v1::CONTROL_DONE) done_at = i;
    }
    for (const v1::FlightRecorderDump& d : b.flight_recorder_dumps()) {
      EXPECT_EQ(b.flight_recorder_dumps_size(), 1);
      EXPECT_EQ(b.source().rank(), d.rank());
      EXPECT_EQ(b.source().world_size(), 16u);
      EXPECT_EQ(b.source().training_job(), "agent-fr");
      EXPECT_EQ(d.node(), "node-0");
      EXPECT_EQ(d.source(), prefix + std::to_string(d.rank()));
      EXPECT_GT(d.file_mtime_unix_ns(), 0);
      EXPECT_GT(d.file_bytes(), 0u);
      if (d.request_id() == "fr-a") dump_at = i;
      dumps.push_back(d);
    }
  }
  ASSERT_EQ(dumps.size(), 4u);
  std::map<uint32_t, std::vector<const v1::FlightRecorderDump*>> by_rank;
  for (const v1::FlightRecorderDump& d : dumps) by_rank[d.rank()].push_back(&d);
  ASSERT_EQ(by_rank[0].size(), 2u);
  const v1::FlightRecorderDump& d0 = *by_rank[0][0];
  EXPECT_EQ(d0.state(), v1::FR_DUMP_READ);
  EXPECT_EQ(d0.version(), "2.9");
  EXPECT_GT(d0.entries_size(), 0);
  EXPECT_GT(d0.groups_size(), 0);
  EXPECT_EQ(d0.request_id(), "");  // found unasked
  EXPECT_EQ(by_rank[0][1]->request_id(), "fr-a");
  ASSERT_EQ(by_rank[9].size(), 1u);
  EXPECT_EQ(by_rank[9][0]->state(), v1::FR_DUMP_EMPTY);
  ASSERT_EQ(by_rank[5].size(), 1u);
  EXPECT_EQ(by_rank[5][0]->state(), v1::FR_DUMP_UNREADABLE);
  EXPECT_FALSE(by_rank[5][0]->error().empty());
  EXPECT_EQ(by_rank.count(7), 0u);

  using S = std::vector<v1::ControlState>;
  EXPECT_EQ((states[{"fr-a", 0}]), (S{v1::CONTROL_ACCEPTED, v1::CONTROL_DONE}));
  EXPECT_GT(done_at, dump_at);  // the dump comes before its DONE
  EXPECT_EQ((states[{"fr-a", 1}]), (S{v1::CONTROL_FAILED}));
  const std::string no_reader = reasons[{"fr-a", 1}];
  EXPECT_NE(no_reader.find("no reader"), std::string::npos) << no_reader;
  EXPECT_EQ((states[{"fr-b", 0}]), (S{v1::CONTROL_ACCEPTED, v1::CONTROL_FAILED}));
  const std::string late = reasons[{"fr-b", 0}];
  EXPECT_NE(late.find("by the deadline"), std::string::npos) << late;
  EXPECT_EQ(states.count({"fr-a", 9}), 0u);  // no pipe here: not answered
  fs::remove_all(dir);
}

// Issue #47: with 16 KiB messages (--max-message-bytes' least), an iteration trace of 1,000
// steps, a Kineto trace of 4,811 events and its copy for a capture, and a Flight Recorder dump
// (trimmed to fit) all go in messages that fit, and all of it arrives.
TEST(NodeAgentSizeTest, TracesCapturesAndDumpsGoInMessagesThatFit) {
  constexpr int kLimit = 16 << 10;
  const fs::path dir = fs::temp_directory_path() / ("node-agent-size-" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string prefix = (dir / "nccl_trace_rank_").string();
  NodeAgentOptions o;
  o.training_job = "agent-size";
  o.world_size = 8;
  o.node = "node-0";
  o.trace_dir = (dir / "traces").string();
  o.flight_recorder_prefixes = {prefix};
  fs::create_directories(o.trace_dir);
  bool started = false;
  AgentOnBroker a(o, &started, kLimit);
  ASSERT_TRUE(started);
  EXPECT_EQ(a.publisher().max_message_bytes(), static_cast<size_t>(kLimit));
  const NodeAgentCounters& c = a.counters();
  a.Tick();

  // A MindSpore iteration trace of rank 3 with 1,000 steps (the fixture's first step, repeated).
  std::ifstream fixture(
      fs::path(RANKWATCH_FIXTURES) /
      "mindspore-step-trace-raw/cluster_propose/step_trace_raw_0_detail_time.csv");
  std::string header, first;
  std::getline(fixture, header);
  std::getline(fixture, first);
  const std::string rest = first.substr(first.find(','));
  {
    std::ofstream csv(fs::path(o.trace_dir) / "step_trace_raw_3_detail_time.csv");
    csv << header << "\n";
    for (int step = 1; step <= 1000; ++step) csv << step << rest << "\n";
  }
  ASSERT_TRUE(a.TickUntil([&] { return c.trace_files_published.load() == 1; }));
  EXPECT_EQ(c.trace_steps.load(), 1000u);

  // A Kineto trace of rank 0 that a capture of 2 steps waits for.
  v1::ControlRequest r;
  r.set_id("cap-s");
  r.mutable_capture()->set_steps(2);
  a.Send(r, {0}, WallNowUnixNs() + 120'000'000'000);
  ASSERT_TRUE(a.TickUntil([&] { return c.capture_requests.load() == 1; }));
  fs::copy_file(
      fs::path(RANKWATCH_FIXTURES) / "kineto/hta-trace-filter-2rank/sampled_rank-0.json.gz",
      fs::path(o.trace_dir) / "s.0.pt.trace.json.gz");
  ASSERT_TRUE(a.TickUntil([&] { return c.trace_files_published.load() == 2; }));
  EXPECT_EQ(c.capture_ranks_done.load(), 1u);

  // A Flight Recorder dump of rank 0.
  fs::copy_file(fs::path(RANKWATCH_FIXTURES) / "flight-recorder/nvrx-lock_gil_1st/_dump_0",
                prefix + "0");
  ASSERT_TRUE(a.TickUntil([&] { return c.fr_dumps_published.load() == 1; }));

  std::vector<size_t> wire;
  const std::vector<v1::Batch> read = a.Published(&wire);
  ASSERT_EQ(read.size(), c.batches_sent.load());
  ASSERT_EQ(wire.size(), read.size());
  uint64_t steps = 0, live = 0, captured = 0, capture_batches = 0, trace_batches = 0;
  size_t largest = 0;
  const v1::FlightRecorderDump* dump = nullptr;
  for (size_t i = 0; i < read.size(); ++i) {
    const v1::Batch& b = read[i];
    EXPECT_LE(wire[i], static_cast<size_t>(kLimit)) << "message " << i;
    largest = std::max(largest, wire[i]);
    steps += b.steps_size();
    if (b.trace().capture_id() == "cap-s") {
      captured += b.kernels_size();
      ++capture_batches;
    } else {
      live += b.kernels_size();
      trace_batches += b.kernels_size() > 0;
    }
    if (b.flight_recorder_dumps_size() > 0) dump = &b.flight_recorder_dumps(0);
  }
  std::printf("%zu messages, the largest %zu bytes; %llu trace batches, %llu capture batches\n",
              read.size(), largest, static_cast<unsigned long long>(trace_batches),
              static_cast<unsigned long long>(capture_batches));
  EXPECT_EQ(steps, 1000u);
  EXPECT_EQ(live, c.trace_kernel_events.load());
  EXPECT_GT(trace_batches, 10u);
  EXPECT_GT(captured, 0u);
  EXPECT_GT(capture_batches, 1u);
  ASSERT_NE(dump, nullptr);
  EXPECT_EQ(dump->state(), v1::FR_DUMP_READ);
  EXPECT_GT(dump->entries_size(), 0);
  EXPECT_EQ(c.batches_oversized.load(), 0u);
  EXPECT_EQ(c.batches_dropped.load(), 0u);
  EXPECT_EQ(c.trace_files_failed.load(), 0u);
  EXPECT_EQ(c.fr_dumps_failed.load(), 0u);
  EXPECT_EQ(a.publisher().oversized(), 0u);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace rankwatch
