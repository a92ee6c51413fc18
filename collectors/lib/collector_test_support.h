// Test support for the collector library's tests (collector_test, collector_ops_test,
// collector_size_test): a one-broker librdkafka mock cluster that reads the telemetry topic
// back, and a test identity.
//
// Test-only; not thread-safe.
#pragma once

#include <gtest/gtest.h>

#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>
#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "collectors/lib/collector.h"

namespace rankwatch {

inline constexpr char kTopic[] = "rankwatch.telemetry";

// A one-broker mock cluster and a consumer reading the topic from the beginning.
class MockKafka {
 public:
  MockKafka() {
    rd_kafka_conf_t* conf = rd_kafka_conf_new();
    char err[256];
    rd_kafka_conf_set(conf, "log_level", "0", err, sizeof(err));
    mock_rk_ = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof(err));
    cluster_ = rd_kafka_mock_cluster_new(mock_rk_, 1);
    rd_kafka_mock_topic_create(cluster_, kTopic, 1, 1);
    rd_kafka_mock_topic_create(cluster_, "rankwatch.control", 1, 1);
    bootstrap_ = rd_kafka_mock_cluster_bootstraps(cluster_);
  }
  ~MockKafka() {
    if (consumer_ != nullptr) {
      rd_kafka_consumer_close(consumer_);
      rd_kafka_destroy(consumer_);
    }
    rd_kafka_mock_cluster_destroy(cluster_);
    rd_kafka_destroy(mock_rk_);
  }
  const std::string& bootstrap() const { return bootstrap_; }
  void SetDown(bool down) {
    if (down) {
      rd_kafka_mock_broker_set_down(cluster_, 1);
    } else {
      rd_kafka_mock_broker_set_up(cluster_, 1);
    }
  }

  // The broker answers the next `count` InitProducerId requests (an idempotent producer's
  // first) with CLUSTER_AUTHORIZATION_FAILED: each producer that gets one is in a fatal state.
  void FailProducerIds(size_t count) {
    constexpr int16_t kInitProducerId = 22;
    std::vector<rd_kafka_resp_err_t> errors(count, RD_KAFKA_RESP_ERR_CLUSTER_AUTHORIZATION_FAILED);
    rd_kafka_mock_push_request_errors_array(cluster_, kInitProducerId, errors.size(),
                                            errors.data());
  }

  // Produces `request` on the control topic, keyed by its job, and waits for the broker.
  void SendControl(const v1::ControlRequest& request) {
    const std::string bytes = request.SerializeAsString();
    rd_kafka_conf_t* conf = rd_kafka_conf_new();
    char err[256];
    rd_kafka_conf_set(conf, "bootstrap.servers", bootstrap_.c_str(), err, sizeof(err));
    rd_kafka_t* producer = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof(err));
    const std::string& key = request.training_job();
    ASSERT_EQ(rd_kafka_producev(producer, RD_KAFKA_V_TOPIC("rankwatch.control"),
                                RD_KAFKA_V_KEY(key.data(), key.size()),
                                RD_KAFKA_V_VALUE(const_cast<char*>(bytes.data()), bytes.size()),
                                RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_END),
              RD_KAFKA_RESP_ERR_NO_ERROR);
    ASSERT_EQ(rd_kafka_flush(producer, 10000), RD_KAFKA_RESP_ERR_NO_ERROR);
    rd_kafka_destroy(producer);
  }

  // One message of the topic: its key's and value's bytes, and the batch it holds.
  struct Message {
    size_t key_bytes = 0, value_bytes = 0;
    v1::Batch batch;
  };

  // Every batch on the topic that arrives within `timeout` after the last one.
  std::vector<v1::Batch> ReadAll(std::chrono::milliseconds timeout) {
    std::vector<v1::Batch> out;
    for (Message& m : ReadAllMessages(timeout)) out.push_back(std::move(m.batch));
    return out;
  }

  // ReadAll, with each message's sizes.
  std::vector<Message> ReadAllMessages(std::chrono::milliseconds timeout) {
    if (consumer_ == nullptr) StartConsumer();
    std::vector<Message> out;
    // The first message also waits for the consumer to join its group, which takes seconds
    // on a loaded machine; after it, `timeout` of silence ends the read.
    auto deadline = std::chrono::steady_clock::now() +
                    std::max<std::chrono::milliseconds>(timeout, std::chrono::seconds(15));
    while (std::chrono::steady_clock::now() < deadline) {
      rd_kafka_message_t* m = rd_kafka_consumer_poll(consumer_, 100);
      if (m == nullptr) continue;
      if (m->err == RD_KAFKA_RESP_ERR_NO_ERROR) {
        Message& got = out.emplace_back();
        got.key_bytes = m->key_len;
        got.value_bytes = m->len;
        EXPECT_TRUE(got.batch.ParseFromArray(m->payload, static_cast<int>(m->len)));
        deadline = std::chrono::steady_clock::now() + timeout;
      }
      rd_kafka_message_destroy(m);
    }
    return out;
  }

 private:
  void StartConsumer() {
    rd_kafka_conf_t* conf = rd_kafka_conf_new();
    char err[256];
    rd_kafka_conf_set(conf, "bootstrap.servers", bootstrap_.c_str(), err, sizeof(err));
    rd_kafka_conf_set(conf, "group.id", "collector-test", err, sizeof(err));
    rd_kafka_conf_set(conf, "log_level", "0", err, sizeof(err));
    consumer_ = rd_kafka_new(RD_KAFKA_CONSUMER, conf, err, sizeof(err));
    rd_kafka_topic_partition_list_t* parts = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(parts, kTopic, 0)->offset = RD_KAFKA_OFFSET_BEGINNING;
    rd_kafka_assign(consumer_, parts);
    rd_kafka_topic_partition_list_destroy(parts);
  }

  rd_kafka_t* mock_rk_ = nullptr;
  rd_kafka_mock_cluster_t* cluster_ = nullptr;
  rd_kafka_t* consumer_ = nullptr;
  std::string bootstrap_;
};

inline CollectorIdentity Identity() {
  CollectorIdentity id;
  id.training_job = "job-a";
  id.rank = 2;
  id.world_size = 4;
  id.node = "host-1";
  id.local_rank = 2;
  id.device = "cpu";
  return id;
}

inline std::vector<v1::StepRecord> Steps(const std::vector<v1::Batch>& batches) {
  std::vector<v1::StepRecord> steps;
  for (const v1::Batch& b : batches) {
    for (const v1::StepRecord& s : b.steps()) steps.push_back(s);
  }
  return steps;
}

}  // namespace rankwatch
