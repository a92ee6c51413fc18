// FetchRefill's rule (when a read-down queue's fetcher is woken), and the wake-up itself on the
// embedded broker: a consumer with a small queue reads a backlog of many queues' worth without
// waiting a second per queue (librdkafka 2.0's broker thread sleeps that long once the queue is
// full), and one that keeps up with its producers never wakes the fetcher.
#include "ingest/fetch_refill.h"

#include <gtest/gtest.h>
#include <librdkafka/rdkafka.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "ingest/kafka_consumer.h"
#include "kafka/embedded_broker.h"

namespace rankwatch {
namespace {

using namespace std::chrono_literals;

constexpr FetchQueueLimits kLimits{1000000, 100000};  // 1 MB, 100,000 messages

TEST(FetchRefillTest, WakesOnceAFullQueueIsReadDownToHalf) {
  FetchRefill refill(kLimits);
  // 1,000 messages of 1,000 bytes a batch: the queue holds 1 MB (its limit) at first.
  EXPECT_FALSE(refill.Taken(100, 100000, 900));  // 900 kB left
  EXPECT_FALSE(refill.Taken(100, 100000, 800));
  EXPECT_FALSE(refill.Taken(100, 100000, 700));
  EXPECT_FALSE(refill.Taken(100, 100000, 600));
  EXPECT_TRUE(refill.Taken(100, 100000, 500));  // half left, half read
  EXPECT_EQ(refill.wakeups(), 1u);
  // Woken: the queue is not seen full again, so reading the rest wakes nothing.
  for (int left = 400; left >= 0; left -= 100) EXPECT_FALSE(refill.Taken(100, 100000, left));
  EXPECT_EQ(refill.wakeups(), 1u);
}

TEST(FetchRefillTest, AQueueThatNeverFillsIsNeverWoken) {
  FetchRefill refill(kLimits);
  // A daemon that keeps up: each batch takes what one fetch brought (200 kB), nothing left.
  for (int i = 0; i < 10000; ++i) ASSERT_FALSE(refill.Taken(200, 200000, 0)) << i;
  for (int i = 0; i < 1000; ++i) ASSERT_FALSE(refill.Taken(0, 0, 0)) << i;
  EXPECT_EQ(refill.wakeups(), 0u);
}

TEST(FetchRefillTest, AQueueSeenUnderThreeQuartersOfItsLimitIsNotWoken) {
  FetchRefill refill(kLimits);
  // The fetcher stops at the limit (1 MB); a queue seen at 700 kB at most has not stopped it.
  for (int left = 600; left >= 0; left -= 100) EXPECT_FALSE(refill.Taken(100, 100000, left));
  // Seen at 800 kB: it may have (the bytes left are an estimate), and is woken at half.
  EXPECT_FALSE(refill.Taken(100, 100000, 700));
  EXPECT_FALSE(refill.Taken(100, 100000, 600));
  EXPECT_TRUE(refill.Taken(100, 100000, 500));
}

TEST(FetchRefillTest, TheMessageLimitCountsLikeTheByteLimit) {
  FetchRefill refill(kLimits);
  // Small messages: the queue reaches queued.min.messages (100,000) at 1 MB / 10 = 100 kB.
  EXPECT_FALSE(refill.Taken(10000, 10000, 90000));
  for (int left = 80000; left > 50000; left -= 10000)
    EXPECT_FALSE(refill.Taken(10000, 10000, left));
  EXPECT_TRUE(refill.Taken(10000, 10000, 50000));
}

TEST(FetchRefillTest, TheLimitsAreTheClientsConfiguration) {
  rd_kafka_conf_t* conf = rd_kafka_conf_new();
  char err[256];
  ASSERT_EQ(rd_kafka_conf_set(conf, "log_level", "0", err, sizeof(err)), RD_KAFKA_CONF_OK);
  ASSERT_EQ(rd_kafka_conf_set(conf, "queued.max.messages.kbytes", "2048", err, sizeof(err)),
            RD_KAFKA_CONF_OK);
  ASSERT_EQ(rd_kafka_conf_set(conf, "queued.min.messages", "5000", err, sizeof(err)),
            RD_KAFKA_CONF_OK);
  rd_kafka_t* rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, err, sizeof(err));
  ASSERT_NE(rk, nullptr) << err;
  const FetchQueueLimits limits = FetchQueueLimitsOf(rk);
  EXPECT_EQ(limits.max_bytes, 2048 * 1024);
  EXPECT_EQ(limits.max_messages, 5000);
  rd_kafka_destroy(rk);
}

// Publishes `count` messages of `size` bytes over `partitions` partitions of `topic`.
void Publish(const std::string& brokers, const std::string& topic, int partitions, int count,
             size_t size) {
  rd_kafka_conf_t* conf = rd_kafka_conf_new();
  char err[256];
  rd_kafka_conf_set(conf, "bootstrap.servers", brokers.c_str(), err, sizeof(err));
  rd_kafka_conf_set(conf, "log_level", "0", err, sizeof(err));
  rd_kafka_conf_set(conf, "linger.ms", "5", err, sizeof(err));
  rd_kafka_t* producer = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof(err));
  ASSERT_NE(producer, nullptr) << err;
  std::string payload(size, 'x');
  for (int i = 0; i < count; ++i) {
    rd_kafka_resp_err_t e;
    while ((e = rd_kafka_producev(producer, RD_KAFKA_V_TOPIC(topic.c_str()),
                                  RD_KAFKA_V_PARTITION(i % partitions),
                                  RD_KAFKA_V_VALUE(payload.data(), payload.size()),
                                  RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_END)) ==
           RD_KAFKA_RESP_ERR__QUEUE_FULL) {
      rd_kafka_poll(producer, 10);
    }
    ASSERT_EQ(e, RD_KAFKA_RESP_ERR_NO_ERROR);
  }
  ASSERT_EQ(rd_kafka_flush(producer, 30000), RD_KAFKA_RESP_ERR_NO_ERROR);
  rd_kafka_destroy(producer);
}

struct Reading {
  int messages = 0;
  std::chrono::duration<double> seconds{};  // from the first message to the last
  uint64_t wakeups = 0;
};

// A consumer with a 64 KiB queue reads `expected` messages from the start of `topic`.
Reading ReadAll(const std::string& brokers, const std::string& topic, int expected) {
  KafkaConsumerOptions o;
  o.brokers = brokers;
  o.topic = topic;
  o.group = "refill-" + topic;
  // One fetch answer brings 64 KiB at most (librdkafka checks the queue before a fetch).
  o.properties = {{"log_level", "0"},
                  {"queued.max.messages.kbytes", "64"},
                  {"fetch.max.bytes", "65536"},
                  {"message.max.bytes", "65536"},
                  {"max.partition.fetch.bytes", "16384"}};
  auto consumer = KafkaConsumer::Create(o);
  EXPECT_TRUE(consumer.ok()) << consumer.status();
  Reading r;
  if (!consumer.ok()) return r;
  std::chrono::steady_clock::time_point first;
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  while (r.messages < expected && std::chrono::steady_clock::now() < deadline) {
    (*consumer)->Poll(20ms, 100, [&](const KafkaMessage&) {
      if (r.messages++ == 0) first = std::chrono::steady_clock::now();
    });
  }
  r.seconds = std::chrono::steady_clock::now() - first;
  r.wakeups = (*consumer)->fetch_wakeups();
  (*consumer)->Close();
  return r;
}

// 4 MiB through a 64 KiB queue on two brokers: 64 queues' worth, read in about 10 ms. Without
// the wake-ups the broker threads sleep up to a second each time the queue is full (3 s in
// all on the development machine).
TEST(FetchRefillTest, ABacklogIsReadWithoutWaitingASecondPerQueue) {
  auto broker = EmbeddedBroker::Start({"backlog", 4, 2, /*changelog_topic=*/false, ""});
  ASSERT_TRUE(broker.ok()) << broker.status();
  constexpr int kCount = 4096;
  Publish((*broker)->bootstrap(), "backlog", 4, kCount, 1024);
  const Reading r = ReadAll((*broker)->bootstrap(), "backlog", kCount);
  EXPECT_EQ(r.messages, kCount);
  EXPECT_GT(r.wakeups, 0u);
  // One wake-up missed (the queue's peak estimated under three quarters while the fetcher
  // stopped at the limit: seen once in CI beside the sanitizer build, 1.003 s) costs one second;
  // without wake-ups it takes about three.
  EXPECT_LT(r.seconds, 2s) << r.wakeups << " wake-ups";
  std::printf("%d messages in %.2f s, %llu wake-ups\n", r.messages, r.seconds.count(),
              static_cast<unsigned long long>(r.wakeups));
}

// Messages published while the consumer keeps up: the queue never fills, nothing is woken.
TEST(FetchRefillTest, AConsumerKeepingUpWakesNothing) {
  auto broker = EmbeddedBroker::Start({"live", 2, 1, /*changelog_topic=*/false, ""});
  ASSERT_TRUE(broker.ok()) << broker.status();
  const std::string brokers = (*broker)->bootstrap();
  constexpr int kCount = 400;
  Reading r;
  std::thread reader([&] { r = ReadAll(brokers, "live", kCount); });
  std::this_thread::sleep_for(2s);  // the consumer has joined and reads the empty log
  for (int i = 0; i < kCount / 40; ++i) {
    Publish(brokers, "live", 2, 40, 100);  // 4 kB at a time
    std::this_thread::sleep_for(20ms);
  }
  reader.join();
  EXPECT_EQ(r.messages, kCount);
  EXPECT_EQ(r.wakeups, 0u);
}

}  // namespace
}  // namespace rankwatch
