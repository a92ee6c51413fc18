// FleetPart: the fleet view of nodes (docs/fleet.md) as a part of rankwatchd
// (parts/daemon_part.h). It owns the NodeLedger — restored from the state store, charged by every
// tick's straggler alerts, saved at each checkpoint, served to the queries as the NodeView — and
// the NodeTopic that shares it between instances. Its duty, every second: prune the view, publish
// this instance's new charges, evaluate the node alerts it owns (into the alert log), and publish
// the per-node metrics.
//
// Not thread-safe: started and stopped on the main thread; the hook and the duty run on the
// ingest thread. (The ledger itself is thread-safe: the queries read it.)
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "fleet/fleet_metrics.h"
#include "fleet/node_ledger.h"
#include "fleet/node_topic.h"
#include "operators/time.h"
#include "parts/daemon_part.h"

namespace rankwatch {

struct FleetPartOptions {
  // The topic the instances share the view through (created compacted); empty: not shared, this
  // instance's jobs only. Default: "rankwatch.nodes".
  std::string nodes_topic = "rankwatch.nodes";
  // A record is kept this long after its node's last charge in the job. Default: 7 days.
  Duration node_horizon = std::chrono::hours(24 * 7);
  // The node alert: a node culprit of `node_alert_jobs` jobs (0: no alert) within
  // `node_alert_window`. Defaults: 3 jobs, 24 hours.
  Duration node_alert_window = std::chrono::hours(24);
  int64_t node_alert_jobs = 3;
  // Nodes with per-node series at most: the costliest. Default: 50.
  int64_t max_exported_nodes = 50;
};

class FleetPart : public DaemonPart, public TickHook {
 public:
  explicit FleetPart(FleetPartOptions options) : options_(std::move(options)) {}

  std::string_view name() const override { return "fleet"; }
  absl::Status Start(PartContext& context) override;
  // The last charges reach the other instances (the topic's destructor waits for delivery).
  void Stop() override;

  // The tick's straggler alerts charge their nodes.
  void OnTick(const TickView& tick, std::vector<v1::Alert>* alerts) override;

 private:
  void EverySecond(TimePoint now);

  const FleetPartOptions options_;
  const PartEnvironment* environment_ = nullptr;
  std::unique_ptr<NodeLedger> ledger_;
  std::unique_ptr<NodeTopic> topic_;
  std::unique_ptr<FleetMetrics> metrics_;
  // The telemetry topic's partition count, for the instance that raises a node's alert (0: this
  // one raises every node's).
  int32_t telemetry_partitions_ = 0;
  TimePoint assigned_since_{};  // since when the consumer holds partitions (none: {})
};

}  // namespace rankwatch
