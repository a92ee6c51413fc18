// Helpers shared by every librdkafka client of rankwatch (consumer, producers, mock broker).
#pragma once

#include <librdkafka/rdkafka.h>

#include <chrono>
#include <map>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

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

// Creates a client of `type` from `conf` (taken: freed on every path) after setting `defaults`
// then `overrides` on it. Errors name `what` ("kafka producer", ...).
absl::StatusOr<rd_kafka_t*> NewKafkaClient(rd_kafka_type_t type, rd_kafka_conf_t* conf,
                                           const KafkaProperties& defaults,
                                           const KafkaProperties& overrides,
                                           const std::string& what);

// Whether `cluster_id` is that of librdkafka's mock cluster (the development broker of
// `rankwatch kafka` and of rankwatchd without --brokers), which names itself "mockCluster<hex>".
bool IsDevelopmentClusterId(std::string_view cluster_id);

// Asks the cluster at `brokers` for its id (a metadata request, with `properties` for security
// settings); Unavailable when no broker answers within `timeout`.
absl::StatusOr<std::string> QueryKafkaClusterId(const std::string& brokers,
                                                const KafkaProperties& properties,
                                                std::chrono::milliseconds timeout);

}  // namespace rankwatch
