// DaemonPart: the socket through which a feature plugs into rankwatchd — the evidence fetched
// from a job's ranks, the fleet view of nodes, the alerts' outbound paths, the state changelog.
// A part is built from its own options (its struct in DaemonConfig), and wires itself through the
// PartContext it is handed, as a Kafka Streams processor through its ProcessorContext: it
// schedules its periodic duties (run from main's loop), hooks the tick (parts/tick_hook.h),
// offers its services to the queries and the runtime (parts/part_services.h), registers its own
// metric families (read at scrape), saves its state at each checkpoint, and reaches the alert
// log, the state store, the checkpoint writer and the brokers. main() only lists the parts
// (daemon/rankwatchd_main.cc); adding one touches its own room, its settings rows, the proto,
// and one line of that list (docs/architecture.md, "Parts").
//
// Lifecycle, on the main thread, each step in the parts' order: Start (before the servers start
// and the jobs' state is restored), Restored (the state is restored: the alert log knows which
// alerts fire; before any input is read), Stop (the tasks' last checkpoint is taken; before the
// state writer drains). Duties and hooks run on the ingest thread in between.
//
// PartContext: not thread-safe; used by the parts from Start and Restored (main thread).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "kafka/kafka_properties.h"
#include "operators/time.h"
#include "parts/duty_scheduler.h"
#include "parts/part_services.h"
#include "parts/tick_hook.h"

namespace rankwatch {

// The daemon's own pieces a part may use (declared in their rooms: alerting/alert_hub.h,
// state/state_store.h, state/checkpoint_writer.h, metrics/prometheus_registry.h).
class AlertHub;
class StateStore;
class CheckpointWriter;
class PrometheusRegistry;

// Which telemetry partitions this instance owns now (the runtime's view; ingest thread).
class PartitionOwnership {
 public:
  virtual ~PartitionOwnership() = default;
  virtual bool Owns(int32_t partition) const = 0;
  // Partitions the consumer group assigned to this instance.
  virtual int assigned() const = 0;
};

// What the daemon shares with its parts. Every pointer outlives the parts.
struct PartEnvironment {
  std::string brokers;          // the Kafka bootstrap list (the embedded broker's, without one)
  std::string telemetry_topic;  // the topic the daemon consumes
  std::string group;            // its consumer group
  KafkaProperties kafka;        // passed through to every Kafka client (security settings)
  AlertHub* alerts = nullptr;   // the alert log: append alerts, track firing ones
  StateStore* store = nullptr;  // the state store (read at Start: what the part saved)
  CheckpointWriter* writer = nullptr;  // every write of the daemon's state goes through it
  PrometheusRegistry* registry = nullptr;
  // The web UI's URL as its users reach it ("" without a UI); set before Restored.
  std::string ui_url;
  // Set before Restored; read by duties.
  const PartitionOwnership* partitions = nullptr;
};

class PartContext {
 public:
  PartContext(PartEnvironment* environment, DutyScheduler* duties, PartServices* services)
      : environment_(environment), duties_(duties), services_(services) {}

  const PartEnvironment& environment() const { return *environment_; }

  // Runs `duty` every `period` on the ingest thread from main's loop, first at once (or after
  // `delay`).
  DutyScheduler::Id Schedule(std::string name, Duration period, DutyScheduler::Duty duty,
                             Duration delay = Duration(0)) {
    return duties_->Schedule(std::move(name), period, std::move(duty), delay);
  }
  // Calls `hook` at every batch and tick (after the hooks registered before it). It outlives the
  // runtime.
  void HookTick(TickHook* hook) { hooks_.push_back(hook); }
  // What the part serves to the queries and the runtime.
  PartServices& services() { return *services_; }
  // Runs `save` at every checkpoint, after the tasks', on the ingest thread (the part enqueues
  // its changes on the writer), and once more at Stop's time.
  void AtCheckpoint(std::function<void()> save) { checkpoint_.push_back(std::move(save)); }

  const std::vector<TickHook*>& hooks() const { return hooks_; }
  const std::vector<std::function<void()>>& checkpoint_savers() const { return checkpoint_; }

 private:
  PartEnvironment* environment_;
  DutyScheduler* duties_;
  PartServices* services_;
  std::vector<TickHook*> hooks_;
  std::vector<std::function<void()>> checkpoint_;
};

class DaemonPart {
 public:
  virtual ~DaemonPart() = default;

  // The part's name, for the log ("fleet", "evidence").
  virtual std::string_view name() const = 0;

  // Builds what the part owns and plugs it in through `context`. An error stops the daemon.
  virtual absl::Status Start(PartContext& context) = 0;
  // The jobs' state is restored (the alert log knows which alerts fire); no input read yet.
  virtual absl::Status Restored(PartContext& context) {
    (void)context;
    return absl::OkStatus();
  }
  // At shutdown, after the tasks' last checkpoint and the parts' last saves, before the state
  // writer drains.
  virtual void Stop() {}
};

}  // namespace rankwatch
