#include "collectors/lib/control_listener.h"

#include <gtest/gtest.h>
#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "common/wall_clock.h"

namespace rankwatch {
namespace {

constexpr char kTopic[] = "rankwatch.control";
constexpr int64_t kSecond = 1'000'000'000;

v1::ControlRequest Capture(const std::string& id, const std::string& job,
                           std::vector<uint32_t> ranks, uint32_t steps, int64_t deadline) {
  v1::ControlRequest r;
  r.set_id(id);
  r.set_training_job(job);
  for (uint32_t k : ranks) r.add_ranks(k);
  r.set_issued_unix_ns(WallNowUnixNs());
  r.set_deadline_unix_ns(deadline);
  r.mutable_capture()->set_steps(steps);
  return r;
}

v1::ControlRequest Stacks(const std::string& id, uint32_t max_frames, int64_t deadline) {
  v1::ControlRequest r;
  r.set_id(id);
  r.set_training_job("job");
  r.set_issued_unix_ns(WallNowUnixNs());
  r.set_deadline_unix_ns(deadline);
  r.mutable_stacks()->set_max_frames(max_frames);
  return r;
}

ControlCheck Check(const std::string& key, const std::string& payload, v1::ControlRequest* out,
                   uint32_t rank = 1) {
  return CheckControlRequest(key, payload, "job", rank, WallNowUnixNs(), ControlLimits{}, out);
}

std::string Bytes(const v1::ControlRequest& r) { return r.SerializeAsString(); }

TEST(CheckControlRequestTest, AnotherJobsMessageIsIgnoredWithoutParsing) {
  v1::ControlRequest out;
  EXPECT_EQ(Check("other", "\xff\xff garbage", &out).kind, ControlCheck::Kind::kIgnore);
  EXPECT_EQ(Check("other", std::string(1 << 20, 'x'), &out).kind, ControlCheck::Kind::kIgnore);
}

TEST(CheckControlRequestTest, ThisRanksCaptureIsAccepted) {
  v1::ControlRequest out;
  const int64_t deadline = WallNowUnixNs() + 60 * kSecond;
  EXPECT_EQ(Check("job", Bytes(Capture("c1", "job", {1, 3}, 5, deadline)), &out).kind,
            ControlCheck::Kind::kAccept);
  EXPECT_EQ(out.id(), "c1");
  EXPECT_EQ(out.capture().steps(), 5u);
  // No ranks listed: every rank.
  EXPECT_EQ(Check("job", Bytes(Capture("c2", "job", {}, 5, deadline)), &out).kind,
            ControlCheck::Kind::kAccept);
  // Other ranks only: not this collector's business.
  EXPECT_EQ(Check("job", Bytes(Capture("c3", "job", {0, 2}, 5, deadline)), &out).kind,
            ControlCheck::Kind::kIgnore);
}

TEST(CheckControlRequestTest, EachBadRequestIsRefusedWithItsReason) {
  const int64_t deadline = WallNowUnixNs() + 60 * kSecond;
  struct Case {
    std::string name, key, payload;
    ControlRefusal want;
  };
  v1::ControlRequest no_action = Capture("c", "job", {1}, 5, deadline);
  no_action.clear_capture();
  v1::ControlRequest too_many = Capture("c", "job", {}, 5, deadline);
  for (uint32_t k = 0; k < 1025; ++k) too_many.add_ranks(k);
  const std::vector<Case> cases = {
      {"oversized", "job", std::string((64 << 10) + 1, '\x01'), ControlRefusal::kOversized},
      {"not protobuf", "job", "\xff\xff\xff\xff", ControlRefusal::kMalformed},
      {"names another job", "job", Bytes(Capture("c", "other", {1}, 5, deadline)),
       ControlRefusal::kMalformed},
      {"no id", "job", Bytes(Capture("", "job", {1}, 5, deadline)), ControlRefusal::kBadRequest},
      {"long id", "job", Bytes(Capture(std::string(129, 'i'), "job", {1}, 5, deadline)),
       ControlRefusal::kBadRequest},
      {"too many ranks", "job", Bytes(too_many), ControlRefusal::kBadRequest},
      {"zero steps", "job", Bytes(Capture("c", "job", {1}, 0, deadline)),
       ControlRefusal::kBadRequest},
      {"101 steps", "job", Bytes(Capture("c", "job", {1}, 101, deadline)),
       ControlRefusal::kBadRequest},
      {"expired", "job", Bytes(Capture("c", "job", {1}, 5, WallNowUnixNs() - kSecond)),
       ControlRefusal::kExpired},
      {"deadline in two hours", "job",
       Bytes(Capture("c", "job", {1}, 5, WallNowUnixNs() + 7200 * kSecond)),
       ControlRefusal::kExpired},
      {"no action", "job", Bytes(no_action), ControlRefusal::kUnsupported},
  };
  for (const Case& c : cases) {
    v1::ControlRequest out;
    const ControlCheck got = Check(c.key, c.payload, &out);
    EXPECT_EQ(got.kind, ControlCheck::Kind::kRefuse) << c.name;
    EXPECT_EQ(got.refusal, c.want) << c.name << ": " << got.detail;
    EXPECT_FALSE(got.detail.empty()) << c.name;
  }
}

// A one-broker mock cluster with the control topic, and a producer for requests.
class ControlChannel {
 public:
  ControlChannel() {
    rd_kafka_conf_t* conf = rd_kafka_conf_new();
    char err[256];
    rd_kafka_conf_set(conf, "log_level", "0", err, sizeof(err));
    mock_rk_ = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof(err));
    cluster_ = rd_kafka_mock_cluster_new(mock_rk_, 1);
    rd_kafka_mock_topic_create(cluster_, kTopic, 2, 1);
    bootstrap_ = rd_kafka_mock_cluster_bootstraps(cluster_);
    conf = rd_kafka_conf_new();
    rd_kafka_conf_set(conf, "bootstrap.servers", bootstrap_.c_str(), err, sizeof(err));
    rd_kafka_conf_set(conf, "log_level", "0", err, sizeof(err));
    producer_ = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof(err));
  }
  ~ControlChannel() {
    rd_kafka_destroy(producer_);
    rd_kafka_mock_cluster_destroy(cluster_);
    rd_kafka_destroy(mock_rk_);
  }
  void SetDown(bool down) {
    if (down) {
      rd_kafka_mock_broker_set_down(cluster_, 1);
    } else {
      rd_kafka_mock_broker_set_up(cluster_, 1);
    }
  }
  const std::string& bootstrap() const { return bootstrap_; }
  void Send(const std::string& key, const std::string& payload) {
    ASSERT_EQ(rd_kafka_producev(producer_, RD_KAFKA_V_TOPIC(kTopic),
                                RD_KAFKA_V_KEY(key.data(), key.size()),
                                RD_KAFKA_V_VALUE(const_cast<char*>(payload.data()), payload.size()),
                                RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_END),
              RD_KAFKA_RESP_ERR_NO_ERROR);
    ASSERT_EQ(rd_kafka_flush(producer_, 10000), RD_KAFKA_RESP_ERR_NO_ERROR);
  }

 private:
  rd_kafka_t* mock_rk_;
  rd_kafka_mock_cluster_t* cluster_;
  rd_kafka_t* producer_;
  std::string bootstrap_;
};

// Replies collected from the listener's thread.
class Replies {
 public:
  ControlListener::ReplySink Sink() {
    return [this](v1::ControlReply r) {
      std::lock_guard<std::mutex> lock(mu_);
      replies_.push_back(std::move(r));
    };
  }
  // Waits until `n` replies arrived (or 20 s) and returns them.
  std::vector<v1::ControlReply> Wait(size_t n) {
    for (int i = 0; i < 2000; ++i) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (replies_.size() >= n) return replies_;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    std::lock_guard<std::mutex> lock(mu_);
    return replies_;
  }

 private:
  std::mutex mu_;
  std::vector<v1::ControlReply> replies_;
};

ControlListenerOptions Options(const ControlChannel& channel, uint32_t rank) {
  ControlListenerOptions o;
  o.brokers = channel.bootstrap();
  o.training_job = "job";
  o.rank = rank;
  o.metadata_retry = std::chrono::milliseconds(100);
  o.properties = {{"log_level", "0"}};
  return o;
}

void WaitReading(const ControlListener& l) {
  for (int i = 0; i < 2000 && !l.stats().reading; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(l.stats().reading);
}

TEST(ControlListenerTest, AcceptsRefusesAndIgnoresOverKafkaAndAnswersEach) {
  ControlChannel channel;
  Replies replies;
  ControlListenerOptions o = Options(channel, 1);
  o.max_queued = 2;
  auto listener = ControlListener::Start(o, replies.Sink());
  ASSERT_TRUE(listener.ok()) << listener.status();
  WaitReading(**listener);
  EXPECT_FALSE((*listener)->pending());

  const int64_t deadline = WallNowUnixNs() + 60 * kSecond;
  channel.Send("other", Bytes(Capture("x1", "other", {1}, 5, deadline)));  // another job
  channel.Send("job", Bytes(Capture("x2", "job", {0, 2}, 5, deadline)));   // other ranks
  channel.Send("job", Bytes(Capture("a1", "job", {1}, 5, deadline)));      // accepted
  channel.Send("job", Bytes(Capture("a1", "job", {1}, 5, deadline)));      // its duplicate
  channel.Send("job", Bytes(Capture("e1", "job", {1}, 5, WallNowUnixNs() - kSecond)));  // expired
  channel.Send("job", "\xff\xff\xff");                                 // malformed, no id
  channel.Send("job", Bytes(Capture("a2", "job", {}, 3, deadline)));   // accepted (all)
  channel.Send("job", Bytes(Capture("b1", "job", {1}, 3, deadline)));  // queue full: busy

  const std::vector<v1::ControlReply> got = replies.Wait(4);
  ASSERT_EQ(got.size(), 4u);
  EXPECT_EQ(got[0].request_id(), "a1");
  EXPECT_EQ(got[0].state(), v1::CONTROL_ACCEPTED);
  EXPECT_EQ(got[1].request_id(), "e1");
  EXPECT_EQ(got[1].state(), v1::CONTROL_REFUSED);
  EXPECT_EQ(got[1].reason().rfind("expired", 0), 0u) << got[1].reason();
  EXPECT_EQ(got[2].request_id(), "a2");
  EXPECT_EQ(got[2].state(), v1::CONTROL_ACCEPTED);
  EXPECT_EQ(got[3].request_id(), "b1");
  EXPECT_EQ(got[3].state(), v1::CONTROL_REFUSED);
  EXPECT_EQ(got[3].reason().rfind("busy", 0), 0u) << got[3].reason();

  const ControlListenerStats s = (*listener)->stats();
  EXPECT_EQ(s.messages, 8u);
  EXPECT_EQ(s.other_jobs, 1u);
  EXPECT_EQ(s.other_ranks, 1u);
  EXPECT_EQ(s.duplicates, 1u);
  EXPECT_EQ(s.accepted, 2u);
  EXPECT_EQ(s.refused[static_cast<int>(ControlRefusal::kExpired)], 1u);
  EXPECT_EQ(s.refused[static_cast<int>(ControlRefusal::kMalformed)], 1u);
  EXPECT_EQ(s.refused[static_cast<int>(ControlRefusal::kBusy)], 1u);

  EXPECT_TRUE((*listener)->pending());
  const std::vector<v1::ControlRequest> taken = (*listener)->Take();
  ASSERT_EQ(taken.size(), 2u);
  EXPECT_EQ(taken[0].id(), "a1");
  EXPECT_EQ(taken[1].id(), "a2");
  EXPECT_FALSE((*listener)->pending());
  EXPECT_TRUE((*listener)->Take().empty());
}

TEST(CheckControlRequestTest, StacksAreCheckedAndIgnoredByAListenerForEveryRank) {
  v1::ControlRequest out;
  const int64_t deadline = WallNowUnixNs() + 10 * kSecond;
  EXPECT_EQ(Check("job", Bytes(Stacks("s1", 64, deadline)), &out).kind,
            ControlCheck::Kind::kAccept);
  EXPECT_EQ(out.stacks().max_frames(), 64u);
  const ControlCheck big = Check("job", Bytes(Stacks("s2", 257, deadline)), &out);
  EXPECT_EQ(big.kind, ControlCheck::Kind::kRefuse);
  EXPECT_EQ(big.refusal, ControlRefusal::kBadRequest);
  ControlLimits none;
  none.max_stack_frames = 0;
  const ControlCheck refused = CheckControlRequest("job", Bytes(Stacks("s3", 64, deadline)), "job",
                                                   1, WallNowUnixNs(), none, &out);
  EXPECT_EQ(refused.kind, ControlCheck::Kind::kRefuse);
  EXPECT_EQ(refused.refusal, ControlRefusal::kUnsupported);
  EXPECT_EQ(refused.detail, "this collector takes no stacks");
  // A node agent (every rank, no stacks): not its business, each rank answers for itself.
  EXPECT_EQ(CheckControlRequest("job", Bytes(Stacks("s4", 64, deadline)), "job", kEveryRank,
                                WallNowUnixNs(), none, &out)
                .kind,
            ControlCheck::Kind::kIgnore);
}

TEST(ControlListenerTest, StacksRequestsGoToTheStacksWaiterNotTheTrainingLoop) {
  ControlChannel channel;
  Replies replies;
  auto listener = ControlListener::Start(Options(channel, 1), replies.Sink());
  ASSERT_TRUE(listener.ok()) << listener.status();
  WaitReading(**listener);
  // Nothing waits: WaitStacks returns empty after its timeout.
  EXPECT_TRUE((*listener)->WaitStacks(std::chrono::milliseconds(50)).empty());
  std::vector<v1::ControlRequest> got;
  std::thread waiter([&] {
    for (int i = 0; i < 100 && got.empty(); ++i) {
      got = (*listener)->WaitStacks(std::chrono::milliseconds(200));
    }
  });
  channel.Send("job", Bytes(Stacks("s1", 32, WallNowUnixNs() + 10 * kSecond)));
  waiter.join();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].id(), "s1");
  EXPECT_EQ(got[0].stacks().max_frames(), 32u);
  // Answered ACCEPTED from the listener's thread; never queued for the training loop.
  const std::vector<v1::ControlReply> r = replies.Wait(1);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].request_id(), "s1");
  EXPECT_EQ(r[0].state(), v1::CONTROL_ACCEPTED);
  EXPECT_FALSE((*listener)->pending());
  EXPECT_TRUE((*listener)->Take().empty());
  // WakeStacks ends a wait at once (called until the waiter is seen to return: it may not be
  // waiting yet at the first call).
  std::atomic<bool> returned{false};
  const auto t0 = std::chrono::steady_clock::now();
  std::thread woken([&] {
    got = (*listener)->WaitStacks(std::chrono::seconds(30));
    returned = true;
  });
  while (!returned) {
    (*listener)->WakeStacks();
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  woken.join();
  EXPECT_TRUE(got.empty());
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
}

TEST(ControlListenerTest, ARequestSentJustBeforeTheCollectorStartedIsStillSeen) {
  ControlChannel channel;
  for (int i = 0; i < 5; ++i) channel.Send("other", "old traffic of another job");
  channel.Send("job", Bytes(Capture("early", "job", {1}, 5, WallNowUnixNs() + 60 * kSecond)));
  // Expired by the time the listener reads it: skipped without an answer.
  channel.Send("job", Bytes(Capture("stale", "job", {1}, 5, WallNowUnixNs() + 1)));
  Replies replies;
  ControlListenerOptions o = Options(channel, 1);
  o.lookback_messages = 2;  // the two requests, not the traffic before them
  auto listener = ControlListener::Start(o, replies.Sink());
  ASSERT_TRUE(listener.ok()) << listener.status();
  for (int i = 0; i < 2000 && (*listener)->stats().messages < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const std::vector<v1::ControlReply> got = replies.Wait(1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].request_id(), "early");
  EXPECT_EQ(got[0].state(), v1::CONTROL_ACCEPTED);
  const ControlListenerStats s = (*listener)->stats();
  EXPECT_EQ(s.messages, 2u);
  EXPECT_EQ(s.other_jobs, 0u);
  EXPECT_EQ(s.stale, 1u);
  EXPECT_EQ(s.refused[static_cast<int>(ControlRefusal::kExpired)], 0u);
}

TEST(ControlListenerTest, ABrokerDownAtStartOnlyDelaysRequests) {
  ControlChannel channel;
  channel.SetDown(true);
  Replies replies;
  auto listener = ControlListener::Start(Options(channel, 0), replies.Sink());
  ASSERT_TRUE(listener.ok()) << listener.status();
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  EXPECT_FALSE((*listener)->stats().reading);
  channel.SetDown(false);
  WaitReading(**listener);
  channel.Send("job", Bytes(Capture("late", "job", {0}, 2, WallNowUnixNs() + 60 * kSecond)));
  const std::vector<v1::ControlReply> got = replies.Wait(1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].state(), v1::CONTROL_ACCEPTED);
}

TEST(ControlListenerTest, BadOptionsAreRefused) {
  ControlListenerOptions o;
  o.training_job = "job";
  EXPECT_FALSE(ControlListener::Start(o, nullptr).ok());  // no brokers
  o.brokers = "127.0.0.1:1";
  o.training_job.clear();
  EXPECT_FALSE(ControlListener::Start(o, nullptr).ok());  // no job
  o.training_job = "job";
  o.properties = {{"no.such.property", "1"}};
  EXPECT_FALSE(ControlListener::Start(o, nullptr).ok());
}

}  // namespace
}  // namespace rankwatch
