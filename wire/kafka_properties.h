// Helpers shared by every librdkafka client of rankwatch (consumer, producers, mock broker).
#pragma once

#include <librdkafka/rdkafka.h>

#include <map>
#include <string>

#include "absl/status/status.h"

namespace rankwatch {

// Extra librdkafka properties (security.protocol, sasl.*, ssl.*, ...) passed through as-is.
using KafkaProperties = std::map<std::string, std::string>;

// Sets `key` = `value` on `conf`; an unknown key or bad value is InvalidArgument naming both.
absl::Status SetKafkaProperty(rd_kafka_conf_t* conf, const std::string& key,
                              const std::string& value);

// Sets every property of `props` on `conf`, stopping at the first error.
absl::Status SetKafkaProperties(rd_kafka_conf_t* conf, const KafkaProperties& props);

// Routes librdkafka's log lines to spdlog under `component`.
void RouteKafkaLogs(rd_kafka_conf_t* conf);

}  // namespace rankwatch
