#include "kafka/client_factory.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>

namespace rankwatch {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

// A port nothing listens on.
constexpr char kNoBroker[] = "127.0.0.1:1";

std::string Property(rd_kafka_t* client, const char* key) {
  char value[256];
  size_t size = sizeof(value);
  if (rd_kafka_conf_get(rd_kafka_conf(client), key, value, &size) != RD_KAFKA_CONF_OK) return "?";
  return value;
}

TEST(ClientFactoryTest, AnUnknownPropertyIsAnErrorNamingIt) {
  KafkaClientConfig config;
  config.defaults = {{"bootstrap.servers", kNoBroker}};
  config.overrides = {{"no.such.property", "1"}};
  auto client = NewKafkaClient(config);
  ASSERT_FALSE(client.ok());
  EXPECT_EQ(client.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(client.status().message()),
              StartsWith("kafka property no.such.property=1: "));
  EXPECT_THAT(std::string(client.status().message()), HasSubstr("No such configuration property"));
}

TEST(ClientFactoryTest, ABadValueIsAnErrorNamingPropertyAndValue) {
  KafkaClientConfig config;
  config.defaults = {{"compression.codec", "brotli"}};
  auto client = NewKafkaClient(config);
  ASSERT_FALSE(client.ok());
  EXPECT_EQ(client.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(client.status().message()),
              StartsWith("kafka property compression.codec=brotli: "));
}

TEST(ClientFactoryTest, PropertiesRefusedTogetherNameTheClient) {
  KafkaClientConfig config;
  config.type = RD_KAFKA_PRODUCER;
  config.name = "test producer";
  config.defaults = {{"bootstrap.servers", kNoBroker}, {"enable.idempotence", "true"}};
  config.overrides = {{"acks", "1"}};
  auto client = NewKafkaClient(config);
  ASSERT_FALSE(client.ok());
  EXPECT_EQ(client.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(client.status().message()), StartsWith("test producer: "));
  EXPECT_THAT(std::string(client.status().message()), HasSubstr("acks"));
}

TEST(ClientFactoryTest, OverridesWinOverDefaults) {
  KafkaClientConfig config;
  config.type = RD_KAFKA_CONSUMER;
  config.defaults = {{"bootstrap.servers", kNoBroker},
                     {"group.id", "factory-test"},
                     {"client.id", "default-id"},
                     {"fetch.wait.max.ms", "10"}};
  config.overrides = {{"client.id", "user-id"}};
  auto client = NewKafkaClient(config);
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_EQ(Property(client->get(), "client.id"), "user-id");
  EXPECT_EQ(Property(client->get(), "fetch.wait.max.ms"), "10");
  EXPECT_EQ(rd_kafka_type(client->get()), RD_KAFKA_CONSUMER);
}

struct Reports {
  std::atomic<int> delivered{0};
  std::atomic<int> failed{0};
};

void CountReport(rd_kafka_t*, const rd_kafka_message_t* m, void* opaque) {
  auto* reports = static_cast<Reports*>(opaque);
  ++(m->err == RD_KAFKA_RESP_ERR_NO_ERROR ? reports->delivered : reports->failed);
}

TEST(ClientFactoryTest, DeliveryReportsReachTheCallbackWithTheOpaque) {
  Reports reports;
  KafkaClientConfig config;
  config.defaults = {{"bootstrap.servers", kNoBroker}, {"message.timeout.ms", "100"}};
  config.opaque = &reports;
  config.on_delivery = &CountReport;
  auto client = NewKafkaClient(config);
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_EQ(rd_kafka_opaque(client->get()), &reports);
  ASSERT_EQ(rd_kafka_producev(client->get(), RD_KAFKA_V_TOPIC("t"),
                              RD_KAFKA_V_VALUE(const_cast<char*>("x"), 1),
                              RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_END),
            RD_KAFKA_RESP_ERR_NO_ERROR);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (reports.failed == 0 && std::chrono::steady_clock::now() < deadline) {
    rd_kafka_poll(client->get(), 50);
  }
  EXPECT_EQ(reports.failed, 1);  // nothing answers: the message times out
  EXPECT_EQ(reports.delivered, 0);
}

TEST(ClientFactoryTest, HandlesFreeWhatTheyOwn) {
  // Run under the sanitizer build (scripts/test.sh --sanitize=address,undefined): LeakSanitizer
  // fails the test if any of these is not freed.
  KafkaPartitionList list(rd_kafka_topic_partition_list_new(2));
  rd_kafka_topic_partition_list_add(list.get(), "t", 0);
  KafkaConf conf(rd_kafka_conf_new());
  KafkaClientConfig config;
  config.defaults = {{"bootstrap.servers", kNoBroker}};
  auto client = NewKafkaClient(config);
  ASSERT_TRUE(client.ok()) << client.status();
  KafkaQueue queue(rd_kafka_queue_new(client->get()));
  KafkaTopic topic(rd_kafka_topic_new(client->get(), "t", nullptr));
  EXPECT_NE(queue, nullptr);
  EXPECT_NE(topic, nullptr);
  EXPECT_EQ(list->cnt, 1);
}

}  // namespace
}  // namespace rankwatch
