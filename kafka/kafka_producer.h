// KafkaProducer: produces keyed messages to one topic with librdkafka's idempotent producer,
// compressed, and counts their delivery. What the messages are is its owner's business: the
// collectors' telemetry batches (collectors/batch_publisher.h), rankwatchd's control requests
// (kafka/control_request_producer.h).
//
// Two behaviours when librdkafka's local queue is full: `kBlock` waits for room (callers that
// must not lose data) and `kDropNewest` refuses the message and counts it (callers that must
// never block).
//
// A message larger than `max_message_bytes` (librdkafka's `message.max.bytes`, which its
// producer enforces itself: value + key + 36 bytes) is refused at once with OutOfRange and
// counted (oversized()); so is one the broker refuses as too large, in its delivery report.
// Such a message never fits: the caller drops it rather than retry it or recreate the
// producer for it.
//
// Thread-safe: librdkafka producers may be shared; counters are atomic. Not movable: librdkafka
// calls back into it.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kafka/handles.h"
#include "kafka/kafka_properties.h"

namespace rankwatch {

// The idempotent producer keeps at most 5 produce requests in flight per partition. While
// that window is full (a broker that accepted the requests but does not answer: hung,
// stopped, partitioned) librdkafka 2.0's broker thread spins on poll(0) for as long as any
// further message waits in its queue, burning all the CPU it is given (4 training ranks on
// 2 cores: 0.5-0.7 of a core together, and step time x1.9-2.1). A producer that runs beside
// training therefore keeps fewer messages than this in librdkafka (queue_max_messages <= this) and
// holds any backlog itself.
constexpr int kIdempotentInflightWindow = 5;

// librdkafka's default `message.max.bytes` (wire/schema.h's kDefaultMaxMessageBytes).
constexpr int kDefaultKafkaMaxMessageBytes = 1'000'000;
// What librdkafka's producer adds to a message's value and key when it checks them against
// `message.max.bytes` (the v2 record format's largest record overhead).
constexpr int kKafkaRecordOverheadBytes = 36;

struct KafkaProducerOptions {
  std::string brokers;               // bootstrap list (required)
  std::string topic;                 // (required)
  std::string compression = "lz4";   // default: lz4 (none, gzip, snappy, lz4, zstd)
  int linger_ms = 5;                 // default: 5 ms of batching in librdkafka
  int queue_max_messages = 100'000;  // default: 100,000 messages buffered locally
                                     // (see kIdempotentInflightWindow)
  enum class WhenFull { kBlock, kDropNewest } when_full = WhenFull::kBlock;
  std::string client_id = "rankwatch";  // default: rankwatch
  // The largest message (value + key + 36 bytes of record overhead) librdkafka produces:
  // `message.max.bytes`. Default: 1,000,000, librdkafka's default and about a broker's and a
  // topic's (1 MiB + 12). Set it to the brokers' limit, not above.
  int max_message_bytes = kDefaultKafkaMaxMessageBytes;
  KafkaProperties properties;  // passed through to librdkafka; win over the above
};

class KafkaProducer {
 public:
  // InvalidArgument for a bad configuration (no brokers, a bad property). Does not wait for the
  // brokers.
  static absl::StatusOr<std::unique_ptr<KafkaProducer>> Create(const KafkaProducerOptions& options);
  ~KafkaProducer();  // waits up to 5 s for what is still queued
  KafkaProducer(const KafkaProducer&) = delete;
  KafkaProducer& operator=(const KafkaProducer&) = delete;

  // Enqueues one message (the payload is copied). With kBlock, waits while the local queue
  // is full; with kDropNewest, returns ResourceExhausted and counts a drop. OutOfRange (counted
  // in oversized()) when it is larger than max_message_bytes(): it never fits. `records`: what
  // the message carries, summed into failed_records() if its delivery fails.
  absl::Status Publish(std::string_view key, std::string_view payload, uint64_t records = 0);

  // Fetches the topic's metadata from the brokers, so that the first messages do not wait for
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
  // Messages refused as too large: by Publish, or by the broker (their delivery failed, and
  // they are counted in failed() too).
  uint64_t oversized() const { return oversized_.load(std::memory_order_relaxed); }
  // The `records` of the messages whose delivery failed.
  uint64_t failed_records() const { return failed_records_.load(std::memory_order_relaxed); }
  // The `message.max.bytes` in effect (options.max_message_bytes, or the property that
  // overrides it).
  size_t max_message_bytes() const { return max_message_bytes_; }
  // Whether the brokers are the development broker (known after WaitUntilConnected).
  bool development_broker() const { return development_broker_; }
  const KafkaProducerOptions& options() const { return options_; }

 private:
  explicit KafkaProducer(KafkaProducerOptions options);
  static void OnDelivery(rd_kafka_t*, const rd_kafka_message_t* m, void* opaque);

  const KafkaProducerOptions options_;
  KafkaClient client_;
  std::atomic<uint64_t> delivered_{0};
  std::atomic<uint64_t> failed_{0};
  std::atomic<uint64_t> dropped_{0};
  std::atomic<uint64_t> oversized_{0};
  std::atomic<uint64_t> failed_records_{0};
  std::atomic<bool> logged_failure_{false};
  std::atomic<bool> logged_oversized_{false};
  size_t max_message_bytes_ = kDefaultKafkaMaxMessageBytes;
  bool development_broker_ = false;
};

}  // namespace rankwatch
