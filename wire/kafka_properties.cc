#include "wire/kafka_properties.h"

#include <spdlog/spdlog.h>

namespace rankwatch {

absl::Status SetKafkaProperty(rd_kafka_conf_t* conf, const std::string& key,
                              const std::string& value) {
  char err[512];
  if (rd_kafka_conf_set(conf, key.c_str(), value.c_str(), err, sizeof(err)) != RD_KAFKA_CONF_OK) {
    return absl::InvalidArgumentError("kafka property " + key + "=" + value + ": " + err);
  }
  return absl::OkStatus();
}

absl::Status SetKafkaProperties(rd_kafka_conf_t* conf, const KafkaProperties& props) {
  for (const auto& [k, v] : props) {
    if (absl::Status s = SetKafkaProperty(conf, k, v); !s.ok()) return s;
  }
  return absl::OkStatus();
}

void RouteKafkaLogs(rd_kafka_conf_t* conf) {
  rd_kafka_conf_set_log_cb(conf,
                           [](const rd_kafka_t*, int level, const char* fac, const char* buf) {
                             // syslog levels: 0-3 error, 4 warning, 5-6 info, 7 debug.
                             if (level <= 3) {
                               spdlog::error("kafka {}: {}", fac, buf);
                             } else if (level == 4) {
                               spdlog::warn("kafka {}: {}", fac, buf);
                             } else if (level <= 6) {
                               spdlog::debug("kafka {}: {}", fac, buf);
                             } else {
                               spdlog::trace("kafka {}: {}", fac, buf);
                             }
                           });
}

absl::StatusOr<rd_kafka_t*> NewKafkaClient(rd_kafka_type_t type, rd_kafka_conf_t* conf,
                                           const KafkaProperties& defaults,
                                           const KafkaProperties& overrides,
                                           const std::string& what) {
  absl::Status s = SetKafkaProperties(conf, defaults);
  if (s.ok()) s = SetKafkaProperties(conf, overrides);
  if (!s.ok()) {
    rd_kafka_conf_destroy(conf);
    return s;
  }
  char err[512];
  rd_kafka_t* rk = rd_kafka_new(type, conf, err, sizeof(err));
  if (rk == nullptr) {
    rd_kafka_conf_destroy(conf);
    return absl::InvalidArgumentError(what + ": " + err);
  }
  return rk;
}

bool IsDevelopmentClusterId(std::string_view cluster_id) {
  return cluster_id.starts_with("mockCluster");
}

absl::StatusOr<std::string> QueryKafkaClusterId(const std::string& brokers,
                                                const KafkaProperties& properties,
                                                std::chrono::milliseconds timeout) {
  rd_kafka_conf_t* conf = rd_kafka_conf_new();
  RouteKafkaLogs(conf);
  // A producer handle sends nothing unless asked: the cheapest client that can ask.
  auto rk = NewKafkaClient(RD_KAFKA_PRODUCER, conf, {{"bootstrap.servers", brokers}}, properties,
                           "kafka client");
  if (!rk.ok()) return rk.status();
  char* id = rd_kafka_clusterid(*rk, static_cast<int>(timeout.count()));
  absl::StatusOr<std::string> result =
      id != nullptr ? absl::StatusOr<std::string>(std::string(id))
                    : absl::UnavailableError("no Kafka broker at " + brokers + " answered within " +
                                             std::to_string(timeout.count()) + " ms");
  if (id != nullptr) rd_kafka_mem_free(*rk, id);
  rd_kafka_destroy(*rk);
  return result;
}

}  // namespace rankwatch
