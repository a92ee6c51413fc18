// Requests about the Kafka cluster rather than its messages: its id, a topic's partition count
// and watermarks, topic creation. Each takes a client made by NewKafkaClient
// (kafka/client_factory.h) and keeps no handle past its return.
//
// Thread-safe: librdkafka clients may be shared; every function blocks its caller up to its
// timeout.
#pragma once

#include <librdkafka/rdkafka.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kafka/kafka_properties.h"

namespace rankwatch {

// Whether `cluster_id` is that of librdkafka's mock cluster (the development broker of
// `rankwatch kafka` and of rankwatchd without --brokers), which names itself "mockCluster<hex>".
bool IsDevelopmentClusterId(std::string_view cluster_id);

// The id of the cluster `client` talks to; Unavailable when no broker answers within `timeout`.
absl::StatusOr<std::string> QueryClusterId(rd_kafka_t* client, std::chrono::milliseconds timeout);

// Asks the cluster at `brokers` for its id with a client of its own (`properties` for security
// settings); Unavailable, naming the brokers, when none answers within `timeout`.
absl::StatusOr<std::string> QueryKafkaClusterId(const std::string& brokers,
                                                const KafkaProperties& properties,
                                                std::chrono::milliseconds timeout);

// Which topics a metadata request asks for.
enum class MetadataScope {
  // Only the topic asked about. A broker that creates topics on request (the development
  // broker; a cluster with auto.create.topics.enable, unless the client sets
  // allow.auto.create.topics=false) creates a missing one.
  kTopic,
  // Every topic: creates none.
  kAllTopics,
};

// The partition count of `topic` (a metadata request), or -1 when the cluster does not have it.
// Unavailable, with librdkafka's reason as the message, when no broker answers within
// `timeout`.
absl::StatusOr<int> QueryPartitionCount(rd_kafka_t* client, const std::string& topic,
                                        MetadataScope scope, std::chrono::milliseconds timeout);

// The offset of a partition's oldest message (`low`) and the offset the next message will get
// (`high`).
struct Watermarks {
  int64_t low = 0;
  int64_t high = 0;
};

// Asks the partition's leader for its watermarks; Unavailable, with librdkafka's reason as the
// message, when it does not answer within `timeout`.
absl::StatusOr<Watermarks> QueryWatermarks(rd_kafka_t* client, const std::string& topic,
                                           int32_t partition, std::chrono::milliseconds timeout);

// The watermarks a consumer last saw in a fetch answer for the partition (no request, does
// not block); nullopt when it has seen none.
std::optional<Watermarks> CachedWatermarks(rd_kafka_t* client, const std::string& topic,
                                           int32_t partition);

// Creates `topic` with `partitions` partitions (the broker's replication factor) and the topic
// configuration `config` (e.g. cleanup.policy=compact). A topic that exists already is OK.
// DeadlineExceeded when the broker does not answer within `timeout`, with the settings to create
// it by hand; Unavailable when it refuses, with its reason.
absl::Status CreateTopic(rd_kafka_t* client, const std::string& topic, int partitions,
                         const KafkaProperties& config, std::chrono::milliseconds timeout);

}  // namespace rankwatch
