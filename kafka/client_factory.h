// NewKafkaClient: the one place a librdkafka client is made. Every client of
// rankwatch — the telemetry consumer, the state changelog's producer and readers, the producers
// of telemetry and control requests, the collectors' control listener, cluster requests and the
// embedded broker's host — is made here, and owned by the KafkaClient it returns
// (kafka/handles.h).
//
// The sequence, the same for every client: route librdkafka's log lines to spdlog, set the
// caller's defaults, then the user's overrides (which win), then the callbacks, then create.
// Whatever fails, nothing leaks: the configuration is freed on every path.
//
// Thread-safe: no shared state.
#pragma once

#include <librdkafka/rdkafka.h>

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kafka/handles.h"
#include "kafka/kafka_properties.h"

namespace rankwatch {

// librdkafka's per-message delivery report callback (producers).
using KafkaDeliveryCallback = void (*)(rd_kafka_t* client, const rd_kafka_message_t* message,
                                       void* opaque);
// librdkafka's group rebalance callback (consumers that subscribe).
using KafkaRebalanceCallback = void (*)(rd_kafka_t* client, rd_kafka_resp_err_t err,
                                        rd_kafka_topic_partition_list_t* partitions, void* opaque);

struct KafkaClientConfig {
  rd_kafka_type_t type = RD_KAFKA_PRODUCER;
  // Names the client at the start of an error creating it ("kafka consumer: ...").
  std::string name = "kafka client";
  KafkaProperties defaults;                       // the client's own settings
  KafkaProperties overrides;                      // the user's: set after `defaults`, so they win
  void* opaque = nullptr;                         // passed to the callbacks below (rd_kafka_opaque)
  KafkaDeliveryCallback on_delivery = nullptr;    // none: no delivery reports
  KafkaRebalanceCallback on_rebalance = nullptr;  // none: librdkafka assigns by itself
};

// Creates a client from `config`. A property librdkafka does not know, or a value it rejects,
// is InvalidArgument "kafka property KEY=VALUE: <librdkafka's reason>" (the first one in
// defaults, then in overrides); a set of properties librdkafka refuses together (acks=1 with
// enable.idempotence, ...) is InvalidArgument "<name>: <librdkafka's reason>".
absl::StatusOr<KafkaClient> NewKafkaClient(const KafkaClientConfig& config);

}  // namespace rankwatch
