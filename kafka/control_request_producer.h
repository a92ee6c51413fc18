// ControlRequestProducer: rankwatchd's side of the control channel's requests
// (proto/rankwatch/v1/control.proto): sends serialized ControlRequests, keyed by training job,
// to the control topic that the collectors' ControlListeners read (collectors/lib/
// control_listener.h). The replies come back in the telemetry batches, not through it.
//
// It never blocks its caller: a full local queue refuses the request, and a request the broker
// has not taken by its answer deadline is dropped, never retried after the deadline.
//
// Thread-safe: as KafkaProducer.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kafka/kafka_producer.h"

namespace rankwatch {

struct ControlRequestProducerOptions {
  std::string brokers;                      // bootstrap list (required)
  std::string topic = "rankwatch.control";  // default: rankwatch.control
  // How long a request may wait to be taken by the broker (its answer deadline); at least 1 ms.
  std::chrono::milliseconds deadline{std::chrono::seconds(60)};  // default: 60 s
  KafkaProperties properties;  // passed through to librdkafka (security settings)
};

class ControlRequestProducer {
 public:
  // Local requests held at most; beyond them Send refuses.
  static constexpr int kMaxQueued = 1000;

  // InvalidArgument for a bad configuration. Does not wait for the brokers.
  static absl::StatusOr<std::unique_ptr<ControlRequestProducer>> Create(
      const ControlRequestProducerOptions& options);

  // Enqueues one request for `training_job` and serves the delivery reports that are due.
  // ResourceExhausted when kMaxQueued requests wait already; Unavailable when librdkafka
  // refuses it.
  absl::Status Send(std::string_view training_job, std::string_view request);

  uint64_t delivered() const { return producer_->delivered(); }
  uint64_t failed() const { return producer_->failed(); }
  uint64_t dropped() const { return producer_->dropped(); }

 private:
  explicit ControlRequestProducer(std::unique_ptr<KafkaProducer> producer)
      : producer_(std::move(producer)) {}

  const std::unique_ptr<KafkaProducer> producer_;
};

}  // namespace rankwatch
