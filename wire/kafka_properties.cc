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

}  // namespace rankwatch
