#include "kafka/kafka_producer.h"

#include <spdlog/spdlog.h>

#include <cstdlib>

#include "kafka/client_factory.h"
#include "kafka/cluster_requests.h"

namespace rankwatch {

absl::StatusOr<std::unique_ptr<KafkaProducer>> KafkaProducer::Create(
    const KafkaProducerOptions& options) {
  if (options.brokers.empty()) return absl::InvalidArgumentError("no Kafka brokers given");
  auto producer = std::unique_ptr<KafkaProducer>(new KafkaProducer(options));
  KafkaClientConfig config;
  config.type = RD_KAFKA_PRODUCER;
  config.name = "kafka producer";
  config.defaults = {
      {"bootstrap.servers", options.brokers},
      {"client.id", options.client_id},
      {"compression.codec", options.compression},
      {"linger.ms", std::to_string(options.linger_ms)},
      {"queue.buffering.max.messages", std::to_string(options.queue_max_messages)},
      {"message.max.bytes", std::to_string(options.max_message_bytes)},
  };
  SetIdempotentDelivery(&config.defaults);
  config.overrides = options.properties;
  config.opaque = producer.get();
  config.on_delivery = &KafkaProducer::OnDelivery;
  auto client = NewKafkaClient(config);
  if (!client.ok()) return client.status();
  producer->client_ = std::move(*client);
  // The limit in effect: a property may have overridden the option.
  char value[32];
  size_t size = sizeof(value);
  if (rd_kafka_conf_get(rd_kafka_conf(producer->client_.get()), "message.max.bytes", value,
                        &size) == RD_KAFKA_CONF_OK) {
    producer->max_message_bytes_ = std::strtoull(value, nullptr, 10);
  }
  return producer;
}

KafkaProducer::KafkaProducer(KafkaProducerOptions options) : options_(std::move(options)) {}

KafkaProducer::~KafkaProducer() {
  if (client_ != nullptr) rd_kafka_flush(client_.get(), 5000);
}

void KafkaProducer::OnDelivery(rd_kafka_t*, const rd_kafka_message_t* m, void* opaque) {
  auto* self = static_cast<KafkaProducer*>(opaque);
  if (m->err == RD_KAFKA_RESP_ERR_NO_ERROR) {
    self->delivered_.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  self->failed_.fetch_add(1, std::memory_order_relaxed);
  self->failed_records_.fetch_add(reinterpret_cast<uintptr_t>(m->_private),
                                  std::memory_order_relaxed);
  if (m->err == RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE) {
    self->oversized_.fetch_add(1, std::memory_order_relaxed);
    if (!self->logged_oversized_.exchange(true)) {
      spdlog::error(
          "kafka: the broker refused a message of {} bytes as too large for topic {}: lower "
          "max_message_bytes (now {}) to the topic's max.message.bytes (further ones are only "
          "counted)",
          m->len, self->options_.topic, self->max_message_bytes_);
    }
    return;
  }
  if (!self->logged_failure_.exchange(true)) {
    spdlog::error("kafka delivery failed: {} (further failures are only counted)",
                  rd_kafka_err2str(m->err));
  }
}

absl::Status KafkaProducer::Publish(std::string_view key, std::string_view payload,
                                    uint64_t records) {
  while (true) {
    rd_kafka_resp_err_t e = rd_kafka_producev(
        client_.get(), RD_KAFKA_V_TOPIC(options_.topic.c_str()),
        RD_KAFKA_V_KEY(const_cast<char*>(key.data()), key.size()),
        RD_KAFKA_V_VALUE(const_cast<char*>(payload.data()), payload.size()),
        RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
        RD_KAFKA_V_OPAQUE(reinterpret_cast<void*>(static_cast<uintptr_t>(records))),
        RD_KAFKA_V_END);
    if (e == RD_KAFKA_RESP_ERR_NO_ERROR) {
      rd_kafka_poll(client_.get(), 0);
      return absl::OkStatus();
    }
    if (e == RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE) {
      oversized_.fetch_add(1, std::memory_order_relaxed);
      return absl::OutOfRangeError(
          "produce: a message of " + std::to_string(payload.size() + key.size()) +
          " bytes is over message.max.bytes (" + std::to_string(max_message_bytes_) + ")");
    }
    if (e != RD_KAFKA_RESP_ERR__QUEUE_FULL) {
      return absl::UnavailableError(std::string("produce: ") + rd_kafka_err2str(e));
    }
    if (options_.when_full == KafkaProducerOptions::WhenFull::kDropNewest) {
      dropped_.fetch_add(1, std::memory_order_relaxed);
      return absl::ResourceExhaustedError("producer queue full; batch dropped");
    }
    rd_kafka_poll(client_.get(), 10);  // serve delivery reports until there is room
  }
}

absl::Status KafkaProducer::WaitUntilConnected(std::chrono::milliseconds timeout) {
  auto partitions =
      QueryPartitionCount(client_.get(), options_.topic, MetadataScope::kTopic, timeout);
  if (!partitions.ok()) {
    return absl::UnavailableError("cannot reach Kafka at " + options_.brokers + " (" +
                                  std::string(partitions.status().message()) + ")");
  }
  if (auto id = QueryClusterId(client_.get(), timeout); id.ok()) {
    development_broker_ = IsDevelopmentClusterId(*id);
  }
  return absl::OkStatus();
}

int KafkaProducer::Poll(std::chrono::milliseconds timeout) {
  return rd_kafka_poll(client_.get(), static_cast<int>(timeout.count()));
}

absl::Status KafkaProducer::Flush(std::chrono::milliseconds timeout) {
  rd_kafka_resp_err_t e = rd_kafka_flush(client_.get(), static_cast<int>(timeout.count()));
  if (e != RD_KAFKA_RESP_ERR_NO_ERROR) {
    return absl::DeadlineExceededError(
        std::to_string(rd_kafka_outq_len(client_.get())) +
        " messages still undelivered after flush: " + rd_kafka_err2str(e));
  }
  return absl::OkStatus();
}

}  // namespace rankwatch
