// DaemonConfig: rankwatchd's settings, each with its default. Which key and flag set a field, how
// its text is parsed and which values it takes is declared once, in the settings table
// (daemon_settings.cc); the YAML config file (--config) and the command line both go through it,
// and flags win over the file. Keys in the file are the flag names without dashes, e.g.
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
//
// A plain value type: built by main() before the daemon starts, read-only after.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "alerting/alerting_part.h"
#include "common/listen_address.h"
#include "evidence/evidence_part.h"
#include "fleet/fleet_part.h"
#include "kafka/kafka_properties.h"
#include "operators/memory_diagnosis.h"
#include "operators/step_time_diagnosis.h"
#include "operators/time.h"
#include "operators/whatif/verdict.h"
#include "state/changelog_part.h"

namespace rankwatch {

struct DaemonConfig {
  std::string brokers;  // empty: embedded mock broker
  std::string topic = "rankwatch.telemetry";
  std::string group = "rankwatch";
  std::string state_dir = "rankwatch-state";
  ListenAddress metrics_listen{"0.0.0.0", 9466};
  ListenAddress grpc_listen{"0.0.0.0", 7466};
  // The web UI and its JSON API; none ("") turns them off.
  std::optional<ListenAddress> ui_listen = ListenAddress{"0.0.0.0", 8466};
  int embedded_partitions = 6;  // partitions of the embedded broker's topic
  int window_steps = 100;       // spec K
  Duration align_timeout = std::chrono::seconds(10);
  Duration checkpoint_interval = std::chrono::seconds(1);  // durable state written this often
  // Estimated changes one periodic checkpoint collects on the ingest thread (whole
  // partitions); the rest follows in the next rounds. Default: 16 MiB.
  int checkpoint_budget_mib = 16;
  // While reading a backlog, telemetry read (MiB of message payload) after which a checkpoint
  // is due before checkpoint_interval has passed: bounds the changes held in memory.
  // Default: 32 MiB.
  int checkpoint_input_mib = 32;
  // Threads that handle the telemetry of different partitions at once (the ingest thread
  // included). Default: 2.
  int ingest_threads = 2;
  Duration job_ttl = std::chrono::hours(1);        // no input this long: the job is finished
  Duration job_retention = std::chrono::hours(1);  // finished jobs stay queryable this long
  // gRPC TLS (all PEM files; none: plaintext). A client CA turns on mutual TLS.
  std::string grpc_tls_cert;
  std::string grpc_tls_key;
  std::string grpc_tls_client_ca;
  int alert_subscriber_queue = 1024;  // alerts a WatchAlerts subscriber may lag behind
  // The job table's bounds (runtime/job_router.h): jobs, and ranks over all jobs.
  int64_t max_jobs = 10'000;
  int64_t max_ranks = 1 << 20;
  // Cardinality (metrics/job_export_gate.h): an id is a job once a step aligned with two ranks,
  // or after this many aligned steps; at most max_exported_jobs jobs get per-job series.
  int64_t job_min_steps = 5;
  int64_t max_exported_jobs = 1'000;
  std::string log_level = "info";  // trace, debug, info, warn, error, critical, off
  // Static group membership: the consumer group's group.instance.id. Empty (default): derived
  // from the pod or host name and the state directory (DefaultInstanceId), so that the same
  // instance restarted on its state keeps its id; "none": a dynamic member. The development
  // broker does not support static membership: there the member is always dynamic.
  std::string instance_id;
  // A crashed instance's partitions move on after this long. None (default): 10 s on a Kafka
  // cluster, 3 s on the development broker (consumer_group.h).
  std::optional<Duration> session_timeout;
  KafkaProperties kafka;
  // The `step-diagnosis:` section; its hang_timeout_min is the top-level `hang-timeout`.
  StepDiagnosisOptions step_diagnosis;
  MemoryDiagnosisOptions memory_diagnosis;  // `memory-diagnosis:` section
  int memory_window_steps = 100;            // `memory-diagnosis: window-steps`
  whatif::Options whatif;                   // `whatif:` section: the analyzer
  whatif::VerdictOptions whatif_verdict;    // `whatif:` section: the verdict's thresholds

  // The daemon's parts' own options (parts/daemon_part.h), each documented in its part's header.
  EvidencePartOptions evidence;    // captures, hang stacks, Flight Recorder (evidence/)
  FleetPartOptions fleet;          // the fleet view of nodes (fleet/)
  AlertingPartOptions alerting;    // Alertmanager push, actions (alerting/, docs/alerting.md)
  ChangelogPartOptions changelog;  // the state changelog, for scale-out (state/)
};

// Reads `path` into `config` through the settings table, leaving keys the file does not name
// untouched. Unknown keys and bad values are InvalidArgument naming the file and the key; each
// value is checked as the table declares it.
absl::Status LoadDaemonConfigFile(const std::string& path, DaemonConfig* config);

// Parses "250ms", "10s", "2m", "1h" or a plain number of seconds ("1.5").
absl::StatusOr<Duration> ParseDuration(const std::string& text);

}  // namespace rankwatch
