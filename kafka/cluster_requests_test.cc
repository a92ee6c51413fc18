#include "kafka/cluster_requests.h"

#include <gtest/gtest.h>

#include <chrono>

#include "kafka/client_factory.h"
#include "kafka/embedded_broker.h"
#include "kafka/kafka_producer.h"

namespace rankwatch {
namespace {

using std::chrono::milliseconds;

class ClusterRequestsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto broker = EmbeddedBroker::Start({"telemetry", 3, 1, /*changelog_topic=*/false, ""});
    ASSERT_TRUE(broker.ok()) << broker.status();
    broker_ = std::move(*broker);
    KafkaClientConfig config;
    config.type = RD_KAFKA_CONSUMER;
    config.defaults = {{"bootstrap.servers", broker_->bootstrap()},
                       {"group.id", "cluster-requests-test"},
                       {"allow.auto.create.topics", "false"}};
    auto client = NewKafkaClient(config);
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = std::move(*client);
  }

  std::unique_ptr<EmbeddedBroker> broker_;
  KafkaClient client_;
};

TEST(ClusterIdTest, TheMockClusterIsTheDevelopmentBroker) {
  EXPECT_TRUE(IsDevelopmentClusterId("mockCluster1a2b"));
  EXPECT_FALSE(IsDevelopmentClusterId("lkc-1a2b"));
  EXPECT_FALSE(IsDevelopmentClusterId(""));
}

TEST(ClusterIdTest, NoBrokerIsUnavailableNamingTheBrokers) {
  auto id = QueryKafkaClusterId("127.0.0.1:1", {}, milliseconds(300));
  ASSERT_FALSE(id.ok());
  EXPECT_EQ(id.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(id.status().message(), "no Kafka broker at 127.0.0.1:1 answered within 300 ms");
}

TEST(ClusterIdTest, ABadPropertyIsInvalidArgument) {
  auto id = QueryKafkaClusterId("127.0.0.1:1", {{"security.protocol", "carrier-pigeon"}},
                                milliseconds(300));
  ASSERT_FALSE(id.ok());
  EXPECT_EQ(id.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(id.status().message().find("kafka property security.protocol=carrier-pigeon: "), 0u)
      << id.status();
}

TEST_F(ClusterRequestsTest, ClusterIdOfTheEmbeddedBroker) {
  auto id = QueryKafkaClusterId(broker_->bootstrap(), {}, milliseconds(10'000));
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_TRUE(IsDevelopmentClusterId(*id)) << *id;
  auto same = QueryClusterId(client_.get(), milliseconds(10'000));
  ASSERT_TRUE(same.ok()) << same.status();
  EXPECT_EQ(*same, *id);
}

TEST_F(ClusterRequestsTest, PartitionCountOfPresentAndMissingTopics) {
  auto count =
      QueryPartitionCount(client_.get(), "telemetry", MetadataScope::kTopic, milliseconds(10'000));
  ASSERT_TRUE(count.ok()) << count.status();
  EXPECT_EQ(*count, 3);
  count = QueryPartitionCount(client_.get(), "missing", MetadataScope::kAllTopics,
                              milliseconds(10'000));
  ASSERT_TRUE(count.ok()) << count.status();
  EXPECT_EQ(*count, -1);
  // Asking about every topic created none.
  EXPECT_EQ(*QueryPartitionCount(client_.get(), "missing", MetadataScope::kAllTopics,
                                 milliseconds(10'000)),
            -1);
}

TEST_F(ClusterRequestsTest, WatermarksFollowWhatIsProduced) {
  auto empty = QueryWatermarks(client_.get(), "telemetry", 0, milliseconds(10'000));
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ(empty->low, 0);
  EXPECT_EQ(empty->high, 0);
  EXPECT_FALSE(CachedWatermarks(client_.get(), "telemetry", 0).has_value());  // nothing fetched

  KafkaProducerOptions options;
  options.brokers = broker_->bootstrap();
  options.topic = "telemetry";
  auto producer = KafkaProducer::Create(options);
  ASSERT_TRUE(producer.ok()) << producer.status();
  for (int i = 0; i < 5; ++i) ASSERT_TRUE((*producer)->Publish("one-key", "batch").ok());
  ASSERT_TRUE((*producer)->Flush(milliseconds(10'000)).ok());
  int64_t total = 0;
  for (int32_t p = 0; p < 3; ++p) {
    auto w = QueryWatermarks(client_.get(), "telemetry", p, milliseconds(10'000));
    ASSERT_TRUE(w.ok()) << w.status();
    EXPECT_EQ(w->low, 0);
    EXPECT_TRUE(w->high == 0 || w->high == 5) << "one key: one partition";
    total += w->high;
  }
  EXPECT_EQ(total, 5);
}

TEST_F(ClusterRequestsTest, WatermarksOfAPartitionThatDoesNotExist) {
  auto w = QueryWatermarks(client_.get(), "telemetry", 7, milliseconds(2'000));
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), absl::StatusCode::kUnavailable);
}

// (The mock cluster does not implement CreateTopics: creation itself is exercised only against
// a Kafka cluster.)
TEST_F(ClusterRequestsTest, ATopicNotCreatedInTimeNamesItsSettings) {
  ASSERT_TRUE(broker_->SetDown().ok());
  KafkaClientConfig config;
  config.defaults = {{"bootstrap.servers", broker_->bootstrap()}};
  auto admin = NewKafkaClient(config);
  ASSERT_TRUE(admin.ok()) << admin.status();
  const absl::Status created =
      CreateTopic(admin->get(), "late", 2, {{"cleanup.policy", "compact"}}, milliseconds(300));
  EXPECT_EQ(created.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(created.message(),
            "the broker did not create topic late within 300 ms; create it with 2 partitions and "
            "cleanup.policy=compact");
}

}  // namespace
}  // namespace rankwatch
