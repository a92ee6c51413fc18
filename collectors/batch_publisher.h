// BatchPublisher: publishes serialized telemetry batches (rankwatch.v1.Batch) to the telemetry
// topic, keyed by training job: the Kafka side of every collector (the collector library, the
// node agent, `rankwatch simulate` and `rankwatch replay`). A KafkaProducer (kafka/
// kafka_producer.h: idempotent, compressed, blocking or dropping when its queue is full) plus
// what is particular to telemetry: the telemetry topic by default, and a warning when a tool
// offers the development broker more than it keeps.
//
// Message size: every collector keeps its batches within max_batch_bytes(), what a message of
// `max_message_bytes` (librdkafka's message.max.bytes; default 1,000,000, a broker's and a
// topic's default too) holds once the key and Kafka's record overhead are paid
// (wire/schema.h). A batch over it is refused with OutOfRange and counted (oversized()): it
// never fits, so the caller drops it (counting its records) rather than retry it.
//
// Thread-safe: as KafkaProducer; the rate warning's window is guarded by a mutex.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kafka/kafka_producer.h"

namespace rankwatch {

// A KafkaProducerOptions for telemetry. Its topic defaults to the telemetry topic.
struct PublisherOptions : KafkaProducerOptions {
  PublisherOptions() { topic = "rankwatch.telemetry"; }  // default: rankwatch.telemetry
  // A tool's name ("rankwatch simulate"): when the brokers are the development broker
  // (`rankwatch kafka`, librdkafka's mock cluster, which keeps 5 MiB per partition), warn once
  // if this publisher offers more than kDevelopmentBrokerBytesPerSecond. Empty: never.
  std::string warn_as;
};

// What one partition of the development broker takes without loss on the development machine
// (2 cores, the daemon beside it): the 5 MiB it keeps are ~2,600 messages of 20 step records
// (~100 bytes each), so a daemon that falls behind by more than that loses the oldest. Measured:
// 256 ranks unpaced (65 MB/s, 640 k records/s) lost 3,000-17,500 of 25,856 messages
// (e2e_input_loss); paced jobs under 20 MB/s lost none.
constexpr double kDevelopmentBrokerBytesPerSecond = 20e6;
// What the development broker keeps of each partition (librdkafka's mock cluster).
constexpr double kDevelopmentBrokerPartitionBytes = 5.0 * 1024 * 1024;

class BatchPublisher {
 public:
  static absl::StatusOr<std::unique_ptr<BatchPublisher>> Create(const PublisherOptions& options);
  // Create, then WaitUntilConnected(timeout): InvalidArgument for a bad configuration,
  // Unavailable when no broker answers.
  static absl::StatusOr<std::unique_ptr<BatchPublisher>> Connect(const PublisherOptions& options,
                                                                 std::chrono::milliseconds timeout);
  BatchPublisher(const BatchPublisher&) = delete;
  BatchPublisher& operator=(const BatchPublisher&) = delete;

  // Enqueues one batch of `training_job` (the payload is copied). With kBlock, waits while the
  // local queue is full; with kDropNewest, returns ResourceExhausted and counts a drop.
  // OutOfRange, counted in oversized(), when it is larger than max_message_bytes allows.
  // `records`: the records it carries, summed into failed_records() if its delivery fails.
  absl::Status Publish(std::string_view training_job, std::string_view batch, uint64_t records = 0);

  // Fetches the topic's metadata from the brokers, so that the first batches do not wait for
  // the connection. Unavailable (naming the brokers) when none answers within `timeout`.
  absl::Status WaitUntilConnected(std::chrono::milliseconds timeout) {
    return producer_->WaitUntilConnected(timeout);
  }

  // Serves delivery reports, waiting up to `timeout` for the first one (0: does not wait).
  // Returns the number of events served.
  int Poll(std::chrono::milliseconds timeout) { return producer_->Poll(timeout); }

  // Waits until every enqueued batch is delivered or failed, up to `timeout`.
  absl::Status Flush(std::chrono::milliseconds timeout) { return producer_->Flush(timeout); }

  uint64_t delivered() const { return producer_->delivered(); }
  uint64_t failed() const { return producer_->failed(); }
  uint64_t dropped() const { return producer_->dropped(); }
  // Batches refused as too large, by the producer or the broker (KafkaProducer::oversized).
  uint64_t oversized() const { return producer_->oversized(); }
  // The records of batches whose delivery failed.
  uint64_t failed_records() const { return producer_->failed_records(); }
  // The `message.max.bytes` in effect, and the serialized bytes a batch may have within it
  // (MaxBatchPayloadBytes: the key and Kafka's overhead paid, at most the wire's 4 MiB).
  size_t max_message_bytes() const { return producer_->max_message_bytes(); }
  size_t max_batch_bytes() const;
  // Whether the brokers are the development broker (known after WaitUntilConnected).
  bool development_broker() const { return producer_->development_broker(); }

 private:
  BatchPublisher(std::unique_ptr<KafkaProducer> producer, std::string warn_as)
      : producer_(std::move(producer)), warn_as_(std::move(warn_as)) {}
  // The development broker's rate warning (warn_as_): bytes offered since the window started,
  // and whether the warning was given.
  void CheckDevelopmentBrokerRate(size_t bytes);

  const std::unique_ptr<KafkaProducer> producer_;
  const std::string warn_as_;
  std::mutex rate_mu_;
  std::chrono::steady_clock::time_point window_start_ ABSL_GUARDED_BY(rate_mu_){};
  double window_bytes_ ABSL_GUARDED_BY(rate_mu_) = 0;
  bool rate_warned_ ABSL_GUARDED_BY(rate_mu_) = false;
};

}  // namespace rankwatch
