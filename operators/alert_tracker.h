// AlertTracker: turns diagnoses into alerts with a lifecycle (docs/spec/step-diagnosis.md §6):
// `pending` when a condition is first seen, `firing` once it held for `fire_after` consecutive
// evaluations, `resolved` after `resolve_after` consecutive clean ones. One alert per
// (job, kind, subject) fingerprint — the subject is the culprit rank or node, the what-if's
// imbalanced pipeline stage, or the job — and
// an active fingerprint never fires twice. Every event carries this tracker's own strictly
// increasing sequence number, which only orders its events; the sequence subscribers see is
// the AlertHub's (alerting/alert_hub.h), assigned when the alerts are stored.
//
// Pure: a function of the snapshots it is given. Not thread-safe: one tracker per
// PartitionTask (runtime/partition_task.h), owned by the ingest thread.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "operators/job_pipeline.h"

namespace rankwatch {

enum class AlertKind : uint8_t {
  kStraggler,
  kHang,
  kMemoryCreep,
  kMemoryPressure,
  kMemoryImbalance,
  kInputBound,
  kWaitHeavy,
};
std::string_view AlertKindName(AlertKind kind);  // "straggler", "hang", ...

enum class AlertState : uint8_t { kPending, kFiring, kResolved };
std::string_view AlertStateName(AlertState state);

struct AlertOptions {
  uint32_t fire_after = 3;      // consecutive evaluations before firing; default 3
  uint32_t resolve_after = 10;  // consecutive clean evaluations before resolving; default 10
};

struct AlertEvent {
  std::string id;  // fingerprint "job|kind|subject"
  uint64_t sequence = 0;
  std::string training_job;
  AlertKind kind = AlertKind::kStraggler;
  std::string subject;  // "rank:17", "node:node-2", "stage:3" (what-if) or "job"
  AlertState state = AlertState::kPending;
  Severity severity = Severity::kWarn;
  StragglerCause cause = StragglerCause::kNone;
  int64_t at_unix_ns = 0;
  bool fired = false;  // this fingerprint reached firing (a resolved one that never did is noise)
  // The snapshot whose diagnosis raised (or last confirmed) the alert.
  std::shared_ptr<const JobSnapshot> evidence;
};

// What one node cost one job while a straggler alert of the job named it (the node, or one of
// its ranks): the job's share of the fleet view of nodes (fleet/node_ledger.h). Totals since
// the job started; they only grow, so a reader may keep the newest and forget the rest.
struct NodeCharge {
  std::string training_job;
  std::string node;
  uint32_t episodes = 0;              // straggler alerts naming the node that fired
  double lost_rank_seconds = 0;       // what the job lost to the node while they fired
  int64_t first_unix_ns = 0;          // the first of them fired
  int64_t last_unix_ns = 0;           // the newest evaluation that changed this charge
  std::vector<uint32_t> ranks;        // culprit ranks on the node, ascending, at most kMaxRanks
  bool firing = false;                // a straggler alert naming the node fires now
  uint64_t charged_through_step = 0;  // the newest step charged
  std::string k8s_namespace;          // the job's namespace, when its collectors say
  static constexpr size_t kMaxRanks = 16;
};

class AlertTracker {
 public:
  explicit AlertTracker(AlertOptions options = {}, uint64_t next_sequence = 1)
      : options_(options), next_sequence_(next_sequence) {}

  // Evaluates one job's current diagnoses and returns the lifecycle transitions they cause,
  // in sequence order.
  std::vector<AlertEvent> Evaluate(std::shared_ptr<const JobSnapshot> snapshot,
                                   int64_t wall_now_unix_ns);

  // Forgets a job (it was removed): its active alerts resolve.
  std::vector<AlertEvent> ForgetJob(const std::string& training_job, int64_t wall_now_unix_ns);

  // Forgets a job without events: its alerts moved to another daemon instance with it.
  void DropJob(const std::string& training_job);

  // The lifecycle state of one job's active alerts (to store with the job), and its restore
  // (after a restart, or on the instance the job moved to). Evidence is not stored: the next
  // evaluation brings it. The state also names the last step evaluated: after a restore,
  // snapshots whose window ends before it (the input replayed from an older checkpoint, whose
  // transitions are already in the alert log) are not evaluated again, so a replay neither
  // fires again an alert that resolved before the restart nor counts its evaluations twice.
  // Should the input between the checkpoint and that step be gone (Kafka's retention), the
  // job's alerts stay as restored until its steps reach that step, or the job is removed.
  state::v1::AlertTrackerState ExportJob(const std::string& training_job) const;
  void RestoreJob(const state::v1::AlertTrackerState& state);

  // The node charges that changed since the previous call (those of forgotten jobs first, then
  // in (job, node) order). A straggler
  // alert whose subject is a node, or a rank whose node is known, charges that node: an episode
  // when it fires, and while it fires and the job's diagnosis still names the node, the steps'
  // lost rank-seconds (the straggler test's cost per step, or a pipeline job's what-if loss).
  std::vector<NodeCharge> TakeNodeCharges();
  // One job's charges (tests, queries).
  std::vector<NodeCharge> NodeCharges(const std::string& training_job) const;

  // Firing alerts of one job, per kind.
  std::map<AlertKind, int> Firing(const std::string& training_job) const;

  uint64_t next_sequence() const { return next_sequence_; }
  size_t active() const { return active_.size(); }

 private:
  struct Active {
    AlertEvent last;           // the latest event of this fingerprint
    uint32_t consecutive = 0;  // evaluations it held in a row
    uint32_t clean = 0;        // evaluations it was absent in a row
  };

  AlertEvent Emit(Active& a, AlertState state, int64_t at);
  // Charges the nodes of the job's firing straggler alerts for the evaluation of `snapshot`;
  // `seen`: the job's alerts ("kind|subject") whose condition held in it.
  void ChargeNodes(const JobSnapshot& snapshot, const std::set<std::string>& seen, int64_t now);
  void EraseCharges(const std::string& training_job);

  const AlertOptions options_;
  uint64_t next_sequence_;
  // By (job, "kind|subject"): one job's alerts are contiguous whatever its name contains.
  std::map<std::pair<std::string, std::string>, Active> active_;
  // Per job: the last step of the window last evaluated (jobs with a nonempty window).
  std::map<std::string, uint64_t> evaluated_through_;
  // Per restored job, until an evaluation reaches it: the step evaluated through before.
  std::map<std::string, uint64_t> replayed_before_;
  // By (job, node).
  std::map<std::pair<std::string, std::string>, NodeCharge> charges_;
  std::set<std::pair<std::string, std::string>> charges_changed_;
  std::vector<NodeCharge> forgotten_charges_;  // of forgotten jobs, until taken
};

}  // namespace rankwatch
