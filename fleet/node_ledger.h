// NodeLedger: the fleet view of nodes (docs/fleet.md). Per node, across jobs and time: how often
// it was the culprit of a job's straggler alert, what that cost the job (lost rank-seconds), in
// which jobs, first and last seen; and the node alert, raised when a node was the culprit of
// `alert_jobs` different jobs within `alert_window` ("drain it").
//
// It holds one record per (node, job): the job's NodeCharge (operators/alert_tracker.h), totals
// that only grow, so the newest record of a key (by its last_unix_ns) is the whole truth and
// applying records again, or out of order, changes nothing. Records come from this instance's
// jobs (Charge), from the nodes topic every instance of a scaled-out daemon publishes to and
// reads whole (fleet/node_topic.h), and from the state store at startup (LoadFrom). Records whose
// last charge is older than `horizon` are forgotten; at most `max_records` are kept (the oldest
// go first).
//
// Delivery to the nodes topic (EnableOutbox, by the NodeTopic that publishes): each of this
// instance's charges is in an outbox until the topic acknowledged it (Delivered); the outbox is
// stored with the records (a marker per key), so a charge still undelivered when the daemon
// stopped or was killed is published again after the restart, once the view is complete (the
// newest record of its key then, whoever wrote it).
//
// The node alert of a node is raised by one instance only: the one that owns the telemetry
// partition the node's name hashes to (PartitionOfNode), so that a scaled-out daemon raises it
// once. Its lifecycle (each node's last transition) is stored with the alert and shared on the
// nodes topic too, so an instance that comes to own the node neither fires it again nor forgets
// to resolve it.
//
// Thread-safe: Charge, EvaluateAlerts and the Take* calls run on the ingest thread, Apply on the
// topic reader's thread, ListNodes and Top on gRPC, web and metrics threads.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "fleet/node_view.h"
#include "operators/alert_tracker.h"
#include "rankwatch/v1/service.pb.h"
#include "state/state_store.h"

namespace rankwatch {

struct NodeLedgerOptions {
  // Records whose last charge is older than this are forgotten. Default: 7 days.
  std::chrono::nanoseconds horizon = std::chrono::hours(24 * 7);
  // The node alert fires when a node was the culprit of at least `alert_jobs` different jobs
  // whose last charge lies within `alert_window`. Defaults: 3 jobs, 24 hours; 0 jobs: no alert.
  std::chrono::nanoseconds alert_window = std::chrono::hours(24);
  uint32_t alert_jobs = 3;
  // (node, job) records kept; beyond it the least recently charged go. Default: 100,000.
  size_t max_records = 100'000;
};

// The telemetry partition (of `partitions`) whose owner raises `node`'s alert: FNV-1a of the
// name, stable across builds and instances.
int32_t PartitionOfNode(const std::string& node, int32_t partitions);

// Store keys (StateFamily::kMetadata): one per record, and the node alerts' lifecycle.
inline constexpr std::string_view kNodeRecordKeyPrefix = "fleet/node/";
inline constexpr std::string_view kNodeAlertsKey = "fleet/alerts";
// Charges not yet acknowledged by the nodes topic: one key per (node, job), the value the
// last_unix_ns of the newest undelivered charge.
inline constexpr std::string_view kNodeOutboxKeyPrefix = "fleet/outbox/";

class NodeLedger : public NodeView {
 public:
  explicit NodeLedger(NodeLedgerOptions options);

  // The charges of this instance's jobs: applied, and kept for the nodes topic (TakeUnpublished)
  // and the store (TakeUnsaved).
  void Charge(const std::vector<NodeCharge>& charges);
  // A record as the nodes topic or the store has it (`node` and one `by_job`; or `node` alone,
  // the node alert's transition at last_unix_ns with alert_firing): applied when it is newer
  // than the one held. Kept for the store when it changed the view and `save` is set. Returns
  // whether it changed the view. A record without a node, or with an empty job, is ignored.
  bool Apply(const v1::NodeRecord& record, bool save = true);
  // Whether `record` is one Apply takes (a node and one job, or a node alert's transition).
  static bool Valid(const v1::NodeRecord& record);

  // Records changed since the previous call (newest of each key), for the nodes topic; after a
  // restart, once the view is complete, also the charges the outbox held undelivered.
  std::vector<v1::NodeRecord> TakeUnpublished();

  // The charges of this instance are published, and kept in the outbox until Delivered (call
  // before the first Charge; without it nothing is kept, and stored outbox markers go).
  void EnableOutbox();
  // The nodes topic acknowledged the charge of (`node`, `job`) made at `last_unix_ns`: it
  // leaves the outbox unless a newer one of the key waits. Any thread.
  void Delivered(const std::string& node, const std::string& job, int64_t last_unix_ns);
  // Charges waiting in the outbox.
  size_t undelivered() const;
  // Writes for the state store: records changed since the previous call, deletions of forgotten
  // ones. Empty when nothing changed.
  Checkpoint TakeUnsaved();
  // Reads every record the store holds, and the node alerts' lifecycle.
  absl::Status LoadFrom(const StateStore& store);

  // Forgets records older than the horizon as of `now_unix_ns`.
  void Prune(int64_t now_unix_ns);

  // The node alerts' transitions as of `now_unix_ns`: a node this instance `owns` whose jobs
  // within the alert window reach alert_jobs fires; a firing one below it resolves (also when
  // its records went past the horizon). Other instances' nodes are theirs. `state`, when
  // anything changed, gets the lifecycle to store with the alerts. Call only once the view is
  // complete (the nodes topic read to its end): a partial view must not resolve an alert.
  std::vector<v1::Alert> EvaluateAlerts(int64_t now_unix_ns,
                                        const std::function<bool(const std::string&)>& owns,
                                        Checkpoint* state);

  // Whether the view has read the nodes topic to its end (ListNodes says so).
  void SetComplete(bool complete);
  bool complete() const;

  // NodeView.
  v1::ListNodesResponse ListNodes(const v1::ListNodesRequest& request,
                                  int64_t now_unix_ns) const override;

  const NodeLedgerOptions& options() const { return options_; }
  size_t records() const;
  size_t firing() const;  // node alerts firing
  // Ids of the node alerts firing (whichever instance raised them).
  std::vector<std::string> FiringAlertIds() const;

 private:
  struct Node {
    std::map<std::string, v1::NodeJob> jobs;  // by training job
  };
  // Applies `job` to `node`; returns whether it changed the view.
  bool ApplyLocked(const std::string& node, const v1::NodeJob& job, bool save)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EraseLocked(const std::string& node, const std::string& job)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  v1::NodeRecord SummaryLocked(const std::string& node, const Node& n, int64_t now_unix_ns,
                               bool with_jobs) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  v1::Alert NodeAlert(const v1::NodeRecord& summary, v1::AlertState state,
                      int64_t now_unix_ns) const;

  const NodeLedgerOptions options_;
  mutable std::mutex mu_;
  std::map<std::string, Node> nodes_ ABSL_GUARDED_BY(mu_);
  // (last_unix_ns, node, job) of every record: the oldest first, for the bound.
  std::set<std::tuple<int64_t, std::string, std::string>> by_age_ ABSL_GUARDED_BY(mu_);
  std::set<std::pair<std::string, std::string>> unpublished_ ABSL_GUARDED_BY(mu_);
  std::set<std::pair<std::string, std::string>> unsaved_ ABSL_GUARDED_BY(mu_);
  std::set<std::pair<std::string, std::string>> forgotten_ ABSL_GUARDED_BY(mu_);
  // The outbox: (node, job) -> last_unix_ns of the newest charge not acknowledged; keys whose
  // stored marker must change; loaded keys to publish again once the view is complete.
  bool outbox_enabled_ ABSL_GUARDED_BY(mu_) = false;
  std::map<std::pair<std::string, std::string>, int64_t> outbox_ ABSL_GUARDED_BY(mu_);
  std::set<std::pair<std::string, std::string>> outbox_dirty_ ABSL_GUARDED_BY(mu_);
  std::set<std::pair<std::string, std::string>> outbox_to_republish_ ABSL_GUARDED_BY(mu_);
  // Each node alert's last transition (this instance's, or the owner's from the nodes topic).
  struct AlertMark {
    bool firing = false;
    int64_t at_unix_ns = 0;
  };
  std::map<std::string, AlertMark> alerts_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> alerts_unpublished_ ABSL_GUARDED_BY(mu_);
  bool alerts_unsaved_ ABSL_GUARDED_BY(mu_) = false;
  // Sets a node alert's mark; returns whether it changed.
  bool MarkLocked(const std::string& node, bool firing, int64_t at_unix_ns, bool publish)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PutAlertsLocked(Checkpoint* state) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  size_t FiringLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool complete_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace rankwatch
