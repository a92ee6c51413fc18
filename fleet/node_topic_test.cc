#include "fleet/node_topic.h"

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <thread>

#include "kafka/client_factory.h"
#include "kafka/embedded_broker.h"
#include "kafka/kafka_producer.h"
#include "librdkafka/rdkafka_mock.h"

namespace rankwatch {
namespace {

constexpr int64_t kT0 = int64_t{1'800'000'000} * 1'000'000'000;

NodeCharge MakeCharge(const std::string& job, const std::string& node, double lost, int64_t at) {
  NodeCharge c;
  c.training_job = job;
  c.node = node;
  c.episodes = 1;
  c.lost_rank_seconds = lost;
  c.first_unix_ns = at;
  c.last_unix_ns = at;
  c.firing = true;
  return c;
}

bool WaitFor(const std::function<bool()>& done,
             std::chrono::seconds limit = std::chrono::seconds(15)) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return done();
}

uint32_t JobsOn(const NodeLedger& l, const std::string& node) {
  v1::ListNodesRequest q;
  q.set_node(node);
  const v1::ListNodesResponse r = l.ListNodes(q, kT0 + 1'000'000'000);
  return r.nodes_size() == 1 ? r.nodes(0).jobs() : 0;
}

class NodeTopicTest : public ::testing::Test {
 protected:
  void SetUp() override {
    EmbeddedBrokerOptions o;
    o.topic = "telemetry";
    o.partitions = 4;
    o.nodes_topic = "nodes";
    auto broker = EmbeddedBroker::Start(o);
    ASSERT_TRUE(broker.ok()) << broker.status();
    broker_ = std::move(*broker);
  }
  std::unique_ptr<NodeTopic> Open(NodeLedger* ledger) {
    auto t = NodeTopic::Open({broker_->bootstrap(), "nodes", {}, "telemetry"}, ledger);
    EXPECT_TRUE(t.ok()) << t.status();
    return t.ok() ? std::move(*t) : nullptr;
  }
  std::unique_ptr<EmbeddedBroker> broker_;
};

TEST_F(NodeTopicTest, InstancesShareTheirJobsChargesAndALateInstanceReadsThemAll) {
  NodeLedger a({}), b({});
  auto ta = Open(&a);
  auto tb = Open(&b);
  ASSERT_NE(ta, nullptr);
  ASSERT_NE(tb, nullptr);
  EXPECT_EQ(ta->telemetry_partitions(), 4);
  ASSERT_TRUE(WaitFor([&] { return a.complete() && b.complete(); }));  // an empty topic

  a.Charge({MakeCharge("job-a", "gpu-1", 100, kT0)});
  b.Charge({MakeCharge("job-b", "gpu-1", 50, kT0), MakeCharge("job-b", "gpu-2", 5, kT0)});
  ta->Publish(a.TakeUnpublished());
  tb->Publish(b.TakeUnpublished());
  ASSERT_TRUE(WaitFor([&] { return JobsOn(a, "gpu-1") == 2 && JobsOn(b, "gpu-1") == 2; }))
      << JobsOn(a, "gpu-1") << " " << JobsOn(b, "gpu-1");
  EXPECT_EQ(JobsOn(a, "gpu-2"), 1u);
  // Reading its own records back changes nothing and publishes nothing again.
  EXPECT_TRUE(a.TakeUnpublished().empty());
  ASSERT_TRUE(WaitFor([&] { return ta->published() == 1 && tb->published() == 2; }));

  // A newer total replaces the older one everywhere.
  a.Charge({MakeCharge("job-a", "gpu-1", 300, kT0 + 5)});
  ta->Publish(a.TakeUnpublished());
  auto lost_on = [](const NodeLedger& l) {
    v1::ListNodesRequest q;
    q.set_node("gpu-1");
    return l.ListNodes(q, kT0 + 1'000'000'000).nodes(0).lost_rank_seconds();
  };
  ASSERT_TRUE(WaitFor([&] { return lost_on(b) == 350; })) << lost_on(b);

  // An instance that starts later reads the topic from its start, and is complete at its end.
  NodeLedger c({});
  auto tc = Open(&c);
  ASSERT_NE(tc, nullptr);
  ASSERT_TRUE(WaitFor([&] { return c.complete(); }));
  EXPECT_EQ(JobsOn(c, "gpu-1"), 2u);
  EXPECT_EQ(lost_on(c), 350);
  EXPECT_EQ(tc->read(), 4u);
  EXPECT_TRUE(c.TakeUnpublished().empty());  // not its charges
}

TEST_F(NodeTopicTest, RecordsThatAreNotNodeRecordsAreCountedAndIgnored) {
  auto producer = KafkaProducer::Create({broker_->bootstrap(), "nodes"});
  ASSERT_TRUE(producer.ok()) << producer.status();
  ASSERT_TRUE((*producer)->Publish("k", "\xff\xff not a record").ok());
  v1::NodeRecord no_job;
  no_job.set_node("gpu-1");
  ASSERT_TRUE((*producer)->Publish("k2", no_job.SerializeAsString()).ok());
  ASSERT_TRUE((*producer)->Flush(std::chrono::seconds(10)).ok());
  NodeLedger l({});
  auto t = Open(&l);
  ASSERT_NE(t, nullptr);
  ASSERT_TRUE(WaitFor([&] { return l.complete(); }));
  EXPECT_EQ(t->read(), 2u);
  EXPECT_EQ(t->ignored(), 2u);
  EXPECT_EQ(l.records(), 0u);
}

// A development broker of the test's own, whose produce requests can be made to fail.
class NodeTopicDeliveryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    KafkaClientConfig config;
    config.type = RD_KAFKA_PRODUCER;
    config.name = "mock broker handle";
    auto host = NewKafkaClient(config);
    ASSERT_TRUE(host.ok()) << host.status();
    host_ = std::move(*host);
    cluster_.reset(rd_kafka_mock_cluster_new(host_.get(), 1));
    ASSERT_NE(cluster_, nullptr);
    ASSERT_EQ(rd_kafka_mock_topic_create(cluster_.get(), "nodes", 1, 1),
              RD_KAFKA_RESP_ERR_NO_ERROR);
  }
  std::unique_ptr<NodeTopic> Open(NodeLedger* ledger, int max_attempts = 10) {
    NodeTopicOptions o{rd_kafka_mock_cluster_bootstraps(cluster_.get()), "nodes", {}, ""};
    o.first_retry_backoff = std::chrono::milliseconds(50);
    o.max_retry_backoff = std::chrono::milliseconds(200);
    o.max_delivery_attempts = max_attempts;
    auto t = NodeTopic::Open(o, ledger);
    EXPECT_TRUE(t.ok()) << t.status();
    return t.ok() ? std::move(*t) : nullptr;
  }
  // The next `n` produce requests to the broker fail for good (not retried by the producer).
  void FailProduces(int n) {
    std::vector<rd_kafka_resp_err_t> errors(n, RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED);
    rd_kafka_mock_push_request_errors_array(cluster_.get(), 0 /* Produce */, errors.size(),
                                            errors.data());
  }
  KafkaClient host_;
  KafkaMockCluster cluster_;
};

TEST_F(NodeTopicDeliveryTest, AChargeWhoseDeliveryFailedIsRetriedUntilItArrives) {
  NodeLedger a({}), b({});
  auto ta = Open(&a);
  auto tb = Open(&b);
  ASSERT_NE(ta, nullptr);
  ASSERT_NE(tb, nullptr);
  ASSERT_TRUE(WaitFor([&] { return a.complete() && b.complete(); }));
  FailProduces(2);
  a.Charge({MakeCharge("job-a", "gpu-1", 100, kT0)});
  ta->Publish(a.TakeUnpublished());
  EXPECT_EQ(a.undelivered(), 1u);
  ASSERT_TRUE(WaitFor([&] { return JobsOn(b, "gpu-1") == 1; })) << "never delivered";
  EXPECT_GE(ta->retried(), 2u);  // the producer may fail more attempts locally meanwhile
  EXPECT_EQ(ta->failed(), 0u);
  ASSERT_TRUE(WaitFor([&] { return a.undelivered() == 0 && ta->undelivered() == 0; }));
  EXPECT_EQ(ta->published(), 1u);
}

TEST_F(NodeTopicDeliveryTest, ANewerChargeOfTheKeyReplacesAFailedOne) {
  NodeLedger a({}), b({});
  auto ta = Open(&a);
  auto tb = Open(&b);
  ASSERT_NE(ta, nullptr);
  ASSERT_NE(tb, nullptr);
  ASSERT_TRUE(WaitFor([&] { return a.complete() && b.complete(); }));
  FailProduces(1);
  a.Charge({MakeCharge("job-a", "gpu-1", 100, kT0)});
  ta->Publish(a.TakeUnpublished());
  a.Charge({MakeCharge("job-a", "gpu-1", 300, kT0 + 5)});
  ta->Publish(a.TakeUnpublished());
  auto lost_on = [](const NodeLedger& l) {
    v1::ListNodesRequest q;
    q.set_node("gpu-1");
    const v1::ListNodesResponse r = l.ListNodes(q, kT0 + 1'000'000'000);
    return r.nodes_size() == 1 ? r.nodes(0).lost_rank_seconds() : 0.0;
  };
  ASSERT_TRUE(WaitFor([&] { return lost_on(b) == 300; })) << lost_on(b);
  ASSERT_TRUE(WaitFor([&] { return a.undelivered() == 0 && ta->undelivered() == 0; }));
  // The first one was not produced again after the newer one: the topic ends with the newest.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(lost_on(b), 300);
  NodeLedger c({});
  auto tc = Open(&c);
  ASSERT_NE(tc, nullptr);
  ASSERT_TRUE(WaitFor([&] { return c.complete(); }));
  EXPECT_EQ(lost_on(c), 300);
}

TEST_F(NodeTopicDeliveryTest, AChargeGivenUpStaysInTheOutboxForTheNextRestart) {
  NodeLedger a({});
  auto ta = Open(&a, /*max_attempts=*/2);
  ASSERT_NE(ta, nullptr);
  ASSERT_TRUE(WaitFor([&] { return a.complete(); }));
  FailProduces(5);
  a.Charge({MakeCharge("job-a", "gpu-1", 100, kT0)});
  ta->Publish(a.TakeUnpublished());
  ASSERT_TRUE(WaitFor([&] { return ta->failed() == 1; })) << ta->retried();
  EXPECT_EQ(ta->retried(), 1u);
  EXPECT_EQ(ta->undelivered(), 0u);
  EXPECT_EQ(a.undelivered(), 1u) << "kept for the next restart";
}

TEST_F(NodeTopicTest, AMissingTopicThatCannotBeCreatedIsAClearError) {
  // The development broker cannot create topics on request.
  NodeLedger l({});
  NodeTopicOptions o{broker_->bootstrap(), "no-such-nodes-topic", {}, "telemetry"};
  o.request_timeout = std::chrono::seconds(2);
  auto t = NodeTopic::Open(o, &l);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(std::string(t.status().message()).find("nodes topic"), std::string::npos) << t.status();
}

}  // namespace
}  // namespace rankwatch
