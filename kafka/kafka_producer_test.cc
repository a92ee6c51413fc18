#include "kafka/kafka_producer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "kafka/client_factory.h"
#include "kafka/control_request_producer.h"
#include "kafka/embedded_broker.h"

namespace rankwatch {
namespace {

using std::chrono::milliseconds;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;
using ::testing::StartsWith;

constexpr char kNoBroker[] = "127.0.0.1:1";

// Every message of partition 0 of `topic`, as (key, value), reading until `count` came or 10 s.
std::vector<std::pair<std::string, std::string>> ReadBack(const std::string& brokers,
                                                          const std::string& topic, size_t count) {
  KafkaClientConfig config;
  config.type = RD_KAFKA_CONSUMER;
  config.defaults = {{"bootstrap.servers", brokers}, {"group.id", "producer-test"}};
  auto client = NewKafkaClient(config);
  EXPECT_TRUE(client.ok()) << client.status();
  if (!client.ok()) return {};
  KafkaPartitionList parts(rd_kafka_topic_partition_list_new(1));
  rd_kafka_topic_partition_list_add(parts.get(), topic.c_str(), 0)->offset =
      RD_KAFKA_OFFSET_BEGINNING;
  rd_kafka_assign(client->get(), parts.get());
  std::vector<std::pair<std::string, std::string>> out;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (out.size() < count && std::chrono::steady_clock::now() < deadline) {
    const KafkaMessagePtr m(rd_kafka_consumer_poll(client->get(), 100));
    if (m == nullptr || m->err != RD_KAFKA_RESP_ERR_NO_ERROR) continue;
    out.emplace_back(std::string(static_cast<const char*>(m->key), m->key_len),
                     std::string(static_cast<const char*>(m->payload), m->len));
  }
  rd_kafka_consumer_close(client->get());
  return out;
}

TEST(KafkaProducerTest, NeedsBrokers) {
  KafkaProducerOptions options;
  options.topic = "t";
  auto producer = KafkaProducer::Create(options);
  ASSERT_FALSE(producer.ok());
  EXPECT_EQ(producer.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(producer.status().message(), "no Kafka brokers given");
}

TEST(KafkaProducerTest, ABadPropertyIsAnErrorNamingIt) {
  KafkaProducerOptions options;
  options.brokers = kNoBroker;
  options.topic = "t";
  options.properties = {{"linger.ms", "forever"}};
  auto producer = KafkaProducer::Create(options);
  ASSERT_FALSE(producer.ok());
  EXPECT_EQ(producer.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(producer.status().message()),
              StartsWith("kafka property linger.ms=forever: "));
}

TEST(KafkaProducerTest, PublishesKeyedMessagesAndCountsTheirDelivery) {
  auto broker = EmbeddedBroker::Start({"keyed", 1, 1, /*changelog_topic=*/false, ""});
  ASSERT_TRUE(broker.ok()) << broker.status();
  KafkaProducerOptions options;
  options.brokers = (*broker)->bootstrap();
  options.topic = "keyed";
  auto producer = KafkaProducer::Create(options);
  ASSERT_TRUE(producer.ok()) << producer.status();
  ASSERT_TRUE((*producer)->WaitUntilConnected(milliseconds(10'000)).ok());
  EXPECT_TRUE((*producer)->development_broker());
  ASSERT_TRUE((*producer)->Publish("job-a", "first").ok());
  ASSERT_TRUE((*producer)->Publish("job-b", "second").ok());
  ASSERT_TRUE((*producer)->Flush(milliseconds(10'000)).ok());
  EXPECT_EQ((*producer)->delivered(), 2u);
  EXPECT_EQ((*producer)->failed(), 0u);
  EXPECT_THAT(ReadBack((*broker)->bootstrap(), "keyed", 2),
              ElementsAre(Pair("job-a", "first"), Pair("job-b", "second")));
}

TEST(KafkaProducerTest, UnreachableBrokersAreUnavailableNamingThem) {
  KafkaProducerOptions options;
  options.brokers = kNoBroker;
  options.topic = "t";
  auto producer = KafkaProducer::Create(options);
  ASSERT_TRUE(producer.ok()) << producer.status();
  const absl::Status s = (*producer)->WaitUntilConnected(milliseconds(300));
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(s.message()), StartsWith("cannot reach Kafka at 127.0.0.1:1 ("));
}

TEST(KafkaProducerTest, DropsTheNewestWhenItsQueueIsFull) {
  KafkaProducerOptions options;
  options.brokers = kNoBroker;
  options.topic = "t";
  options.queue_max_messages = 1;
  options.when_full = KafkaProducerOptions::WhenFull::kDropNewest;
  options.properties = {{"message.timeout.ms", "200"}};
  auto producer = KafkaProducer::Create(options);
  ASSERT_TRUE(producer.ok()) << producer.status();
  ASSERT_TRUE((*producer)->Publish("k", "kept").ok());
  const absl::Status s = (*producer)->Publish("k", "dropped");
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ((*producer)->dropped(), 1u);
  // Nothing answers: the one queued fails after message.timeout.ms.
  EXPECT_TRUE((*producer)->Flush(milliseconds(10'000)).ok());
  EXPECT_EQ((*producer)->failed(), 1u);
  EXPECT_EQ((*producer)->delivered(), 0u);
}

// A message over max_message_bytes (value + key + 36 bytes) is refused at once, counted, and
// the producer goes on: the next message is delivered (issue #47).
TEST(KafkaProducerTest, AMessageOverMaxMessageBytesIsRefusedOutOfRangeAndTheProducerGoesOn) {
  auto broker = EmbeddedBroker::Start({"sized", 1, 1, /*changelog_topic=*/false, ""});
  ASSERT_TRUE(broker.ok()) << broker.status();
  KafkaProducerOptions options;
  options.brokers = (*broker)->bootstrap();
  options.topic = "sized";
  options.max_message_bytes = 20000;
  auto producer = KafkaProducer::Create(options);
  ASSERT_TRUE(producer.ok()) << producer.status();
  EXPECT_EQ((*producer)->max_message_bytes(), 20000u);
  const std::string fits(20000 - 3 - kKafkaRecordOverheadBytes, 'a');
  const absl::Status too_large = (*producer)->Publish("job", fits + "b", 7);
  EXPECT_EQ(too_large.code(), absl::StatusCode::kOutOfRange) << too_large;
  EXPECT_EQ((*producer)->oversized(), 1u);
  ASSERT_TRUE((*producer)->Publish("job", fits, 7).ok());
  ASSERT_TRUE((*producer)->Flush(milliseconds(10'000)).ok());
  EXPECT_EQ((*producer)->delivered(), 1u);
  EXPECT_EQ((*producer)->failed(), 0u);
  EXPECT_EQ((*producer)->failed_records(), 0u);
  const auto read = ReadBack((*broker)->bootstrap(), "sized", 1);
  ASSERT_EQ(read.size(), 1u);
  EXPECT_EQ(read[0].second.size(), fits.size());
  // The default is librdkafka's, and a property wins over the option.
  options.max_message_bytes = kDefaultKafkaMaxMessageBytes;
  options.properties = {{"message.max.bytes", "30000"}};
  auto overridden = KafkaProducer::Create(options);
  ASSERT_TRUE(overridden.ok()) << overridden.status();
  EXPECT_EQ((*overridden)->max_message_bytes(), 30000u);
}

// The records of a message whose delivery fails are counted.
TEST(KafkaProducerTest, TheRecordsOfFailedDeliveriesAreCounted) {
  KafkaProducerOptions options;
  options.brokers = kNoBroker;
  options.topic = "t";
  options.properties = {{"message.timeout.ms", "200"}};
  auto producer = KafkaProducer::Create(options);
  ASSERT_TRUE(producer.ok()) << producer.status();
  ASSERT_TRUE((*producer)->Publish("k", "a", 5).ok());
  ASSERT_TRUE((*producer)->Publish("k", "b", 6).ok());
  EXPECT_TRUE((*producer)->Flush(milliseconds(10'000)).ok());
  EXPECT_EQ((*producer)->failed(), 2u);
  EXPECT_EQ((*producer)->failed_records(), 11u);
  EXPECT_EQ((*producer)->oversized(), 0u);
}

TEST(ControlRequestProducerTest, SendsRequestsKeyedByJobToTheControlTopic) {
  auto broker = EmbeddedBroker::Start({"telemetry", 1, 1, /*changelog_topic=*/false, "control"});
  ASSERT_TRUE(broker.ok()) << broker.status();
  auto producer = ControlRequestProducer::Create(
      {(*broker)->bootstrap(), "control", std::chrono::seconds(10), {}});
  ASSERT_TRUE(producer.ok()) << producer.status();
  ASSERT_TRUE((*producer)->Send("job-1", "request").ok());
  EXPECT_THAT(ReadBack((*broker)->bootstrap(), "control", 1),
              ElementsAre(Pair("job-1", "request")));
}

TEST(ControlRequestProducerTest, ARequestNotTakenByItsDeadlineFails) {
  auto producer = ControlRequestProducer::Create({kNoBroker, "control", milliseconds(200), {}});
  ASSERT_TRUE(producer.ok()) << producer.status();
  ASSERT_TRUE((*producer)->Send("job-1", "request").ok());
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while ((*producer)->failed() == 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(50));
    (void)(*producer)->Send("job-1", "another");  // serves the delivery reports that are due
  }
  EXPECT_GE((*producer)->failed(), 1u);
}

TEST(ControlRequestProducerTest, NeverBlocksWhenItsQueueIsFull) {
  auto producer =
      ControlRequestProducer::Create({kNoBroker, "control", std::chrono::seconds(1), {}});
  ASSERT_TRUE(producer.ok()) << producer.status();
  for (int i = 0; i < ControlRequestProducer::kMaxQueued; ++i) {
    ASSERT_TRUE((*producer)->Send("job", "r").ok()) << i;
  }
  const absl::Status s = (*producer)->Send("job", "r");
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ((*producer)->dropped(), 1u);
}

TEST(ControlRequestProducerTest, RefusesADeadlineUnder1MsAndBadProperties) {
  EXPECT_EQ(
      ControlRequestProducer::Create({kNoBroker, "control", milliseconds(0), {}}).status().code(),
      absl::StatusCode::kInvalidArgument);
  auto bad = ControlRequestProducer::Create(
      {kNoBroker, "control", std::chrono::seconds(1), {{"no.such.property", "x"}}});
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("no.such.property=x"));
}

}  // namespace
}  // namespace rankwatch
