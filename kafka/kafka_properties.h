// KafkaProperties: librdkafka client properties ("security.protocol", "sasl.*", "ssl.*", ...)
// as the user gives them (`kafka:` in rankwatchd's config, `properties=` of the collectors),
// passed through to librdkafka as they are by NewKafkaClient (kafka/client_factory.h).
//
// A plain value type; no librdkafka dependency, so that configuration code can hold one.
#pragma once

#include <map>
#include <string>

namespace rankwatch {

using KafkaProperties = std::map<std::string, std::string>;

// Sets, in a producer's properties, idempotent delivery acknowledged by every in-sync replica
// (enable.idempotence=true, acks=all): a retry never duplicates or reorders a message. The one
// place rankwatch's producers (telemetry, control requests, the state changelog, the nodes
// topic) take these settings from; as defaults, the user's properties may still override them.
inline void SetIdempotentDelivery(KafkaProperties* properties) {
  (*properties)["enable.idempotence"] = "true";
  (*properties)["acks"] = "all";
}

}  // namespace rankwatch
