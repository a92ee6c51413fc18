// KafkaConsumer: a consumer-group member on the telemetry topic (librdkafka).
//
// Kafka's group protocol distributes partitions across daemon instances; this class only
// joins the group and hands out messages. Offsets are committed automatically for now (the
// durable offset store replaces that with offsets-in-state).
//
// Not thread-safe: owned by the ingest thread.
#pragma once

#include <librdkafka/rdkafka.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "ingest/kafka_config.h"

namespace rankwatch {

struct KafkaConsumerOptions {
  std::string brokers;                        // bootstrap list "host:port,..." (required)
  std::string topic = "rankwatch.telemetry";  // default: rankwatch.telemetry
  std::string group = "rankwatch";            // default: rankwatch
  KafkaProperties properties;                 // passed through to librdkafka
  // Where to start reading a newly assigned partition: the next offset stored with the
  // daemon's state, or nullopt for Kafka's committed offset (then auto.offset.reset).
  std::function<std::optional<int64_t>(const std::string& topic, int32_t partition)>
      initial_offset;
};

struct KafkaMessage {
  std::string_view payload;
  std::string_view key;
  int32_t partition = 0;
  int64_t offset = 0;
};

class KafkaConsumer {
 public:
  static absl::StatusOr<std::unique_ptr<KafkaConsumer>> Create(
      const KafkaConsumerOptions& options);
  ~KafkaConsumer();
  KafkaConsumer(const KafkaConsumer&) = delete;
  KafkaConsumer& operator=(const KafkaConsumer&) = delete;

  // Waits up to `timeout` for up to `max_messages` messages and calls `on_message` for each,
  // in partition order. Consumer errors are logged, not returned. Returns messages handled.
  size_t Poll(std::chrono::milliseconds timeout, size_t max_messages,
              const std::function<void(const KafkaMessage&)>& on_message);

  // Leaves the group (commits final offsets). Idempotent; the destructor calls it.
  void Close();

  // Partitions currently assigned to this member by the group (0 until the first join).
  int assigned_partitions() const { return assigned_partitions_; }

 private:
  explicit KafkaConsumer(rd_kafka_t* rk);
  static void OnRebalance(rd_kafka_t* rk, rd_kafka_resp_err_t err,
                          rd_kafka_topic_partition_list_t* partitions, void* opaque);

  rd_kafka_t* rk_;
  rd_kafka_queue_t* queue_;
  bool closed_ = false;
  int assigned_partitions_ = 0;  // written by OnRebalance, which runs inside Poll
  std::function<std::optional<int64_t>(const std::string&, int32_t)> initial_offset_;
};

}  // namespace rankwatch
