// KafkaConsumer in a consumer group on the embedded broker (librdkafka's mock cluster), with
// rebalances while a producer publishes (run under TSan by scripts/test.sh
// --sanitize=thread): two members, each polled on a thread of its own as the daemon's ingest
// thread does, keep their resume offsets as state, handed over on revocation as TaskManager
// does. A second member joins mid-stream and the first leaves later; every message is handled
// exactly once, only by the member that owns its partition at that moment, in offset order.
// How fast a restarted member gets its partitions back on the development broker: it ignores
// static membership, and a clean leave hands the partitions on without waiting for a session.
#include "ingest/kafka_consumer.h"

#include <gtest/gtest.h>
#include <librdkafka/rdkafka.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "kafka/embedded_broker.h"

namespace rankwatch {
namespace {

using namespace std::chrono_literals;

constexpr char kTopic[] = "consumer-test";
constexpr int kPartitions = 4;
constexpr int kMessages = 3000;
// The development broker's session for rankwatchd (kDevelopmentSessionTimeout). Each rebalance
// of a group that has members (one joins, or leaves) waits the session less 1 s on that broker
// for them to rejoin: 2 s here, 9 s with the consumer's default of 10 s.
constexpr std::chrono::milliseconds kSessionTimeout{3000};

// What the members share: the "state store" (where each partition resumes) and the count of
// each message handled.
struct Shared {
  std::mutex mu;
  std::map<int32_t, int64_t> stored_next;  // as a checkpoint would keep them
  std::vector<int> handled = std::vector<int>(kMessages, 0);
  std::atomic<int> total{0};
};

// One daemon instance's ingest thread: owns its consumer, polls until told to stop, then
// closes (its revocation hands its offsets over).
class Member {
 public:
  Member(const std::string& name, const std::string& brokers, Shared* shared)
      : name_(name), shared_(shared) {
    thread_ = std::thread([this, brokers] { Run(brokers); });
  }
  ~Member() { Stop(); }
  void Stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  int handled() const { return handled_; }
  int assignments() const { return assignments_; }

 private:
  void Run(const std::string& brokers) {
    KafkaConsumerOptions o;
    o.brokers = brokers;
    o.topic = kTopic;
    o.group = "consumer-test";
    o.session_timeout = kSessionTimeout;
    o.properties = {{"log_level", "0"}, {"client.id", name_}};
    o.on_assigned = [this](const std::string& topic, const std::vector<int32_t>& partitions) {
      std::vector<std::optional<int64_t>> out;
      std::lock_guard<std::mutex> lock(shared_->mu);
      for (int32_t p : partitions) {
        EXPECT_EQ(topic, kTopic);
        EXPECT_TRUE(owned_.insert(p).second) << name_ << " assigned " << p << " twice";
        next_[p] = shared_->stored_next[p];
        out.push_back(next_[p]);
      }
      ++assignments_;
      return out;
    };
    o.on_revoked = [this](const std::string&, const std::vector<int32_t>& partitions) {
      std::lock_guard<std::mutex> lock(shared_->mu);
      for (int32_t p : partitions) {
        EXPECT_EQ(owned_.erase(p), 1u) << name_ << " revoked " << p << " it did not own";
        shared_->stored_next[p] = next_[p];
        next_.erase(p);
      }
    };
    auto consumer = KafkaConsumer::Create(o);
    ASSERT_TRUE(consumer.ok()) << consumer.status();
    while (!stop_) {
      (*consumer)->Poll(50ms, 100, [&](const KafkaMessage& m) {
        std::lock_guard<std::mutex> lock(shared_->mu);
        EXPECT_TRUE(owned_.count(m.partition)) << name_ << " got partition " << m.partition
                                               << " offset " << m.offset << " after it was revoked";
        EXPECT_EQ(m.offset, next_[m.partition]) << name_ << " partition " << m.partition;
        next_[m.partition] = m.offset + 1;
        const int id = std::stoi(std::string(m.payload));
        ASSERT_GE(id, 0);
        ASSERT_LT(id, kMessages);
        ++shared_->handled[id];
        ++shared_->total;
        ++handled_;
      });
    }
    (*consumer)->Close();  // leaves the group: the revocation runs in here
    std::lock_guard<std::mutex> lock(shared_->mu);
    EXPECT_TRUE(owned_.empty()) << name_ << " left the group still owning partitions";
  }

  const std::string name_;
  Shared* shared_;
  std::set<int32_t> owned_;          // guarded by shared_->mu (read in the message callback)
  std::map<int32_t, int64_t> next_;  // guarded by shared_->mu
  std::atomic<int> handled_{0}, assignments_{0};
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

bool WaitFor(const std::function<bool()>& done, std::chrono::seconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(10ms);
  }
  return true;
}

TEST(KafkaConsumerTest, MembersJoiningAndLeavingMidStreamHandleEveryMessageOnce) {
  auto broker = EmbeddedBroker::Start({kTopic, kPartitions, 1, /*changelog_topic=*/false});
  ASSERT_TRUE(broker.ok()) << broker.status();
  const std::string brokers = (*broker)->bootstrap();
  Shared shared;
  for (int p = 0; p < kPartitions; ++p) shared.stored_next[p] = 0;

  // The producer publishes in three parts: before b joins, while both members own partitions,
  // and after a left, so that each member has messages to read whatever a rebalance costs.
  rd_kafka_conf_t* conf = rd_kafka_conf_new();
  char err[256];
  rd_kafka_conf_set(conf, "bootstrap.servers", brokers.c_str(), err, sizeof(err));
  rd_kafka_conf_set(conf, "log_level", "0", err, sizeof(err));
  rd_kafka_conf_set(conf, "linger.ms", "1", err, sizeof(err));
  rd_kafka_t* producer = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof(err));
  ASSERT_NE(producer, nullptr) << err;
  int produced = 0;
  const auto produce = [&](int until) {
    for (; produced < until; ++produced) {
      const std::string payload = std::to_string(produced);
      rd_kafka_resp_err_t e;
      while ((e = rd_kafka_producev(
                  producer, RD_KAFKA_V_TOPIC(kTopic), RD_KAFKA_V_PARTITION(produced % kPartitions),
                  RD_KAFKA_V_VALUE(const_cast<char*>(payload.data()), payload.size()),
                  RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_END)) ==
             RD_KAFKA_RESP_ERR__QUEUE_FULL) {
        rd_kafka_poll(producer, 10);
      }
      EXPECT_EQ(e, RD_KAFKA_RESP_ERR_NO_ERROR);
      rd_kafka_poll(producer, 0);
      if (produced % 100 == 99) std::this_thread::sleep_for(10ms);
    }
    EXPECT_EQ(rd_kafka_flush(producer, 30000), RD_KAFKA_RESP_ERR_NO_ERROR);
  };

  auto a = std::make_unique<Member>("member-a", brokers, &shared);
  produce(kMessages / 3);
  ASSERT_TRUE(WaitFor([&] { return a->handled() >= 300; }, 60s)) << "member a never read";
  auto b = std::make_unique<Member>("member-b", brokers, &shared);
  ASSERT_TRUE(WaitFor([&] { return b->assignments() >= 1 && a->assignments() >= 2; }, 60s))
      << "b never joined";
  produce(2 * kMessages / 3);
  ASSERT_TRUE(WaitFor([&] { return shared.total >= 2 * kMessages / 3; }, 60s))
      << shared.total << " handled";
  a->Stop();  // leaves the group: b takes over its partitions
  const int a_handled = a->handled();
  produce(kMessages);
  ASSERT_TRUE(WaitFor([&] { return shared.total >= kMessages; }, 90s))
      << shared.total << " of " << kMessages << " handled";
  rd_kafka_destroy(producer);
  std::this_thread::sleep_for(300ms);  // a duplicate would arrive now
  b->Stop();

  EXPECT_GT(a_handled, 0);
  EXPECT_GT(b->handled(), 0);
  EXPECT_GE(a->assignments(), 2) << "member a was not rebalanced when b joined";
  EXPECT_GE(b->assignments(), 2) << "member b did not take over a's partitions";
  std::lock_guard<std::mutex> lock(shared.mu);
  EXPECT_EQ(shared.total.load(), kMessages);
  for (int i = 0; i < kMessages; ++i) EXPECT_EQ(shared.handled[i], 1) << "message " << i;
  for (int p = 0; p < kPartitions; ++p) {
    EXPECT_EQ(shared.stored_next[p], kMessages / kPartitions) << "partition " << p;
  }
}

// Publishes 1 KiB messages to partition 0 of `topic` at ~5,000 messages/s (~5 MB/s: the
// development broker's 5 MiB a partition last about a second) until Stop or destruction.
class SteadyProducer {
 public:
  SteadyProducer(const std::string& bootstrap, const std::string& topic) : topic_(topic) {
    rd_kafka_conf_t* conf = rd_kafka_conf_new();
    char err[256];
    rd_kafka_conf_set(conf, "bootstrap.servers", bootstrap.c_str(), err, sizeof(err));
    rd_kafka_conf_set(conf, "log_level", "0", err, sizeof(err));
    rd_kafka_conf_set(conf, "linger.ms", "5", err, sizeof(err));
    producer_ = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof(err));
    if (producer_ == nullptr) {
      error_ = err;
      return;
    }
    publisher_ = std::thread([this] { Publish(); });
  }
  ~SteadyProducer() {
    Stop();
    if (producer_ != nullptr) rd_kafka_destroy(producer_);
  }
  void Stop() {
    stop_ = true;
    if (publisher_.joinable()) publisher_.join();
  }
  bool ok() const { return producer_ != nullptr; }
  const std::string& error() const { return error_; }
  int64_t produced() const { return produced_; }

 private:
  void Publish() {
    const std::string payload(1024, 'x');
    while (!stop_) {
      for (int i = 0; i < 50; ++i) {
        while (
            rd_kafka_producev(producer_, RD_KAFKA_V_TOPIC(topic_.c_str()), RD_KAFKA_V_PARTITION(0),
                              RD_KAFKA_V_VALUE(const_cast<char*>(payload.data()), payload.size()),
                              RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                              RD_KAFKA_V_END) == RD_KAFKA_RESP_ERR__QUEUE_FULL) {
          rd_kafka_poll(producer_, 10);
        }
        ++produced_;
      }
      rd_kafka_poll(producer_, 0);
      std::this_thread::sleep_for(10ms);
    }
    rd_kafka_flush(producer_, 10000);
  }

  const std::string topic_;
  rd_kafka_t* producer_ = nullptr;
  std::string error_;
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> produced_{0};
  std::thread publisher_;
};

// A consumer resumes (a restarted daemon at its checkpoint) behind the log start while
// producers keep publishing, so the start keeps moving: it must read on from the log, not be
// reset over and over, and report exactly the messages it skipped. The development broker
// keeps 5 MiB per partition; 1 KiB messages at ~5 MB/s move its start by the whole log in
// about a second.
TEST(KafkaConsumerTest, ResumingBehindAMovingLogStartReadsOnAndCountsWhatItSkipped) {
  auto broker = EmbeddedBroker::Start({"moving", 1, 1, /*changelog_topic=*/false, ""});
  ASSERT_TRUE(broker.ok()) << broker.status();
  SteadyProducer producer((*broker)->bootstrap(), "moving");
  ASSERT_TRUE(producer.ok()) << producer.error();
  // Far more than the broker keeps: offset 0 is long gone.
  ASSERT_TRUE(WaitFor([&] { return producer.produced() >= 15000; }, 60s))
      << producer.produced() << " produced";

  struct Loss {
    int64_t expected, got;
  };
  std::vector<Loss> losses;
  int64_t next = 0;  // as a checkpoint would resume
  int64_t handled = 0, skipped = 0;
  bool in_order = true;
  KafkaConsumerOptions o;
  o.brokers = (*broker)->bootstrap();
  o.topic = "moving";
  o.group = "moving-test";
  o.properties = {{"log_level", "0"}};
  o.on_assigned = [&](const std::string&, const std::vector<int32_t>& partitions) {
    return std::vector<std::optional<int64_t>>(partitions.size(), next);
  };
  o.on_lost = [&](const std::string& topic, int32_t partition, int64_t expected, int64_t got,
                  int64_t) {
    EXPECT_EQ(topic, "moving");
    EXPECT_EQ(partition, 0);
    losses.push_back({expected, got});
    if (expected != next) in_order = false;
    skipped += got - expected;
    next = got;
  };
  auto consumer = KafkaConsumer::Create(o);
  ASSERT_TRUE(consumer.ok()) << consumer.status();
  const int64_t start_produced = producer.produced();
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while (handled < 20000 && std::chrono::steady_clock::now() < deadline) {
    (*consumer)->Poll(50ms, 500, [&](const KafkaMessage& m) {
      if (m.offset != next) in_order = false;
      next = m.offset + 1;
      ++handled;
    });
  }
  producer.Stop();
  (*consumer)->Close();

  // It reads on while the producer goes on (librdkafka's own reset to its cached log start
  // read nothing here), and the messages it did not read are the ones it reported.
  EXPECT_GE(handled, 20000) << "read " << handled << " messages while "
                            << producer.produced() - start_produced
                            << " were published; losses reported: " << losses.size();
  ASSERT_FALSE(losses.empty());
  EXPECT_EQ(losses.front().expected, 0);
  EXPECT_GT(losses.front().got, 0);
  EXPECT_TRUE(in_order) << "a message or a loss did not start where the last one ended";
  EXPECT_EQ(handled + skipped, next) << "offsets 0.." << next << ": each read or counted lost";
}

// A consumer that reads along with its producer stalls (a daemon busy elsewhere, a pause)
// longer than the broker keeps the log, with a small consumer queue: its position falls behind
// the log start while the producer goes on. librdkafka's own reset goes to the start it saw in
// the failing fetch answer and fetches it only fetch.error.backoff.ms later, when the start has
// moved on: reset after reset, reading nothing (the consumer used to wait a second, then move a
// tenth of the log past the start, which could be gone again before it was fetched). The
// consumer must jump once to an offset still in the log, soon after it has read what was queued,
// count the gap once, and read on in order while the producer goes on.
TEST(KafkaConsumerTest, AConsumerStalledBehindAMovingLogStartJumpsOnceAndReadsOn) {
  auto broker = EmbeddedBroker::Start({"stalled", 1, 1, /*changelog_topic=*/false, ""});
  ASSERT_TRUE(broker.ok()) << broker.status();
  SteadyProducer producer((*broker)->bootstrap(), "stalled");  // the log lasts ~1 s
  ASSERT_TRUE(producer.ok()) << producer.error();

  struct Loss {
    int64_t expected, got, log_end;
  };
  std::vector<Loss> losses;
  std::optional<int64_t> first;  // the first offset read
  int64_t next = -1, handled = 0, skipped = 0;
  bool in_order = true;
  KafkaConsumerOptions o;
  o.brokers = (*broker)->bootstrap();
  o.topic = "stalled";
  o.group = "stalled-test";
  // A queue far smaller than the log (the daemon's 16 MiB holds three of the development
  // broker's logs): the fetcher stops soon after the consumer does, while the log is kept.
  o.properties = {{"log_level", "0"}, {"queued.max.messages.kbytes", "256"}};
  o.on_assigned = [](const std::string&, const std::vector<int32_t>& partitions) {
    return std::vector<std::optional<int64_t>>(partitions.size());  // nothing stored: it reads
  };                                                                // the log from its start
  o.on_lost = [&](const std::string& topic, int32_t partition, int64_t expected, int64_t got,
                  int64_t log_end) {
    EXPECT_EQ(topic, "stalled");
    EXPECT_EQ(partition, 0);
    losses.push_back({expected, got, log_end});
    if (expected != next) in_order = false;
    skipped += got - expected;
    next = got;
  };
  auto consumer = KafkaConsumer::Create(o);
  ASSERT_TRUE(consumer.ok()) << consumer.status();
  const auto read = [&](std::chrono::milliseconds for_how_long) {
    const auto until = std::chrono::steady_clock::now() + for_how_long;
    while (std::chrono::steady_clock::now() < until) {
      (*consumer)->Poll(10ms, 500, [&](const KafkaMessage& m) {
        if (!first) first = next = m.offset;
        if (m.offset != next) in_order = false;
        next = m.offset + 1;
        ++handled;
      });
    }
  };
  // Reads what the log holds, then along with the producer for a second: nothing lost, the
  // lag known.
  ASSERT_TRUE(WaitFor(
      [&] {
        read(50ms);
        return handled >= 5000;
      },
      60s))
      << handled << " read";
  read(1000ms);
  EXPECT_TRUE(losses.empty());
  std::vector<KafkaConsumer::PartitionLag> lags = (*consumer)->PartitionLags(10s);
  ASSERT_EQ(lags.size(), 1u);
  EXPECT_TRUE(lags[0].messages.has_value());
  EXPECT_FALSE(lags[0].losing);

  // The stall: far longer than the log lasts.
  std::this_thread::sleep_for(2500ms);
  const int64_t position = next;  // what it should read next, after what is queued
  const int64_t handled_before = handled;
  const auto resumed = std::chrono::steady_clock::now();
  // Reads on until it has read past the gap for a second, or gives up after 10 s.
  std::optional<std::chrono::steady_clock::time_point> past_gap;
  while (std::chrono::steady_clock::now() < resumed + 10s &&
         (!past_gap || std::chrono::steady_clock::now() < *past_gap + 1s)) {
    read(10ms);
    if (!past_gap && !losses.empty() && next > losses.back().got) {
      past_gap = std::chrono::steady_clock::now();
      // The partition is losing now, and lags behind its log's end.
      lags = (*consumer)->PartitionLags(10s);
      ASSERT_EQ(lags.size(), 1u);
      EXPECT_TRUE(lags[0].losing);
      EXPECT_TRUE(lags[0].messages.has_value());
    }
  }
  producer.Stop();
  (*consumer)->Close();

  ASSERT_EQ(losses.size(), 1u) << "the gap is counted once: one jump, no chase";
  // From after what was queued when it stalled (256 KiB, of 1-KiB messages).
  EXPECT_GE(losses[0].expected, position);
  EXPECT_LE(losses[0].expected, position + 300);
  // It lands in the log's older half (the log holds ~5,000 messages of 1 KiB): past its start
  // by what the producer adds until the fetch, not at its end.
  EXPECT_LT(losses[0].got, losses[0].log_end - 2000) << "log end " << losses[0].log_end;
  ASSERT_TRUE(past_gap.has_value()) << "it never read past the gap";
  const double seconds = std::chrono::duration<double>(*past_gap - resumed).count();
  std::printf(
      "stalled at offset %lld: lost %lld messages (the log held ~5,000), read on %.0f ms after "
      "the stall ended, %lld messages in all since\n",
      static_cast<long long>(position), static_cast<long long>(losses[0].got - losses[0].expected),
      seconds * 1000, static_cast<long long>(handled - handled_before));
  // Its queue read (256 KiB), the out-of-range fetch, one jump: well within librdkafka's own
  // retries (which here read nothing) and the second the consumer used to wait.
  EXPECT_LT(seconds, 0.75);
  EXPECT_GE(handled - handled_before, 2000) << "it reads on along with the producer";
  EXPECT_TRUE(in_order) << "a message or a loss did not start where the last one ended";
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(handled + skipped, next - *first) << "each offset read or counted lost";
}

// Publishes `count` messages of 1 KiB to partition 0 of `topic` and waits until the broker has
// them all.
void PublishKilobytes(const std::string& brokers, const std::string& topic, int count) {
  rd_kafka_conf_t* conf = rd_kafka_conf_new();
  char err[256];
  rd_kafka_conf_set(conf, "bootstrap.servers", brokers.c_str(), err, sizeof(err));
  rd_kafka_conf_set(conf, "log_level", "0", err, sizeof(err));
  rd_kafka_conf_set(conf, "linger.ms", "5", err, sizeof(err));
  rd_kafka_t* producer = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof(err));
  ASSERT_NE(producer, nullptr) << err;
  const std::string payload(1024, 'x');
  for (int i = 0; i < count; ++i) {
    while (rd_kafka_producev(producer, RD_KAFKA_V_TOPIC(topic.c_str()), RD_KAFKA_V_PARTITION(0),
                             RD_KAFKA_V_VALUE(const_cast<char*>(payload.data()), payload.size()),
                             RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                             RD_KAFKA_V_END) == RD_KAFKA_RESP_ERR__QUEUE_FULL) {
      rd_kafka_poll(producer, 10);
    }
  }
  EXPECT_EQ(rd_kafka_flush(producer, 30000), RD_KAFKA_RESP_ERR_NO_ERROR);
  rd_kafka_destroy(producer);
}

// What a consumer of partition 0 of `topic` saw, with no stored offset: where its input began
// (on_start), the losses it reported, and the messages it read.
struct FirstRead {
  std::optional<int64_t> start;
  struct Loss {
    int64_t expected, got, log_end;
  };
  std::vector<Loss> losses;
  int64_t first_read = -1, last_read = -1, read = 0;
};

// A consumer of group `group` joins; once its partition is assigned, before anything can be
// fetched (inside the rebalance, right after on_start), `burst` runs. It reads until it has
// the offset before `until`.
FirstRead ReadFromAssignment(const std::string& brokers, const std::string& topic,
                             const std::string& group, const std::function<void()>& burst,
                             int64_t until) {
  FirstRead seen;
  KafkaConsumerOptions o;
  o.brokers = brokers;
  o.topic = topic;
  o.group = group;
  o.session_timeout = kSessionTimeout;  // a second consumer of the group waits 2 s, not 9
  o.properties = {{"log_level", "0"}};
  o.on_assigned = [](const std::string&, const std::vector<int32_t>& partitions) {
    return std::vector<std::optional<int64_t>>(partitions.size());  // nothing stored
  };
  o.on_start = [&](const std::string& t, int32_t partition, int64_t offset) {
    EXPECT_EQ(t, topic);
    EXPECT_EQ(partition, 0);
    seen.start = offset;
    burst();
  };
  o.on_lost = [&](const std::string&, int32_t, int64_t expected, int64_t got, int64_t log_end) {
    seen.losses.push_back({expected, got, log_end});
  };
  auto consumer = KafkaConsumer::Create(o);
  EXPECT_TRUE(consumer.ok()) << consumer.status();
  if (!consumer.ok()) return seen;
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while (seen.last_read + 1 < until && std::chrono::steady_clock::now() < deadline) {
    (*consumer)->Poll(50ms, 500, [&](const KafkaMessage& m) {
      if (seen.first_read < 0) seen.first_read = m.offset;
      seen.last_read = m.offset;
      ++seen.read;
    });
  }
  (*consumer)->Close();  // commits what it read
  return seen;
}

// A consumer with no stored offset is assigned its partition, and a burst larger than the
// development broker keeps (5 MiB a partition) is published before its first fetch: the log
// starts past everything published since the assignment. That is a loss from the log's end at
// the assignment, reported before the first message; what was published before the assignment
// and deleted too was never this consumer's to read.
TEST(KafkaConsumerTest, ALossBeforeTheFirstFetchIsCountedFromTheLogEndAtAssignment) {
  auto broker = EmbeddedBroker::Start({"first", 1, 1, /*changelog_topic=*/false, ""});
  ASSERT_TRUE(broker.ok()) << broker.status();
  const std::string brokers = (*broker)->bootstrap();
  PublishKilobytes(brokers, "first", 1000);  // before the consumer: kept, and read
  const FirstRead seen = ReadFromAssignment(
      brokers, "first", "first-test", [&] { PublishKilobytes(brokers, "first", 15000); }, 16000);
  ASSERT_TRUE(seen.start.has_value());
  EXPECT_EQ(*seen.start, 1000) << "input begins where the log ended at the assignment";
  ASSERT_EQ(seen.losses.size(), 1u);
  EXPECT_EQ(seen.losses[0].expected, 1000);
  EXPECT_EQ(seen.losses[0].got, seen.first_read) << "the loss ends where reading began";
  EXPECT_GT(seen.first_read, 1000) << "the burst moved the log's start past the assignment";
  EXPECT_EQ(seen.losses[0].log_end, 16000);
  EXPECT_EQ(seen.last_read, 15999);
  EXPECT_EQ(seen.read + (seen.losses[0].got - seen.losses[0].expected), 15000)
      << "every message since the assignment read or counted lost";
}

// A group that read part of a partition and left (its offsets committed) comes back with no
// stored state (a daemon whose state directory was lost): its input begins at the committed
// offset, and what the log lost past it meanwhile is counted.
TEST(KafkaConsumerTest, ALossBeforeTheFirstFetchIsCountedFromTheCommittedOffset) {
  auto broker = EmbeddedBroker::Start({"again", 1, 1, /*changelog_topic=*/false, ""});
  ASSERT_TRUE(broker.ok()) << broker.status();
  const std::string brokers = (*broker)->bootstrap();
  PublishKilobytes(brokers, "again", 500);
  const FirstRead before = ReadFromAssignment(
      brokers, "again", "again-test", [] {}, 500);
  ASSERT_EQ(before.last_read, 499);
  EXPECT_TRUE(before.losses.empty());
  PublishKilobytes(brokers, "again", 15000);  // nobody reads: the log's start moves past 500
  const FirstRead after = ReadFromAssignment(
      brokers, "again", "again-test", [] {}, 15500);
  ASSERT_TRUE(after.start.has_value());
  EXPECT_EQ(*after.start, 500) << "the group's committed offset";
  ASSERT_EQ(after.losses.size(), 1u);
  EXPECT_EQ(after.losses[0].expected, 500);
  EXPECT_EQ(after.losses[0].got, after.first_read);
  EXPECT_EQ(after.last_read, 15499);
  EXPECT_EQ(after.read + (after.losses[0].got - 500), 15000);
}

// Seconds from creating a member until the group has assigned it `partitions` partitions
// (polling as the daemon does); a negative value when that took more than 60 s.
double SecondsUntilAssigned(KafkaConsumer* consumer, int partitions,
                            std::chrono::steady_clock::time_point since) {
  const auto deadline = since + 60s;
  while (consumer->assigned_partitions() < partitions) {
    if (std::chrono::steady_clock::now() > deadline) return -1;
    consumer->Poll(20ms, 100, [](const KafkaMessage&) {});
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

// A member of a new group on a 2-partition development broker gets its partitions and closes;
// a successor with the same options (a restart) joins. Returns the seconds from creating the
// successor until it had the partitions.
double SecondsUntilASuccessorIsAssigned(const std::string& instance_id,
                                        std::chrono::milliseconds session_timeout) {
  auto broker = EmbeddedBroker::Start({"restart", 2, 1, /*changelog_topic=*/false, ""});
  EXPECT_TRUE(broker.ok()) << broker.status();
  if (!broker.ok()) return -1;
  KafkaConsumerOptions o;
  o.brokers = (*broker)->bootstrap();
  o.topic = "restart";
  o.group = "restart";
  o.instance_id = instance_id;
  o.session_timeout = session_timeout;
  o.properties = {{"log_level", "0"}};
  {
    auto first = KafkaConsumer::Create(o);
    EXPECT_TRUE(first.ok()) << first.status();
    if (!first.ok()) return -1;
    EXPECT_GE(SecondsUntilAssigned(first->get(), 2, std::chrono::steady_clock::now()), 0);
    (*first)->Close();
  }
  const auto restarted = std::chrono::steady_clock::now();
  auto second = KafkaConsumer::Create(o);
  EXPECT_TRUE(second.ok()) << second.status();
  if (!second.ok()) return -1;
  const double seconds = SecondsUntilAssigned(second->get(), 2, restarted);
  (*second)->Close();
  return seconds;
}

// A member with a group.instance.id shuts down (a static member sends no LeaveGroup, as after a
// crash) and its successor joins with the same id. A broker that supports static membership
// (Kafka >= 2.3) hands the successor the partitions at once, with no rebalance; librdkafka's
// mock cluster reads the id and ignores it: the successor is a new member, and gets the
// partitions only after the old member's session has timed out and a second rebalance.
TEST(KafkaConsumerTest, TheDevelopmentBrokerIgnoresStaticMembership) {
  const double seconds = SecondsUntilASuccessorIsAssigned("rankwatchd-a", 4s);
  ASSERT_GE(seconds, 0) << "never assigned";
  std::printf("static member restarted: partitions back after %.2f s (session timeout 4 s)\n",
              seconds);
  // The old member's session had to time out (it was active at most a heartbeat, 1 s, before
  // it closed): the broker did not take the successor for it.
  EXPECT_GE(seconds, 3.0);
}

// A dynamic member that closes leaves the group (a LeaveGroup request, as rankwatchd does on
// SIGTERM): its successor does not wait for the old session to time out. The mock broker still
// waits session timeout - 1 s for members to join the rebalance the leave started.
TEST(KafkaConsumerTest, ADynamicMemberThatClosesLeavesAndItsSuccessorDoesNotWaitForItsSession) {
  const double seconds = SecondsUntilASuccessorIsAssigned("", 4s);
  ASSERT_GE(seconds, 0) << "never assigned";
  std::printf("dynamic member restarted after leaving: partitions back after %.2f s\n", seconds);
  EXPECT_LT(seconds, 4.0);
}

// Message `id`'s payload for the PollBatch tests: its id, then filler bytes that depend on the
// id and their position, from none to ~3 KiB (a few empty payloads too); its key, "k<id>".
std::string BatchPayload(int id) {
  if (id % 97 == 5) return "";
  std::string payload = std::to_string(id) + ":";
  const int filler = (id * 37) % 3000;
  for (int j = 0; j < filler; ++j) payload.push_back(static_cast<char>('a' + (id + 7 * j) % 26));
  return payload;
}

// Publishes messages first..last-1 of the PollBatch tests, message `id` to partition
// id % partitions with its payload and key, and waits until the broker has them all.
void PublishBatchMessages(rd_kafka_t* producer, const std::string& topic, int partitions, int first,
                          int last) {
  for (int id = first; id < last; ++id) {
    const std::string payload = BatchPayload(id), key = "k" + std::to_string(id);
    rd_kafka_resp_err_t e;
    while ((e = rd_kafka_producev(
                producer, RD_KAFKA_V_TOPIC(topic.c_str()), RD_KAFKA_V_PARTITION(id % partitions),
                RD_KAFKA_V_VALUE(const_cast<char*>(payload.data()), payload.size()),
                RD_KAFKA_V_KEY(key.data(), key.size()), RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                RD_KAFKA_V_END)) == RD_KAFKA_RESP_ERR__QUEUE_FULL) {
      rd_kafka_poll(producer, 10);
    }
    ASSERT_EQ(e, RD_KAFKA_RESP_ERR_NO_ERROR);
    rd_kafka_poll(producer, 0);
  }
  ASSERT_EQ(rd_kafka_flush(producer, 30000), RD_KAFKA_RESP_ERR_NO_ERROR);
}

// PollBatch hands a poll's messages over together: every message once, in offset order within
// its partition, at most max_messages in a call, with payloads and keys intact while the
// callback runs (each batch's are compared only once the whole batch has been seen, so a payload
// freed as soon as the next message is taken would show); it returns how many it handed out.
TEST(KafkaConsumerTest, PollBatchHandsOutEveryMessageOnceInOrderWithItsPayload) {
  constexpr char kBatchTopic[] = "batch";
  constexpr int kBatchPartitions = 4, kTotal = 4000;
  constexpr size_t kMax = 37;
  auto broker =
      EmbeddedBroker::Start({kBatchTopic, kBatchPartitions, 1, /*changelog_topic=*/false, ""});
  ASSERT_TRUE(broker.ok()) << broker.status();
  const std::string brokers = (*broker)->bootstrap();
  rd_kafka_conf_t* conf = rd_kafka_conf_new();
  char err[256];
  rd_kafka_conf_set(conf, "bootstrap.servers", brokers.c_str(), err, sizeof(err));
  rd_kafka_conf_set(conf, "log_level", "0", err, sizeof(err));
  rd_kafka_conf_set(conf, "linger.ms", "1", err, sizeof(err));
  rd_kafka_t* producer = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof(err));
  ASSERT_NE(producer, nullptr) << err;
  // A backlog before the consumer (full batches), the rest while it reads.
  PublishBatchMessages(producer, kBatchTopic, kBatchPartitions, 0, kTotal / 2);

  KafkaConsumerOptions o;
  o.brokers = brokers;
  o.topic = kBatchTopic;
  o.group = "batch-test";
  o.session_timeout = kSessionTimeout;
  o.properties = {{"log_level", "0"}};
  o.on_assigned = [](const std::string&, const std::vector<int32_t>& partitions) {
    return std::vector<std::optional<int64_t>>(partitions.size(), int64_t{0});
  };
  int losses = 0;
  o.on_lost = [&](const std::string&, int32_t, int64_t, int64_t, int64_t) { ++losses; };
  auto consumer = KafkaConsumer::Create(o);
  ASSERT_TRUE(consumer.ok()) << consumer.status();

  std::vector<int> handled(kTotal, 0);
  std::map<int32_t, int64_t> next;  // per partition: the offset expected next
  int total = 0, callbacks = 0, bad_payloads = 0, out_of_order = 0;
  size_t largest = 0, in_poll = 0, calls_over_max = 0, returns_wrong = 0;
  size_t multi_partition_batches = 0;
  const auto on_messages = [&](const std::vector<KafkaMessage>& messages) {
    ++callbacks;
    in_poll += messages.size();
    largest = std::max(largest, messages.size());
    EXPECT_LE(messages.size(), kMax);
    // Order and count first, as a consumer would take them...
    std::set<int32_t> partitions;
    for (const KafkaMessage& m : messages) {
      partitions.insert(m.partition);
      if (m.partition < 0 || m.partition >= kBatchPartitions) {
        ADD_FAILURE() << "partition " << m.partition;
        continue;
      }
      int64_t& expected = next[m.partition];
      if (m.offset != expected) {
        ++out_of_order;
        ADD_FAILURE() << "partition " << m.partition << " offset " << m.offset << ", expected "
                      << expected;
      }
      expected = m.offset + 1;
    }
    multi_partition_batches += partitions.size() > 1;
    // ... then every payload and key, once the whole batch has been taken: each message `id`
    // went to partition id % 4 as its (id / 4)th message.
    for (const KafkaMessage& m : messages) {
      const int id = static_cast<int>(m.offset) * kBatchPartitions + m.partition;
      if (id < 0 || id >= kTotal) {
        ADD_FAILURE() << "partition " << m.partition << " offset " << m.offset << ": no such id";
        continue;
      }
      ++handled[id];
      ++total;
      if (m.payload != BatchPayload(id) || m.key != "k" + std::to_string(id)) {
        ++bad_payloads;
        ADD_FAILURE() << "message " << id << " (partition " << m.partition << " offset " << m.offset
                      << "): payload of " << m.payload.size() << " bytes, key '" << m.key << "'";
      }
    }
  };
  const auto poll = [&] {
    in_poll = 0;
    const size_t returned = (*consumer)->PollBatch(20ms, kMax, on_messages);
    calls_over_max += in_poll > kMax;
    if (returned != in_poll) {
      ++returns_wrong;
      ADD_FAILURE() << "PollBatch returned " << returned << ", handed out " << in_poll;
    }
  };
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while (total < kTotal / 4 && std::chrono::steady_clock::now() < deadline) poll();
  PublishBatchMessages(producer, kBatchTopic, kBatchPartitions, kTotal / 2, kTotal);
  rd_kafka_destroy(producer);
  while (total < kTotal && std::chrono::steady_clock::now() < deadline) poll();
  // A duplicate would come now.
  const auto after = std::chrono::steady_clock::now() + 300ms;
  while (std::chrono::steady_clock::now() < after) poll();
  (*consumer)->Close();

  EXPECT_EQ(total, kTotal) << "handed out in 30 s";
  for (int id = 0; id < kTotal; ++id) EXPECT_EQ(handled[id], 1) << "message " << id;
  for (int32_t p = 0; p < kBatchPartitions; ++p) {
    EXPECT_EQ(next[p], kTotal / kBatchPartitions) << "partition " << p;
  }
  EXPECT_EQ(bad_payloads, 0);
  EXPECT_EQ(out_of_order, 0);
  EXPECT_EQ(calls_over_max, 0u);
  EXPECT_EQ(returns_wrong, 0u);
  EXPECT_EQ(losses, 0);
  // The backlog came in full batches, not one message at a time.
  EXPECT_EQ(largest, kMax);
  std::printf("%d messages in %d batches (%zu with several partitions)\n", total, callbacks,
              multi_partition_batches);
}

// A consumer reading with PollBatch stalls longer than the broker keeps the log while its
// producer goes on (as in AConsumerStalledBehindAMovingLogStartJumpsOnceAndReadsOn), and the
// producer stops with the stall. The loss must be reported after the messages before the gap
// have been handed out and before any after it, whether the gap shows inside one poll's messages
// (librdkafka's own reset fetched past it while older messages were still queued: the poll's
// batch must end before the gap) or after them (the consumer's jump). After the stall it reads
// slowly at first, a few messages a batch, so that the fetcher refills the queue while messages
// before the gap are still in it: the gap then shows inside a poll (every run so far).
TEST(KafkaConsumerTest, WithPollBatchALossComesBetweenTheMessagesBeforeTheGapAndAfterIt) {
  auto broker = EmbeddedBroker::Start({"stalled-batch", 1, 1, /*changelog_topic=*/false, ""});
  ASSERT_TRUE(broker.ok()) << broker.status();
  SteadyProducer producer((*broker)->bootstrap(), "stalled-batch");  // the log lasts ~1 s
  ASSERT_TRUE(producer.ok()) << producer.error();

  struct Loss {
    int64_t expected, got;
    uint64_t poll;          // the PollBatch call that reported it
    size_t batches_before;  // the batches that call had handed out by then
    size_t batches_after = 0;
  };
  std::vector<Loss> losses;
  std::optional<int64_t> first;  // the first offset read
  int64_t next = -1, handled = 0, skipped = 0;
  int out_of_order = 0;
  uint64_t polls = 0;
  size_t batches_in_poll = 0, handed_in_poll = 0, max_messages = 500;
  size_t over_max = 0, returns_wrong = 0;
  KafkaConsumerOptions o;
  o.brokers = (*broker)->bootstrap();
  o.topic = "stalled-batch";
  o.group = "stalled-batch-test";
  o.properties = {{"log_level", "0"}, {"queued.max.messages.kbytes", "256"}};
  o.on_assigned = [](const std::string&, const std::vector<int32_t>& partitions) {
    return std::vector<std::optional<int64_t>>(partitions.size());  // nothing stored
  };
  o.on_lost = [&](const std::string&, int32_t partition, int64_t expected, int64_t got, int64_t) {
    EXPECT_EQ(partition, 0);
    losses.push_back({expected, got, polls, batches_in_poll});
    // Reported where the messages handed out so far end, before those after the gap.
    if (expected != next) {
      ++out_of_order;
      ADD_FAILURE() << "a loss from offset " << expected << " after the messages up to " << next;
    }
    skipped += got - expected;
    next = got;
  };
  auto consumer = KafkaConsumer::Create(o);
  ASSERT_TRUE(consumer.ok()) << consumer.status();
  std::chrono::milliseconds batch_pause{0};
  const auto on_messages = [&](const std::vector<KafkaMessage>& messages) {
    ++batches_in_poll;
    handed_in_poll += messages.size();
    if (!losses.empty() && losses.back().poll == polls) ++losses.back().batches_after;
    for (const KafkaMessage& m : messages) {
      if (!first) first = next = m.offset;
      if (m.offset != next) {
        ++out_of_order;
        ADD_FAILURE() << "offset " << m.offset << " handed out where " << next << " was next";
      }
      next = m.offset + 1;
      ++handled;
    }
    if (batch_pause > 0ms) std::this_thread::sleep_for(batch_pause);
  };
  const auto read = [&](std::chrono::milliseconds for_how_long) {
    const auto until = std::chrono::steady_clock::now() + for_how_long;
    while (std::chrono::steady_clock::now() < until) {
      ++polls;
      batches_in_poll = handed_in_poll = 0;
      const size_t n = (*consumer)->PollBatch(10ms, max_messages, on_messages);
      over_max += handed_in_poll > max_messages;
      returns_wrong += n != handed_in_poll;
    }
  };
  ASSERT_TRUE(WaitFor(
      [&] {
        read(50ms);
        return handled >= 5000;
      },
      60s))
      << handled << " read";
  read(500ms);
  EXPECT_TRUE(losses.empty());

  std::this_thread::sleep_for(2500ms);  // the stall: far longer than the log lasts
  // The producer stops with the stall: the log's start, long past the consumer's position, stays
  // where it is, and librdkafka's own reset to it reads on.
  producer.Stop();
  const auto resumed = std::chrono::steady_clock::now();
  // Slowly for a while (8 messages every 10 ms: the ~300 messages of the 256-KiB queue last
  // ~0.4 s, under the second after which the consumer jumps with messages still queued), so that
  // the reset's messages are queued behind those before the gap; then at full speed until it has
  // read past the gap for half a second, or gives up after 10 s.
  max_messages = 8;
  batch_pause = 10ms;
  read(600ms);
  max_messages = 500;
  batch_pause = 0ms;
  std::optional<std::chrono::steady_clock::time_point> past_gap;
  while (std::chrono::steady_clock::now() < resumed + 10s &&
         (!past_gap || std::chrono::steady_clock::now() < *past_gap + 500ms)) {
    read(10ms);
    if (!past_gap && !losses.empty() && next > losses.back().got) {
      past_gap = std::chrono::steady_clock::now();
    }
  }
  producer.Stop();
  (*consumer)->Close();

  ASSERT_FALSE(losses.empty()) << "the stall lost nothing";
  EXPECT_TRUE(past_gap.has_value()) << "it never read past the gap";
  EXPECT_EQ(out_of_order, 0);
  EXPECT_EQ(over_max, 0u) << "polls that handed out more than max_messages";
  EXPECT_EQ(returns_wrong, 0u) << "polls whose return value was not what they handed out";
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(handled + skipped, next - *first) << "each offset read or counted lost";
  // Which way the gap was found: inside a poll's messages (the poll's batch ended before it,
  // more batches after it), or by the consumer's jump after a poll. Timing decides; the first is
  // what PollBatch's early end of a batch is for, and the usual way here.
  size_t inside = 0;
  for (const Loss& l : losses) inside += l.batches_before > 0 && l.batches_after > 0;
  std::printf("%zu losses (%zu between two batches of one poll), %lld messages lost\n",
              losses.size(), inside, static_cast<long long>(skipped));
}

}  // namespace
}  // namespace rankwatch
