// NodeTopic: the nodes topic, through which every instance of a scaled-out rankwatchd shares the
// fleet view of nodes (fleet/node_ledger.h) — as a Kafka Streams global table: each instance
// publishes the records of the jobs it owns, keyed "node \0 job", and reads every partition of
// the topic from its oldest record on, applying each record to its own NodeLedger. Records are
// totals (the newest wins), so reading one twice, late or out of order changes nothing; the
// topic is created compacted (one record per key survives), and each instance also keeps the
// view in its state store, so a broker that deleted old records (librdkafka's development broker
// keeps 5 MiB per partition) loses only what no instance had read.
//
// Delivery: a record the topic did not take (the producer's queue full, a delivery report with
// an error) is produced again with exponential backoff, up to `max_delivery_attempts` times,
// unless a newer record of its key was published meanwhile (records are totals: the newer one
// replaces it; the key's records reach the topic in the order they were published). Once
// delivered a charge leaves the ledger's outbox (NodeLedger::Delivered); a charge still in it
// when the daemon stops, is killed, or gives up is published again after the restart.
//
// Thread-safe: Publish from one thread (the ingest thread); the reader runs on its own thread,
// serves the publisher's delivery reports and produces the retries that fall due.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
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
  // A record not delivered is produced again after first_retry_backoff, doubled each time up
  // to max_retry_backoff, at most max_delivery_attempts times in all. Defaults: 1 s, 60 s, 10.
  std::chrono::milliseconds first_retry_backoff{1'000};
  std::chrono::milliseconds max_retry_backoff{60'000};
  int max_delivery_attempts = 10;
  // Records waiting for delivery or a retry at most (the oldest go first). Default: 100,000.
  size_t max_undelivered = 100'000;
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

  // Queues `records` for the topic, and produces again those whose retry is due; never blocks
  // (a full local queue is a failed attempt, retried).
  void Publish(const std::vector<v1::NodeRecord>& records);

  // The telemetry topic's partition count as Open found it; 0 when it was not found.
  int32_t telemetry_partitions() const { return telemetry_partitions_; }

  uint64_t published() const { return published_.load(std::memory_order_relaxed); }
  // Records given up after max_delivery_attempts (or dropped over max_undelivered); their
  // charges wait in the ledger's outbox for the next restart.
  uint64_t failed() const { return failed_.load(std::memory_order_relaxed); }
  // Failed attempts that were (or will be) retried.
  uint64_t retried() const { return retried_.load(std::memory_order_relaxed); }
  // Records waiting for a delivery report or a retry.
  size_t undelivered() const;
  uint64_t read() const { return read_.load(std::memory_order_relaxed); }
  uint64_t ignored() const { return ignored_.load(std::memory_order_relaxed); }

 private:
  NodeTopic(NodeTopicOptions options, NodeLedger* ledger);
  void ReadLoop();
  static void OnDelivery(rd_kafka_t* rk, const rd_kafka_message_t* m, void* opaque);
  // A record not yet delivered: the newest of its key.
  struct Outstanding {
    uint64_t generation = 0;  // of the newest publication of the key (the delivery's opaque)
    std::string value;
    std::string node, job;  // a charge's (empty job: a node alert's transition)
    int64_t last_unix_ns = 0;
    int attempts = 0;
    bool in_flight = false;
    bool given_up = false;  // failed max_delivery_attempts times: to be erased
    std::chrono::steady_clock::time_point retry_at{};
  };
  // Produces the key's record (one attempt); a refused one is a failed attempt.
  void ProduceLocked(const std::string& key, Outstanding& o) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A failed attempt: retried later, or given up (the caller erases it then).
  void FailedLocked(const std::string& key, Outstanding& o, const char* why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RetryDue() ABSL_LOCKS_EXCLUDED(mu_);

  const NodeTopicOptions options_;
  NodeLedger* const ledger_;
  KafkaClient producer_;
  int32_t telemetry_partitions_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> published_{0}, failed_{0}, retried_{0}, read_{0}, ignored_{0};
  mutable std::mutex mu_;
  std::map<std::string, Outstanding> outstanding_ ABSL_GUARDED_BY(mu_);  // by key
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  bool warned_ ABSL_GUARDED_BY(mu_) = false;
  std::thread reader_;
};

}  // namespace rankwatch
