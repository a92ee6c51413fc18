// EmbeddedBroker: a local Kafka-protocol broker (librdkafka's mock cluster) listening on
// 127.0.0.1, with the telemetry topic (and its state changelog and control topics) created.
// Real clients (librdkafka, kcat, confluent-kafka-python) talk to it over TCP. For development,
// tests and the demo only: it keeps everything in memory.
//
// Thread-safe: the mock cluster runs on its own thread; this object only owns it.
#pragma once

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kafka/handles.h"

namespace rankwatch {

struct EmbeddedBrokerOptions {
  std::string topic = "rankwatch.telemetry";  // default: rankwatch.telemetry
  int partitions = 6;                         // default: 6
  int brokers = 1;                            // default: 1
  // Also create "<topic>.changelog" with as many partitions, for rankwatchd's state changelog
  // (--changelog-topic): the mock broker cannot create topics on request. Default: true.
  bool changelog_topic = true;
  // The control channel's topic (control.proto), one partition; empty: none. Default:
  // rankwatch.control.
  std::string control_topic = "rankwatch.control";
  // The nodes topic (rankwatchd's fleet view of nodes, fleet/node_topic.h), one partition;
  // empty: none. Default: rankwatch.nodes.
  std::string nodes_topic = "rankwatch.nodes";
};

class EmbeddedBroker {
 public:
  static absl::StatusOr<std::unique_ptr<EmbeddedBroker>> Start(
      const EmbeddedBrokerOptions& options);
  EmbeddedBroker(const EmbeddedBroker&) = delete;
  EmbeddedBroker& operator=(const EmbeddedBroker&) = delete;

  // Bootstrap address list, "127.0.0.1:PORT[,...]".
  const std::string& bootstrap() const { return bootstrap_; }

  // Takes every broker down: open connections are closed and new ones refused, while the
  // partitions' logs, committed offsets and group state stay in memory. The closest this
  // in-memory cluster comes to a broker restart (a real restart of the process would lose the
  // data and the port). SetUp() accepts connections again. Clients reconnect by themselves.
  absl::Status SetDown();
  absl::Status SetUp();

 private:
  EmbeddedBroker(KafkaClient host, KafkaMockCluster cluster);

  KafkaClient host_;  // the client handle the mock cluster lives in; outlives it
  KafkaMockCluster cluster_;
  std::string bootstrap_;
};

}  // namespace rankwatch
