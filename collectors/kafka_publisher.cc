#include "collectors/kafka_publisher.h"

#include <librdkafka/rdkafka.h>
#include <spdlog/spdlog.h>

#include <algorithm>

namespace rankwatch {

absl::StatusOr<std::unique_ptr<BatchPublisher>> BatchPublisher::Create(
    const PublisherOptions& options) {
  if (options.brokers.empty()) return absl::InvalidArgumentError("no Kafka brokers given");
  auto publisher = std::unique_ptr<BatchPublisher>(new BatchPublisher(nullptr, options));
  rd_kafka_conf_t* conf = rd_kafka_conf_new();
  RouteKafkaLogs(conf);
  rd_kafka_conf_set_opaque(conf, publisher.get());
  rd_kafka_conf_set_dr_msg_cb(conf, &BatchPublisher::OnDelivery);
  const KafkaProperties defaults = {
      {"bootstrap.servers", options.brokers},
      {"client.id", options.client_id},
      {"enable.idempotence", "true"},
      {"compression.codec", options.compression},
      {"linger.ms", std::to_string(options.linger_ms)},
      {"queue.buffering.max.messages", std::to_string(options.queue_max_messages)},
  };
  auto rk = NewKafkaClient(RD_KAFKA_PRODUCER, conf, defaults, options.properties, "kafka producer");
  if (!rk.ok()) return rk.status();
  publisher->rk_ = *rk;
  return publisher;
}

absl::StatusOr<std::unique_ptr<BatchPublisher>> BatchPublisher::Connect(
    const PublisherOptions& options, std::chrono::milliseconds timeout) {
  auto publisher = Create(options);
  if (!publisher.ok()) return publisher.status();
  if (absl::Status s = (*publisher)->WaitUntilConnected(timeout); !s.ok()) return s;
  return publisher;
}

BatchPublisher::BatchPublisher(rd_kafka_t* rk, PublisherOptions options)
    : rk_(rk), options_(std::move(options)) {}

BatchPublisher::~BatchPublisher() {
  if (rk_ == nullptr) return;
  rd_kafka_flush(rk_, 5000);
  rd_kafka_destroy(rk_);
}

void BatchPublisher::OnDelivery(rd_kafka_t*, const rd_kafka_message_t* m, void* opaque) {
  auto* self = static_cast<BatchPublisher*>(opaque);
  if (m->err == RD_KAFKA_RESP_ERR_NO_ERROR) {
    self->delivered_.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  self->failed_.fetch_add(1, std::memory_order_relaxed);
  if (!self->logged_failure_.exchange(true)) {
    spdlog::error("kafka delivery failed: {} (further failures are only counted)",
                  rd_kafka_err2str(m->err));
  }
}

absl::Status BatchPublisher::Publish(std::string_view key, std::string_view payload) {
  while (true) {
    rd_kafka_resp_err_t e =
        rd_kafka_producev(rk_, RD_KAFKA_V_TOPIC(options_.topic.c_str()),
                          RD_KAFKA_V_KEY(const_cast<char*>(key.data()), key.size()),
                          RD_KAFKA_V_VALUE(const_cast<char*>(payload.data()), payload.size()),
                          RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_END);
    if (e == RD_KAFKA_RESP_ERR_NO_ERROR) {
      rd_kafka_poll(rk_, 0);
      if (development_broker_ && !options_.warn_as.empty()) {
        CheckDevelopmentBrokerRate(payload.size());
      }
      return absl::OkStatus();
    }
    if (e != RD_KAFKA_RESP_ERR__QUEUE_FULL) {
      return absl::UnavailableError(std::string("produce: ") + rd_kafka_err2str(e));
    }
    if (options_.when_full == PublisherOptions::WhenFull::kDropNewest) {
      dropped_.fetch_add(1, std::memory_order_relaxed);
      return absl::ResourceExhaustedError("producer queue full; batch dropped");
    }
    rd_kafka_poll(rk_, 10);  // serve delivery reports until there is room
  }
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
      options_.warn_as, rate * 1e-6, kDevelopmentBrokerBytesPerSecond * 1e-6);
}

absl::Status BatchPublisher::WaitUntilConnected(std::chrono::milliseconds timeout) {
  rd_kafka_topic_t* topic = rd_kafka_topic_new(rk_, options_.topic.c_str(), nullptr);
  const rd_kafka_metadata_t* metadata = nullptr;
  const rd_kafka_resp_err_t e =
      rd_kafka_metadata(rk_, 0, topic, &metadata, static_cast<int>(timeout.count()));
  if (metadata != nullptr) rd_kafka_metadata_destroy(metadata);
  rd_kafka_topic_destroy(topic);
  if (e != RD_KAFKA_RESP_ERR_NO_ERROR) {
    return absl::UnavailableError("cannot reach Kafka at " + options_.brokers + " (" +
                                  rd_kafka_err2str(e) + ")");
  }
  if (char* id = rd_kafka_clusterid(rk_, static_cast<int>(timeout.count())); id != nullptr) {
    development_broker_ = IsDevelopmentClusterId(id);
    rd_kafka_mem_free(rk_, id);
  }
  return absl::OkStatus();
}

int BatchPublisher::Poll(std::chrono::milliseconds timeout) {
  return rd_kafka_poll(rk_, static_cast<int>(timeout.count()));
}

absl::Status BatchPublisher::Flush(std::chrono::milliseconds timeout) {
  rd_kafka_resp_err_t e = rd_kafka_flush(rk_, static_cast<int>(timeout.count()));
  if (e != RD_KAFKA_RESP_ERR_NO_ERROR) {
    return absl::DeadlineExceededError(
        std::to_string(rd_kafka_outq_len(rk_)) +
        " messages still undelivered after flush: " + rd_kafka_err2str(e));
  }
  return absl::OkStatus();
}

}  // namespace rankwatch
