#include "kafka/client_factory.h"

#include <spdlog/spdlog.h>

namespace rankwatch {
namespace {

absl::Status SetProperties(rd_kafka_conf_t* conf, const KafkaProperties& properties) {
  char err[512];
  for (const auto& [key, value] : properties) {
    if (rd_kafka_conf_set(conf, key.c_str(), value.c_str(), err, sizeof(err)) != RD_KAFKA_CONF_OK) {
      return absl::InvalidArgumentError("kafka property " + key + "=" + value + ": " + err);
    }
  }
  return absl::OkStatus();
}

// librdkafka's log lines, at spdlog's levels.
void LogToSpdlog(const rd_kafka_t*, int level, const char* facility, const char* line) {
  // syslog levels: 0-3 error, 4 warning, 5-6 info, 7 debug.
  if (level <= 3) {
    spdlog::error("kafka {}: {}", facility, line);
  } else if (level == 4) {
    spdlog::warn("kafka {}: {}", facility, line);
  } else if (level <= 6) {
    spdlog::debug("kafka {}: {}", facility, line);
  } else {
    spdlog::trace("kafka {}: {}", facility, line);
  }
}

}  // namespace

absl::StatusOr<KafkaClient> NewKafkaClient(const KafkaClientConfig& config) {
  KafkaConf conf(rd_kafka_conf_new());
  rd_kafka_conf_set_log_cb(conf.get(), &LogToSpdlog);
  if (absl::Status s = SetProperties(conf.get(), config.defaults); !s.ok()) return s;
  if (absl::Status s = SetProperties(conf.get(), config.overrides); !s.ok()) return s;
  rd_kafka_conf_set_opaque(conf.get(), config.opaque);
  if (config.on_delivery != nullptr) rd_kafka_conf_set_dr_msg_cb(conf.get(), config.on_delivery);
  if (config.on_rebalance != nullptr) {
    rd_kafka_conf_set_rebalance_cb(conf.get(), config.on_rebalance);
  }
  char err[512];
  KafkaClient client(rd_kafka_new(config.type, conf.get(), err, sizeof(err)));
  if (client == nullptr) return absl::InvalidArgumentError(config.name + ": " + err);
  (void)conf.release();  // rd_kafka_new took it
  return client;
}

}  // namespace rankwatch
