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

}  // namespace rankwatch
