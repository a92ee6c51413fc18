#include "ingest/embedded_broker.h"

#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>

#include "wire/kafka_properties.h"

namespace rankwatch {

absl::StatusOr<std::unique_ptr<EmbeddedBroker>> EmbeddedBroker::Start(
    const EmbeddedBrokerOptions& options) {
  if (options.partitions < 1 || options.brokers < 1) {
    return absl::InvalidArgumentError("the broker needs at least one partition and one broker");
  }
  rd_kafka_conf_t* conf = rd_kafka_conf_new();
  RouteKafkaLogs(conf);
  char err[512];
  // The mock cluster needs a client handle to live in; it never connects anywhere.
  rd_kafka_t* rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof(err));
  if (rk == nullptr) {
    rd_kafka_conf_destroy(conf);
    return absl::InternalError(std::string("mock broker handle: ") + err);
  }
  rd_kafka_mock_cluster_t* cluster = rd_kafka_mock_cluster_new(rk, options.brokers);
  if (cluster == nullptr) {
    rd_kafka_destroy(rk);
    return absl::UnavailableError("could not start the mock Kafka cluster");
  }
  rd_kafka_resp_err_t e =
      rd_kafka_mock_topic_create(cluster, options.topic.c_str(), options.partitions, 1);
  if (e == RD_KAFKA_RESP_ERR_NO_ERROR && options.changelog_topic) {
    e = rd_kafka_mock_topic_create(cluster, (options.topic + ".changelog").c_str(),
                                   options.partitions, 1);
  }
  if (e == RD_KAFKA_RESP_ERR_NO_ERROR && !options.control_topic.empty()) {
    e = rd_kafka_mock_topic_create(cluster, options.control_topic.c_str(), 1, 1);
  }
  if (e != RD_KAFKA_RESP_ERR_NO_ERROR) {
    rd_kafka_mock_cluster_destroy(cluster);
    rd_kafka_destroy(rk);
    return absl::InternalError(std::string("create topic ") + options.topic + ": " +
                               rd_kafka_err2str(e));
  }
  return std::unique_ptr<EmbeddedBroker>(
      new EmbeddedBroker(rk, cluster, rd_kafka_mock_cluster_bootstraps(cluster)));
}

EmbeddedBroker::EmbeddedBroker(rd_kafka_t* rk, rd_kafka_mock_cluster_t* cluster,
                               std::string bootstrap)
    : rk_(rk), cluster_(cluster), bootstrap_(std::move(bootstrap)) {}

absl::Status EmbeddedBroker::SetDown() {
  const rd_kafka_resp_err_t e = rd_kafka_mock_broker_set_down(cluster_, -1);
  if (e != RD_KAFKA_RESP_ERR_NO_ERROR) {
    return absl::InternalError(std::string("mock broker down: ") + rd_kafka_err2str(e));
  }
  return absl::OkStatus();
}

absl::Status EmbeddedBroker::SetUp() {
  const rd_kafka_resp_err_t e = rd_kafka_mock_broker_set_up(cluster_, -1);
  if (e != RD_KAFKA_RESP_ERR_NO_ERROR) {
    return absl::InternalError(std::string("mock broker up: ") + rd_kafka_err2str(e));
  }
  return absl::OkStatus();
}

EmbeddedBroker::~EmbeddedBroker() {
  rd_kafka_mock_cluster_destroy(cluster_);
  rd_kafka_destroy(rk_);
}

}  // namespace rankwatch
