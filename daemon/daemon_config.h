// DaemonConfig: rankwatchd's settings, from the YAML config file (--config) and the command
// line; flags win over the file. Keys in the file are the flag names without dashes, e.g.
//
//   brokers: kafka-1:9092,kafka-2:9092
//   metrics-listen: 0.0.0.0:9466
//   window-steps: 100
//   align-timeout: 10s
//   kafka:                      # passed through to librdkafka
//     security.protocol: SASL_SSL
//   step-diagnosis:             # thresholds of docs/spec/step-diagnosis.md section 3
//     straggler-warn: 0.10
//   memory-diagnosis:           # section 4
//     window-steps: 100
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "operators/memory_diagnosis.h"
#include "operators/step_time_diagnosis.h"
#include "operators/time.h"
#include "kafka/kafka_properties.h"

namespace rankwatch {

struct DaemonConfig {
  std::string brokers;  // empty: embedded mock broker
  std::string topic = "rankwatch.telemetry";
  std::string group = "rankwatch";
  std::string state_dir = "rankwatch-state";
  std::string metrics_listen = "0.0.0.0:9466";
  std::string grpc_listen = "0.0.0.0:7466";
  std::string ui_listen = "0.0.0.0:8466";  // the web UI and its JSON API; "" turns them off
  int embedded_partitions = 6;             // partitions of the embedded broker's topic
  int window_steps = 100;                  // spec K
  std::string align_timeout = "10s";
  std::string hang_timeout = "30s";        // floor of max(5 x median step, this)
  std::string checkpoint_interval = "1s";  // durable state written this often
  // Estimated changes one periodic checkpoint collects on the ingest thread (whole
  // partitions); the rest follows in the next rounds. Default: 16 MiB.
  int checkpoint_budget_mib = 16;
  // Compacted topic holding a copy of the state, so partitions can move between instances of
  // one group. Empty (default): none, for a single instance.
  std::string changelog_topic;
  // Topic of the control channel to the collectors (captures); empty: no captures.
  std::string control_topic = "rankwatch.control";
  bool auto_capture = true;              // a firing straggler alert captures culprit + typical rank
  int capture_steps = 5;                 // steps a capture profiles, per rank
  std::string capture_interval = "10m";  // at most one automatic capture a job this often
  // The collectors must take a capture request this soon; the request is not retried after.
  std::string capture_deadline = "60s";
  // A job diagnosed hung: its ranks are asked for their stacks (on the control topic).
  bool hang_stacks = true;
  std::string job_ttl = "1h";        // no input this long: the job is finished
  std::string job_retention = "1h";  // finished jobs stay queryable this long
  // gRPC TLS (all PEM files; none: plaintext). A client CA turns on mutual TLS.
  std::string grpc_tls_cert;
  std::string grpc_tls_key;
  std::string grpc_tls_client_ca;
  int alert_subscriber_queue = 1024;  // alerts a WatchAlerts subscriber may lag behind
  // The job table's bounds (runtime/job_router.h): jobs, and ranks over all jobs.
  int64_t max_jobs = 10'000;
  int64_t max_ranks = 1 << 20;
  std::string log_level = "info";  // trace, debug, info, warn, error
  // Static group membership: the consumer group's group.instance.id. Empty (default): derived
  // from the pod or host name and the state directory (DefaultInstanceId), so that the same
  // instance restarted on its state keeps its id; "none": a dynamic member. The development
  // broker does not support static membership: there the member is always dynamic.
  std::string instance_id;
  // A crashed instance's partitions move on after this long. Empty (default): 10 s on a Kafka
  // cluster, kDevelopmentSessionTimeout on the development broker.
  std::string session_timeout;
  KafkaProperties kafka;
  StepDiagnosisOptions step_diagnosis;      // `step-diagnosis:` section; hang-timeout above
  MemoryDiagnosisOptions memory_diagnosis;  // `memory-diagnosis:` section
  int memory_window_steps = 100;            // `memory-diagnosis: window-steps`
};

// Reads `path` into `config`, leaving keys the file does not name untouched. Unknown keys and
// bad values are InvalidArgument naming the file and the key.
absl::Status LoadDaemonConfigFile(const std::string& path, DaemonConfig* config);

// Parses "250ms", "10s", "2m", "1h" or a plain number of seconds ("1.5").
absl::StatusOr<Duration> ParseDuration(const std::string& text);

// The consumer group's session timeout when none is configured: on a Kafka cluster, and on the
// development broker (loopback only, and no static membership there: a restarted instance
// waits for its predecessor's session to time out, twice; see docs/operating.md).
inline constexpr std::chrono::milliseconds kClusterSessionTimeout{10000};
inline constexpr std::chrono::milliseconds kDevelopmentSessionTimeout{3000};

// The group.instance.id of an instance running on `host` (the pod name under Kubernetes, else
// the host name) with its state in `state_dir` (an absolute path): "rankwatchd-<host>-<8 hex
// digits of a hash of state_dir>". The same host and state directory give the same id, so a
// restarted instance takes its predecessor's place; two instances on one host differ. Characters
// Kafka does not allow in an id become '_'.
std::string DefaultInstanceId(std::string_view host, std::string_view state_dir);

}  // namespace rankwatch
