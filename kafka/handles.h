// The one owner type of every librdkafka handle rankwatch holds: a std::unique_ptr whose deleter
// calls the handle's librdkafka destructor. No other file destroys a librdkafka handle.
//
// A client (KafkaClient) must outlive every handle taken from it (queues, topics, messages,
// metadata, events): declare the client first, so that it is destroyed last. Destroying a
// consumer client closes it (leaves its group) unless it was closed already.
//
// Thread-safety: as the handles' own (librdkafka clients are thread-safe; a message, a list or
// a conf belongs to one thread at a time).
#pragma once

#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>

#include <memory>

namespace rankwatch {

// Calls the librdkafka destructor of the handle type it is given.
struct KafkaDeleter {
  void operator()(rd_kafka_t* p) const { rd_kafka_destroy(p); }
  void operator()(rd_kafka_conf_t* p) const { rd_kafka_conf_destroy(p); }
  void operator()(rd_kafka_topic_partition_list_t* p) const {
    rd_kafka_topic_partition_list_destroy(p);
  }
  void operator()(rd_kafka_message_t* p) const { rd_kafka_message_destroy(p); }
  void operator()(rd_kafka_queue_t* p) const { rd_kafka_queue_destroy(p); }
  void operator()(rd_kafka_topic_t* p) const { rd_kafka_topic_destroy(p); }
  void operator()(const rd_kafka_metadata_t* p) const { rd_kafka_metadata_destroy(p); }
  void operator()(rd_kafka_event_t* p) const { rd_kafka_event_destroy(p); }
  void operator()(rd_kafka_error_t* p) const { rd_kafka_error_destroy(p); }
  void operator()(rd_kafka_NewTopic_t* p) const { rd_kafka_NewTopic_destroy(p); }
  void operator()(rd_kafka_mock_cluster_t* p) const { rd_kafka_mock_cluster_destroy(p); }
};

// A producer or consumer; made only by NewKafkaClient (kafka/client_factory.h).
using KafkaClient = std::unique_ptr<rd_kafka_t, KafkaDeleter>;
// A configuration not yet handed to the client it configures.
using KafkaConf = std::unique_ptr<rd_kafka_conf_t, KafkaDeleter>;
using KafkaPartitionList = std::unique_ptr<rd_kafka_topic_partition_list_t, KafkaDeleter>;
// A consumed message (or a consumer error event); frees librdkafka's copy of its payload.
// (KafkaMessage, ingest/kafka_consumer.h, is the consumer's view of one handed to its owner.)
using KafkaMessagePtr = std::unique_ptr<rd_kafka_message_t, KafkaDeleter>;
using KafkaQueue = std::unique_ptr<rd_kafka_queue_t, KafkaDeleter>;
using KafkaTopic = std::unique_ptr<rd_kafka_topic_t, KafkaDeleter>;
using KafkaMetadata = std::unique_ptr<const rd_kafka_metadata_t, KafkaDeleter>;
using KafkaEvent = std::unique_ptr<rd_kafka_event_t, KafkaDeleter>;
using KafkaError = std::unique_ptr<rd_kafka_error_t, KafkaDeleter>;
using KafkaNewTopic = std::unique_ptr<rd_kafka_NewTopic_t, KafkaDeleter>;
// librdkafka's in-process mock cluster (the embedded development broker).
using KafkaMockCluster = std::unique_ptr<rd_kafka_mock_cluster_t, KafkaDeleter>;

// Memory that librdkafka allocated for a client (rd_kafka_clusterid, rd_kafka_memberid):
// freed with that client's allocator.
struct KafkaMemFree {
  rd_kafka_t* client;
  void operator()(char* p) const { rd_kafka_mem_free(client, p); }
};
using KafkaString = std::unique_ptr<char, KafkaMemFree>;

}  // namespace rankwatch
