#include "collectors/batch_publisher.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "wire/schema.h"

namespace rankwatch {

static_assert(kDefaultKafkaMaxMessageBytes == kDefaultMaxMessageBytes,
              "the producer's default message size is the wire's");
static_assert(kKafkaRecordOverheadBytes + BatchLimits{}.max_job_id_bytes <
                  kKafkaMessageOverheadBytes,
              "a batch within MaxBatchPayloadBytes fits its message with any job id as its key");

absl::StatusOr<std::unique_ptr<BatchPublisher>> BatchPublisher::Create(
    const PublisherOptions& options) {
  auto producer = KafkaProducer::Create(options);
  if (!producer.ok()) return producer.status();
  return std::unique_ptr<BatchPublisher>(new BatchPublisher(std::move(*producer), options.warn_as));
}

absl::StatusOr<std::unique_ptr<BatchPublisher>> BatchPublisher::Connect(
    const PublisherOptions& options, std::chrono::milliseconds timeout) {
  auto publisher = Create(options);
  if (!publisher.ok()) return publisher.status();
  if (absl::Status s = (*publisher)->WaitUntilConnected(timeout); !s.ok()) return s;
  return publisher;
}

size_t BatchPublisher::max_batch_bytes() const {
  return MaxBatchPayloadBytes(producer_->max_message_bytes());
}

absl::Status BatchPublisher::Publish(std::string_view training_job, std::string_view batch,
                                     uint64_t records) {
  absl::Status s = producer_->Publish(training_job, batch, records);
  if (s.ok() && !warn_as_.empty() && producer_->development_broker()) {
    CheckDevelopmentBrokerRate(batch.size());
  }
  return s;
}

void BatchPublisher::CheckDevelopmentBrokerRate(size_t bytes) {
  std::lock_guard<std::mutex> lock(rate_mu_);
  if (rate_warned_) return;
  const auto now = std::chrono::steady_clock::now();
  if (window_start_ == std::chrono::steady_clock::time_point{}) window_start_ = now;
  window_bytes_ += static_cast<double>(bytes);
  const double seconds = std::chrono::duration<double>(now - window_start_).count();
  // Judged over windows of 0.25 s, or sooner once a window holds more than the broker keeps
  // of a partition (a burst shorter than 0.25 s can still be larger: simulate --jobs publishes
  // a 256-rank job's 2,000 steps, ~50 MB, in ~0.2 s).
  if (seconds < 0.25 && window_bytes_ <= kDevelopmentBrokerPartitionBytes) return;
  const double rate = window_bytes_ / std::max(seconds, 1e-3);
  window_start_ = now;
  window_bytes_ = 0;
  if (rate <= kDevelopmentBrokerBytesPerSecond) return;
  rate_warned_ = true;
  spdlog::warn(
      "{}: publishing {:.0f} MB/s into the development broker, which keeps only 5 MiB per "
      "partition (~50,000 step records): a rankwatchd that falls that far behind loses the "
      "oldest messages (counted in rankwatch_input_lost_messages_total). Stay under {:.0f} MB/s "
      "(simulate --rate 200000) or use a Kafka cluster",
      warn_as_, rate * 1e-6, kDevelopmentBrokerBytesPerSecond * 1e-6);
}

}  // namespace rankwatch
