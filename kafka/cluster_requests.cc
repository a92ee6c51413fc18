#include "kafka/cluster_requests.h"

#include "kafka/client_factory.h"
#include "kafka/handles.h"

namespace rankwatch {
namespace {

int Milliseconds(std::chrono::milliseconds timeout) { return static_cast<int>(timeout.count()); }

std::string Duration(std::chrono::milliseconds d) {
  return d.count() % 1000 == 0 ? std::to_string(d.count() / 1000) + " s"
                               : std::to_string(d.count()) + " ms";
}

}  // namespace

bool IsDevelopmentClusterId(std::string_view cluster_id) {
  return cluster_id.starts_with("mockCluster");
}

absl::StatusOr<std::string> QueryClusterId(rd_kafka_t* client, std::chrono::milliseconds timeout) {
  KafkaString id(rd_kafka_clusterid(client, Milliseconds(timeout)), KafkaMemFree{client});
  if (id == nullptr) {
    return absl::UnavailableError("no Kafka broker answered within " +
                                  std::to_string(timeout.count()) + " ms");
  }
  return std::string(id.get());
}

absl::StatusOr<std::string> QueryKafkaClusterId(const std::string& brokers,
                                                const KafkaProperties& properties,
                                                std::chrono::milliseconds timeout) {
  // A producer sends nothing unless asked: the cheapest client that can ask.
  KafkaClientConfig config;
  config.type = RD_KAFKA_PRODUCER;
  config.name = "kafka client";
  config.defaults = {{"bootstrap.servers", brokers}};
  config.overrides = properties;
  auto client = NewKafkaClient(config);
  if (!client.ok()) return client.status();
  auto id = QueryClusterId(client->get(), timeout);
  if (!id.ok()) {
    return absl::UnavailableError("no Kafka broker at " + brokers + " answered within " +
                                  std::to_string(timeout.count()) + " ms");
  }
  return id;
}

absl::StatusOr<int> QueryPartitionCount(rd_kafka_t* client, const std::string& topic,
                                        MetadataScope scope, std::chrono::milliseconds timeout) {
  KafkaTopic handle;
  if (scope == MetadataScope::kTopic)
    handle.reset(rd_kafka_topic_new(client, topic.c_str(), nullptr));
  const rd_kafka_metadata_t* raw = nullptr;
  const rd_kafka_resp_err_t e =
      rd_kafka_metadata(client, scope == MetadataScope::kAllTopics ? 1 : 0, handle.get(), &raw,
                        Milliseconds(timeout));
  KafkaMetadata metadata(raw);
  if (e != RD_KAFKA_RESP_ERR_NO_ERROR) return absl::UnavailableError(rd_kafka_err2str(e));
  for (int i = 0; i < metadata->topic_cnt; ++i) {
    const rd_kafka_metadata_topic_t& t = metadata->topics[i];
    if (topic == t.topic && t.err == RD_KAFKA_RESP_ERR_NO_ERROR) return t.partition_cnt;
  }
  return -1;
}

absl::StatusOr<Watermarks> QueryWatermarks(rd_kafka_t* client, const std::string& topic,
                                           int32_t partition, std::chrono::milliseconds timeout) {
  Watermarks w;
  const rd_kafka_resp_err_t e = rd_kafka_query_watermark_offsets(
      client, topic.c_str(), partition, &w.low, &w.high, Milliseconds(timeout));
  if (e != RD_KAFKA_RESP_ERR_NO_ERROR) return absl::UnavailableError(rd_kafka_err2str(e));
  return w;
}

std::optional<Watermarks> CachedWatermarks(rd_kafka_t* client, const std::string& topic,
                                           int32_t partition) {
  Watermarks w{RD_KAFKA_OFFSET_INVALID, RD_KAFKA_OFFSET_INVALID};
  const rd_kafka_resp_err_t e =
      rd_kafka_get_watermark_offsets(client, topic.c_str(), partition, &w.low, &w.high);
  if (e != RD_KAFKA_RESP_ERR_NO_ERROR || w.low < 0) return std::nullopt;
  return w;
}

absl::Status CreateTopic(rd_kafka_t* client, const std::string& topic, int partitions,
                         const KafkaProperties& config, std::chrono::milliseconds timeout) {
  char err[512];
  KafkaNewTopic request(rd_kafka_NewTopic_new(topic.c_str(), partitions, -1, err, sizeof(err)));
  if (request == nullptr) return absl::InvalidArgumentError(err);
  std::string settings = std::to_string(partitions) + " partitions";
  for (const auto& [key, value] : config) {
    rd_kafka_NewTopic_set_config(request.get(), key.c_str(), value.c_str());
    settings += " and " + key + "=" + value;
  }
  KafkaQueue queue(rd_kafka_queue_new(client));
  rd_kafka_NewTopic_t* requests[] = {request.get()};
  rd_kafka_CreateTopics(client, requests, 1, nullptr, queue.get());
  KafkaEvent event(rd_kafka_queue_poll(queue.get(), Milliseconds(timeout)));
  if (event == nullptr) {
    return absl::DeadlineExceededError("the broker did not create topic " + topic + " within " +
                                       Duration(timeout) + "; create it with " + settings);
  }
  if (rd_kafka_event_error(event.get()) != RD_KAFKA_RESP_ERR_NO_ERROR) {
    return absl::UnavailableError(std::string("creating topic: ") +
                                  rd_kafka_event_error_string(event.get()));
  }
  const rd_kafka_CreateTopics_result_t* result = rd_kafka_event_CreateTopics_result(event.get());
  size_t n = 0;
  const rd_kafka_topic_result_t** results =
      result != nullptr ? rd_kafka_CreateTopics_result_topics(result, &n) : nullptr;
  if (n == 1) {
    const rd_kafka_resp_err_t e = rd_kafka_topic_result_error(results[0]);
    if (e != RD_KAFKA_RESP_ERR_NO_ERROR && e != RD_KAFKA_RESP_ERR_TOPIC_ALREADY_EXISTS) {
      return absl::UnavailableError("creating topic " + topic + ": " +
                                    rd_kafka_topic_result_error_string(results[0]));
    }
  }
  return absl::OkStatus();
}

}  // namespace rankwatch
