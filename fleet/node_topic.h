// NodeTopic: the nodes topic, through which every instance of a scaled-out rankwatchd shares the
// fleet view of nodes (fleet/node_ledger.h) — as a Kafka Streams global table: each instance
// publishes the records of the jobs it owns, keyed "node \0 job", and reads every partition of
// the topic from its oldest record on, applying each record to its own NodeLedger. Records are
// totals (the newest wins), so reading one twice, late or out of order changes nothing; the
// topic is created compacted (one record per key survives), and each instance also keeps the
// view in its state store, so a broker that deleted old records (librdkafka's development broker
// keeps 5 MiB per partition) loses only what no instance had read.
//
// Thread-safe: Publish from one thread (the ingest thread); the reader runs on its own thread,
// and serves the publisher's delivery reports.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "fleet/node_ledger.h"
#include "kafka/handles.h"
#include "kafka/kafka_properties.h"

namespace rankwatch {

struct NodeTopicOptions {
  std::string brokers;         // bootstrap list (required)
  std::string topic;           // e.g. "rankwatch.nodes" (required)
  KafkaProperties properties;  // passed through to librdkafka (security settings)
  // The telemetry topic, whose partition count says which instance raises a node's alert
  // (PartitionOfNode).
  std::string telemetry_topic;
  // Partitions of the topic when this instance creates it. Default: 1 (a few records a second
  // for a whole fleet).
  int partitions = 1;
  // Bound on each request to the brokers (metadata, creating the topic). Default: 10 s.
  std::chrono::milliseconds request_timeout{10'000};
};

class NodeTopic {
 public:
  // Connects, creates the topic (compacted) when it is missing, and starts reading it into
  // `ledger` from its oldest record; the ledger is marked complete once the reader reached the
  // end the topic had at start. `ledger` outlives the NodeTopic.
  static absl::StatusOr<std::unique_ptr<NodeTopic>> Open(const NodeTopicOptions& options,
                                                         NodeLedger* ledger);
  ~NodeTopic();  // stops the reader; waits up to 5 s for records still queued
  NodeTopic(const NodeTopic&) = delete;
  NodeTopic& operator=(const NodeTopic&) = delete;

  // Queues `records` for the topic; never blocks (a full local queue drops and counts them).
  void Publish(const std::vector<v1::NodeRecord>& records);

  // The telemetry topic's partition count as Open found it; 0 when it was not found.
  int32_t telemetry_partitions() const { return telemetry_partitions_; }

  uint64_t published() const { return published_.load(std::memory_order_relaxed); }
  uint64_t failed() const { return failed_.load(std::memory_order_relaxed); }
  uint64_t read() const { return read_.load(std::memory_order_relaxed); }
  uint64_t ignored() const { return ignored_.load(std::memory_order_relaxed); }

 private:
  NodeTopic(NodeTopicOptions options, NodeLedger* ledger);
  void ReadLoop();
  static void OnDelivery(rd_kafka_t* rk, const rd_kafka_message_t* m, void* opaque);

  const NodeTopicOptions options_;
  NodeLedger* const ledger_;
  KafkaClient producer_;
  int32_t telemetry_partitions_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> published_{0}, failed_{0}, read_{0}, ignored_{0};
  std::thread reader_;
};

}  // namespace rankwatch
