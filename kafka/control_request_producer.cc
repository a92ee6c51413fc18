#include "kafka/control_request_producer.h"

namespace rankwatch {

absl::StatusOr<std::unique_ptr<ControlRequestProducer>> ControlRequestProducer::Create(
    const ControlRequestProducerOptions& options) {
  if (options.deadline < std::chrono::milliseconds(1)) {
    return absl::InvalidArgumentError("control requests: a deadline of at least 1 ms is needed");
  }
  KafkaProducerOptions po;
  po.brokers = options.brokers;
  po.topic = options.topic;
  po.client_id = "rankwatchd-control";
  po.when_full = KafkaProducerOptions::WhenFull::kDropNewest;
  po.queue_max_messages = kMaxQueued;
  po.properties = {{"message.timeout.ms", std::to_string(options.deadline.count())}};
  for (const auto& [key, value] : options.properties) po.properties[key] = value;
  auto producer = KafkaProducer::Create(po);
  if (!producer.ok()) return producer.status();
  return std::unique_ptr<ControlRequestProducer>(new ControlRequestProducer(std::move(*producer)));
}

absl::Status ControlRequestProducer::Send(std::string_view training_job, std::string_view request) {
  absl::Status s = producer_->Publish(training_job, request);
  producer_->Poll(std::chrono::milliseconds(0));  // serves delivery reports
  return s;
}

}  // namespace rankwatch
