#include "kafka/embedded_broker.h"

#include "kafka/client_factory.h"

namespace rankwatch {

absl::StatusOr<std::unique_ptr<EmbeddedBroker>> EmbeddedBroker::Start(
    const EmbeddedBrokerOptions& options) {
  if (options.partitions < 1 || options.brokers < 1) {
    return absl::InvalidArgumentError("the broker needs at least one partition and one broker");
  }
  // The mock cluster needs a client handle to live in; it never connects anywhere.
  KafkaClientConfig config;
  config.type = RD_KAFKA_PRODUCER;
  config.name = "mock broker handle";
  auto host = NewKafkaClient(config);
  if (!host.ok()) return absl::InternalError(host.status().message());
  KafkaMockCluster cluster(rd_kafka_mock_cluster_new(host->get(), options.brokers));
  if (cluster == nullptr) return absl::UnavailableError("could not start the mock Kafka cluster");
  rd_kafka_resp_err_t e =
      rd_kafka_mock_topic_create(cluster.get(), options.topic.c_str(), options.partitions, 1);
  if (e == RD_KAFKA_RESP_ERR_NO_ERROR && options.changelog_topic) {
    e = rd_kafka_mock_topic_create(cluster.get(), (options.topic + ".changelog").c_str(),
                                   options.partitions, 1);
  }
  if (e == RD_KAFKA_RESP_ERR_NO_ERROR && !options.control_topic.empty()) {
    e = rd_kafka_mock_topic_create(cluster.get(), options.control_topic.c_str(), 1, 1);
  }
  if (e == RD_KAFKA_RESP_ERR_NO_ERROR && !options.nodes_topic.empty()) {
    e = rd_kafka_mock_topic_create(cluster.get(), options.nodes_topic.c_str(), 1, 1);
  }
  if (e != RD_KAFKA_RESP_ERR_NO_ERROR) {
    return absl::InternalError(std::string("create topic ") + options.topic + ": " +
                               rd_kafka_err2str(e));
  }
  return std::unique_ptr<EmbeddedBroker>(new EmbeddedBroker(std::move(*host), std::move(cluster)));
}

EmbeddedBroker::EmbeddedBroker(KafkaClient host, KafkaMockCluster cluster)
    : host_(std::move(host)),
      cluster_(std::move(cluster)),
      bootstrap_(rd_kafka_mock_cluster_bootstraps(cluster_.get())) {}

absl::Status EmbeddedBroker::SetDown() {
  const rd_kafka_resp_err_t e = rd_kafka_mock_broker_set_down(cluster_.get(), -1);
  if (e != RD_KAFKA_RESP_ERR_NO_ERROR) {
    return absl::InternalError(std::string("mock broker down: ") + rd_kafka_err2str(e));
  }
  return absl::OkStatus();
}

absl::Status EmbeddedBroker::SetUp() {
  const rd_kafka_resp_err_t e = rd_kafka_mock_broker_set_up(cluster_.get(), -1);
  if (e != RD_KAFKA_RESP_ERR_NO_ERROR) {
    return absl::InternalError(std::string("mock broker up: ") + rd_kafka_err2str(e));
  }
  return absl::OkStatus();
}

}  // namespace rankwatch
