// BatchPublisher: produces serialized telemetry batches to the telemetry topic with
// librdkafka's idempotent producer, compressed, keyed by training job.
//
// Two behaviours when librdkafka's local queue is full: `kBlock` waits for room (the
// simulator and replays, which must not lose data) and `kDropNewest` refuses the batch and
// counts it (callers that must never block).
//
// Thread-safe: librdkafka producers may be shared; counters are atomic.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "wire/kafka_properties.h"

typedef struct rd_kafka_s rd_kafka_t;

namespace rankwatch {

// The idempotent producer keeps at most 5 produce requests in flight per partition. While
// that window is full (a broker that accepted the requests but does not answer: hung,
// stopped, partitioned) librdkafka 2.0's broker thread spins on poll(0) for as long as any
// further message waits in its queue, burning all the CPU it is given (4 training ranks on
// 2 cores: 0.5-0.7 of a core together, and step time x1.9-2.1). A producer that runs beside
// training therefore keeps fewer messages than this in librdkafka (queue_max_messages <= this) and
// holds any backlog itself.
constexpr int kIdempotentInflightWindow = 5;

struct PublisherOptions {
  std::string brokers;                        // bootstrap list (required)
  std::string topic = "rankwatch.telemetry";  // default: rankwatch.telemetry
  std::string compression = "lz4";            // default: lz4 (none, gzip, snappy, lz4, zstd)
  int linger_ms = 5;                          // default: 5 ms of batching in librdkafka
  int queue_max_messages = 100'000;           // default: 100,000 messages buffered locally
                                              // (see kIdempotentInflightWindow)
  enum class WhenFull { kBlock, kDropNewest } when_full = WhenFull::kBlock;
  std::string client_id = "rankwatch";
  KafkaProperties properties;  // passed through to librdkafka
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
  ~BatchPublisher();
  BatchPublisher(const BatchPublisher&) = delete;
  BatchPublisher& operator=(const BatchPublisher&) = delete;

  // Enqueues one message (the payload is copied). With kBlock, waits while the local queue
  // is full; with kDropNewest, returns ResourceExhausted and counts a drop.
  absl::Status Publish(std::string_view key, std::string_view payload);

  // Fetches the topic's metadata from the brokers, so that the first batches do not wait for
  // the connection. Unavailable (naming the brokers) when none answers within `timeout`.
  absl::Status WaitUntilConnected(std::chrono::milliseconds timeout);

  // Serves delivery reports, waiting up to `timeout` for the first one (0: does not wait).
  // Returns the number of events served.
  int Poll(std::chrono::milliseconds timeout);

  // Waits until every enqueued message is delivered or failed, up to `timeout`.
  absl::Status Flush(std::chrono::milliseconds timeout);

  uint64_t delivered() const { return delivered_.load(std::memory_order_relaxed); }
  uint64_t failed() const { return failed_.load(std::memory_order_relaxed); }
  uint64_t dropped() const { return dropped_.load(std::memory_order_relaxed); }
  // Whether the brokers are the development broker (known after WaitUntilConnected).
  bool development_broker() const { return development_broker_; }

 private:
  BatchPublisher(rd_kafka_t* rk, PublisherOptions options);
  static void OnDelivery(rd_kafka_t*, const struct rd_kafka_message_s* m, void* opaque);

  rd_kafka_t* rk_ = nullptr;
  const PublisherOptions options_;
  std::atomic<uint64_t> delivered_{0};
  std::atomic<uint64_t> failed_{0};
  std::atomic<uint64_t> dropped_{0};
  std::atomic<bool> logged_failure_{false};
  // The development broker's rate warning (options_.warn_as): bytes offered since the window
  // started, and whether the warning was given.
  void CheckDevelopmentBrokerRate(size_t bytes);
  bool development_broker_ = false;
  std::mutex rate_mu_;
  std::chrono::steady_clock::time_point window_start_{};
  double window_bytes_ = 0;
  bool rate_warned_ = false;
};

}  // namespace rankwatch
