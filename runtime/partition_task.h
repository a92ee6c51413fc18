// PartitionTask: the unit of state and ownership in rankwatchd, as a Kafka Streams task. There
// is one per telemetry partition this instance consumes (and one, partition -1, for messages
// handed in without a partition: tools and tests). A task owns the jobs whose records arrive on
// its partition — each job's operator pipeline (operators/job_pipeline.h), its alert lifecycle
// state (operators/alert_tracker.h) and its kernel accumulator (operators/kernel/) — and the
// next offset to consume there. It is checkpointed and restored as one unit: a task's checkpoint
// holds every changed job of it together with its offset, which keeps recovery exact (a
// restarted or new owner resumes at the offset the restored jobs cover).
//
// Kernel accumulators are kept in memory only: after a restore the GPU-timeline results start
// again from the batches consumed since.
//
// Not thread-safe: owned by the ingest thread, through JobRouter. Time comes in as arguments;
// only `options.stopwatch` is read, to measure how long evaluations take.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "alerting/alert_hub.h"
#include "metrics/daemon_metrics.h"
#include "operators/alert_tracker.h"
#include "operators/job_pipeline.h"
#include "operators/kernel/kernel_accumulator.h"
#include "operators/time.h"
#include "parts/tick_hook.h"
#include "serving/kernel_snapshot_store.h"
#include "serving/snapshot_store.h"
#include "state/job_state_store.h"
#include "state/state_store.h"

namespace rankwatch {

struct PartitionTaskOptions {
  JobPipelineOptions pipeline;
  AlertOptions alerts;
  kernel::KernelAccumulatorOptions kernel;
  // A job without input for this long is finished: its last diagnosis is frozen and stays
  // queryable for `job_retention`, then the job, its metrics and its state are removed.
  // Defaults: 1 h each. Input for an expired job brings it back.
  Duration job_ttl = std::chrono::hours(1);
  Duration job_retention = std::chrono::hours(1);
  // Measures how long a job's evaluation takes (a job evaluated at a cost is re-evaluated at
  // most every ten times that cost). Default: the steady clock.
  TimePoint (*stopwatch)() = &Clock::now;
};

// Where tasks publish. Every pointer outlives the tasks; metrics and snapshots are required.
struct TaskSinks {
  DaemonMetrics* metrics = nullptr;
  SnapshotStore* snapshots = nullptr;
  AlertHub* alert_hub = nullptr;                    // null: alerts are not stored or published
  KernelSnapshotStore* kernel_snapshots = nullptr;  // null: kernel results are not served
  // The daemon's parts' tick hooks (parts/tick_hook.h), in the order they are called: each
  // gets every batch, and what each tick produced — where it may add to the tick's alerts.
  // Empty: none.
  std::vector<TickHook*> hooks = {};
};

// What the tasks' evaluations of one tick produced, published by the router: new snapshots
// first (to the metrics, then the SnapshotStore), then the alerts (with what the hooks add,
// stored, then published by the AlertHub together with the lifecycle state of their jobs).
struct TickOutput {
  std::vector<std::shared_ptr<const JobSnapshot>> snapshots;
  std::vector<std::string> removed_snapshots;  // jobs dropped since the last tick
  std::vector<v1::Alert> alerts;
  Checkpoint alert_states;
  std::vector<NodeCharge> node_charges;  // what the straggler alerts charged their nodes
};

class PartitionTask {
 private:
  struct Job;

 public:
  // `options` and `sinks` outlive the task.
  PartitionTask(int32_t partition, const PartitionTaskOptions* options, const TaskSinks* sinks);
  ~PartitionTask();
  PartitionTask(const PartitionTask&) = delete;
  PartitionTask& operator=(const PartitionTask&) = delete;

  int32_t partition() const { return partition_; }

  // Whether the task owns `job`.
  bool Has(const std::string& job) const { return jobs_.count(job) > 0; }

  // Adds a validated batch to its job (created when new) and counts its deltas.
  void Add(const v1::Batch& batch, TimePoint now, int64_t wall_now_unix_ns);

  // The message at `offset` was consumed (accepted or not): the next offset to consume is
  // part of the task's state from now on.
  void Consumed(int64_t offset);
  // The partition came to this task with no stored position: its input begins at `offset`
  // (the group's committed offset, or the log's end when it was assigned). That is the next
  // offset to consume, stored at the next checkpoint, until a message is consumed — so a
  // restart before the first read still knows where its input began.
  void StartsAt(int64_t offset);
  // `messages` of this partition were lost before they were read, all produced before offset
  // `log_end`: every job on it is marked (its records may be among them) and re-evaluated, and
  // so is each job first seen here before the task has consumed up to `log_end` (a job whose
  // first records were among them: after a loss before the first read, every job).
  void InputLost(uint64_t messages, int64_t log_end);
  std::optional<int64_t> next_offset() const { return next_offset_; }
  // The offset a restored state covers, until something is consumed. The partition is read
  // again from `now` on: alignment timeouts, held since the restore, run again (Restore).
  void ResumeAt(int64_t offset, TimePoint now);
  // The offset the task's state covers: the next one to consume, or where it resumed.
  std::optional<int64_t> covered_offset() const {
    return next_offset_ ? next_offset_ : resumed_at_;
  }

  // Moves `job` with everything it has in memory to task `to` (its records arrive on another
  // partition now). Its metrics stay; its stored metadata names the new partition at the next
  // checkpoint. A no-op when the task does not own it.
  void MoveJob(const std::string& job, PartitionTask* to);

  // Forgets `job` in memory only (metrics and snapshots stay: another task restores it).
  void Forget(const std::string& job);
  // Removes `job` for good to make room in a full job table: from memory, the sinks, and the
  // state store at the next checkpoint.
  void Evict(const std::string& job);

  // The job's current world size and its complete steps (0 for a job the task does not own).
  uint32_t WorldSizeOf(const std::string& job) const;
  uint64_t CompleteStepsOf(const std::string& job) const;

  // Expires silent jobs, removes those past their retention (their alerts resolve), closes
  // alignment timeouts and evaluates the jobs that changed (re-evaluating silent ones every
  // second: silence is itself a diagnosis). New snapshots go to `out->snapshots`; kernel
  // results are published. A changed job is re-evaluated at most every ten times the larger of
  // its own evaluation's cost and `fleet_evaluation_cost` (what evaluating every job of the
  // daemon once costs), so that evaluations take at most ~10% of the ingest thread however
  // many jobs change.
  void Evaluate(TimePoint now, int64_t wall_now_unix_ns, TickOutput* out,
                Duration fleet_evaluation_cost = {});
  // Evaluate in three parts, for evaluations on several threads: PlanEvaluation does all but
  // the snapshots, and lists the jobs due; each DueEvaluation's Run (on any thread, each job on
  // one) takes its snapshot; FinishEvaluation publishes them in the listed order.
  struct DueEvaluation;
  void PlanEvaluation(TimePoint now, int64_t wall_now_unix_ns, TickOutput* out,
                      Duration fleet_evaluation_cost, std::vector<DueEvaluation>* due);
  void FinishEvaluation(int64_t wall_now_unix_ns, std::vector<DueEvaluation>* due, TickOutput* out);
  // The sum of the last evaluation's cost of every job (as of the last Evaluate).
  Duration evaluation_costs() const { return evaluation_costs_; }

  // After the router published the snapshots of the last Evaluate (their step counts last,
  // DaemonMetrics::PublishJob): evaluates their alerts (into `out`).
  void RaiseAlerts(int64_t wall_now_unix_ns, TickOutput* out);

  // Whether something changed since the last checkpoint.
  bool changed() const;

  // Adds every change since the previous call to `out` — changed jobs, removed jobs, alert
  // lifecycle state. They cover the input up to next_offset(), which the caller stores in the
  // same write. Values are deferred (serialised by whoever writes the checkpoint), so this is
  // cheap.
  void Checkpoint(TimePoint now, int64_t wall_now_unix_ns, rankwatch::Checkpoint* out);

  // Rebuilds stored jobs into the task (at start, or when the partition is assigned).
  absl::Status Restore(std::vector<job_state::StoredJob> jobs, TimePoint now,
                       int64_t wall_now_unix_ns);

  // Forgets every job (the partition moved to another instance): their metrics, snapshots,
  // kernel results and firing alerts go; their stored state stays.
  void Release();

  // Jobs removed (retention over) since the last call: the router drops them from its index.
  std::vector<std::string> TakeRemoved() { return std::exchange(just_removed_, {}); }
  // Jobs dropped from memory since the last call, whose snapshots must go: removed together
  // at the next publication (one copy of the SnapshotStore's map per tick, not per job).
  void TakeDroppedSnapshots(std::vector<std::string>* out) {
    out->insert(out->end(), std::make_move_iterator(dropped_snapshots_.begin()),
                std::make_move_iterator(dropped_snapshots_.end()));
    dropped_snapshots_.clear();
  }

  // A job's evaluation that PlanEvaluation found due.
  struct DueEvaluation {
    Job* job = nullptr;
    const JobPipeline* pipeline = nullptr;
    std::shared_ptr<JobSnapshot> snapshot;  // Run's
    Duration cost{};                        // Run's, by `stopwatch`
    void Run(TimePoint now, TimePoint (*stopwatch)());
  };

  std::vector<std::string> JobNames() const;
  size_t jobs() const { return jobs_.size(); }
  const AlertTracker& alerts() const { return alerts_; }

 private:
  Job& Insert(const std::string& name, std::unique_ptr<JobPipeline> pipeline, TimePoint now);
  void Count(Job& job, const JobDelta& delta, int64_t wall_now_unix_ns);
  // The partition is read again after a restore: restored open steps' timeouts run again,
  // moved later by the time they were held.
  void ReadAgain(TimePoint now);
  void Expire(TimePoint now, int64_t wall_now_unix_ns, TickOutput* out);
  // Forgets a job in memory and in the sinks (not its stored state).
  void Drop(std::map<std::string, std::unique_ptr<Job>, std::less<>>::iterator it);
  void ToAlerts(const std::vector<AlertEvent>& events, const std::string& job, int64_t triggered,
                TickOutput* out);

  const int32_t partition_;
  const PartitionTaskOptions* options_;
  const TaskSinks* sinks_;
  std::map<std::string, std::unique_ptr<Job>, std::less<>> jobs_;
  AlertTracker alerts_;
  std::optional<int64_t> next_offset_;
  std::optional<int64_t> resumed_at_;
  // Since a restore, until the partition is read again (ResumeAt): the restored jobs' open
  // steps wait for records the daemon cannot read yet, so their alignment timeouts are held
  // (a restart's rejoin took 8-15 s in the soak, longer than the 10-s timeout).
  std::optional<TimePoint> restored_unread_since_;
  bool offset_unsaved_ = false;
  // Messages lost that jobs first seen before next_offset_ reaches `until` are marked with.
  struct RecentLoss {
    uint64_t messages = 0;
    int64_t until = 0;
  };
  std::optional<RecentLoss> recent_loss_;
  std::vector<std::string> removed_;       // state to delete at the next checkpoint
  std::vector<std::string> just_removed_;  // removed since the last TakeRemoved
  std::vector<std::string> dropped_snapshots_;
  Duration evaluation_costs_{};  // see evaluation_costs()
  // Evaluated by the last Evaluate, for RaiseAlerts: (job, its new snapshot).
  std::vector<std::pair<Job*, std::shared_ptr<const JobSnapshot>>> evaluated_;
};

}  // namespace rankwatch
