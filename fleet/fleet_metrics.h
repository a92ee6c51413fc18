// FleetMetrics: the metric families of the fleet view of nodes (docs/metrics.md): the nodes and
// (node, job) records it holds, the node alerts firing, the nodes topic's records (read at
// scrape), and per-node series of the costliest nodes.
//
// Thread-safe, except Publish: the fleet part's duty (ingest thread).
#pragma once

#include <set>
#include <string>

#include "fleet/node_ledger.h"
#include "fleet/node_topic.h"
#include "metrics/prometheus_registry.h"
#include "rankwatch/v1/service.pb.h"

namespace rankwatch {

class FleetMetrics {
 public:
  // Registers the families in `registry`; `topic` (may be null: the view is not shared) is read
  // at every scrape. Both outlive the metrics' use.
  FleetMetrics(PrometheusRegistry* registry, const NodeTopic* topic);

  // The view as of the last duty: `top` (the costliest nodes; exactly these have per-node
  // series afterwards) and the ledger's records and firing node alerts.
  void Publish(const v1::ListNodesResponse& top, const NodeLedger& ledger);

 private:
  MetricCell* nodes_;
  MetricCell* records_;
  MetricCell* alerts_firing_;
  MetricFamily* node_jobs_;
  MetricFamily* node_lost_;
  MetricFamily* node_window_jobs_;
  std::set<std::string> exported_nodes_;
};

}  // namespace rankwatch
