#include "kafka/embedded_broker.h"

#include <gtest/gtest.h>

#include <chrono>

#include "kafka/client_factory.h"
#include "kafka/cluster_requests.h"

namespace rankwatch {
namespace {

using std::chrono::milliseconds;

KafkaClient Client(const std::string& brokers) {
  KafkaClientConfig config;
  config.defaults = {{"bootstrap.servers", brokers}};
  auto client = NewKafkaClient(config);
  EXPECT_TRUE(client.ok()) << client.status();
  return client.ok() ? std::move(*client) : nullptr;
}

TEST(EmbeddedBrokerTest, RefusesNoPartitionsOrNoBrokers) {
  EXPECT_EQ(EmbeddedBroker::Start({"t", 0, 1}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(EmbeddedBroker::Start({"t", 1, 0}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(EmbeddedBrokerTest, CreatesTheTelemetryChangelogAndControlTopics) {
  auto broker = EmbeddedBroker::Start({"telemetry", 3, 1, /*changelog_topic=*/true, "control"});
  ASSERT_TRUE(broker.ok()) << broker.status();
  EXPECT_TRUE((*broker)->bootstrap().starts_with("127.0.0.1:"));
  KafkaClient client = Client((*broker)->bootstrap());
  const auto count = [&](const std::string& topic) {
    auto n =
        QueryPartitionCount(client.get(), topic, MetadataScope::kAllTopics, milliseconds(5000));
    EXPECT_TRUE(n.ok()) << n.status();
    return n.ok() ? *n : -2;
  };
  EXPECT_EQ(count("telemetry"), 3);
  EXPECT_EQ(count("telemetry.changelog"), 3);
  EXPECT_EQ(count("control"), 1);
  EXPECT_EQ(count("other"), -1);
}

TEST(EmbeddedBrokerTest, CreatesOnlyTheTopicsAskedFor) {
  auto broker = EmbeddedBroker::Start({"telemetry", 2, 1, /*changelog_topic=*/false, ""});
  ASSERT_TRUE(broker.ok()) << broker.status();
  KafkaClient client = Client((*broker)->bootstrap());
  auto changelog = QueryPartitionCount(client.get(), "telemetry.changelog",
                                       MetadataScope::kAllTopics, milliseconds(5000));
  ASSERT_TRUE(changelog.ok()) << changelog.status();
  EXPECT_EQ(*changelog, -1);
  EXPECT_EQ(*QueryPartitionCount(client.get(), "rankwatch.control", MetadataScope::kAllTopics,
                                 milliseconds(5000)),
            -1);
}

TEST(EmbeddedBrokerTest, DownRefusesClientsAndUpAcceptsThemAgain) {
  auto broker = EmbeddedBroker::Start({"telemetry", 1, 1, /*changelog_topic=*/false, ""});
  ASSERT_TRUE(broker.ok()) << broker.status();
  ASSERT_TRUE((*broker)->SetDown().ok());
  {
    KafkaClient client = Client((*broker)->bootstrap());
    EXPECT_FALSE(QueryClusterId(client.get(), milliseconds(500)).ok());
  }
  ASSERT_TRUE((*broker)->SetUp().ok());
  KafkaClient client = Client((*broker)->bootstrap());
  auto id = QueryClusterId(client.get(), milliseconds(10'000));
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_TRUE(IsDevelopmentClusterId(*id)) << *id;
}

}  // namespace
}  // namespace rankwatch
