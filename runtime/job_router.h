// JobRouter: the daemon's ingest stage without Kafka. It decodes and validates each message,
// dispatches its records to the PartitionTask of the message's partition (which owns the job's
// state), hands each batch to the parts' tick hooks, counts everything in the daemon metrics,
// and every tick publishes what the tasks evaluated: snapshots to the metrics, then to the
// SnapshotStore; then the tasks' alerts, which each hook may add to, to the AlertHub (one write
// per tick). Checkpoints are collected task by task (whole partitions: jobs and offset
// together), within a byte budget.
//
// Not thread-safe: owned by the ingest thread (the single owner of every task). Time comes in
// as arguments. HandleMessages may hand different partitions' messages to more threads of its
// own (options.ingest_threads) and returns when they are done: tasks are never shared between
// them, and the job table is changed under a lock; whatever needs the whole table (making room
// by eviction, a job whose records move to another partition) waits until they are done.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "common/log_throttle.h"
#include "ingest/batch_decoder.h"
#include "metrics/daemon_metrics.h"
#include "runtime/fork_join.h"
#include "runtime/partition_task.h"
#include "serving/snapshot_store.h"
#include "state/state_store.h"

namespace rankwatch {

struct JobRouterOptions {
  PartitionTaskOptions task;
  BatchLimits limits;
  // The job table's bounds: jobs, and ranks summed over their world sizes (each rank holds
  // ~2 KiB before its first step). A new job that does not fit evicts jobs that have not yet
  // completed `established_steps` steps — ids that are not (yet) jobs first (DaemonMetrics::
  // IsJob: no step of two ranks, nor enough steps: a flood of junk ids goes before a real job
  // that arrives during it), then those with the fewest batches, then the least recently heard
  // from — and is rejected (too_many_jobs) when none is left to evict. Defaults: 10,000 jobs,
  // 2^20 ranks, 10 steps.
  size_t max_jobs = 10'000;
  uint64_t max_ranks = 1u << 20;
  uint64_t established_steps = 10;
  std::string topic;  // the telemetry topic (names offsets in checkpoints)
  // Threads HandleMessages handles different partitions' messages on (the caller's included).
  // Default: 1, the caller's only.
  size_t ingest_threads = 1;
};

class JobRouter {
 public:
  // `sinks.metrics` and `sinks.snapshots` are required; the rest may be null. All outlive the
  // router.
  JobRouter(JobRouterOptions options, TaskSinks sinks);
  ~JobRouter();

  // Handles one message that came without a partition (tools, tests): its jobs belong to the
  // task of partition -1. `wall_now_unix_ns` is used for the lag metric and alert times.
  void HandleMessage(std::string_view payload, TimePoint now, int64_t wall_now_unix_ns);
  // Handles the message at `offset` of telemetry `partition`: its jobs belong to that
  // partition's task, and the next offset to consume there becomes part of its state.
  void HandleMessage(std::string_view payload, int32_t partition, int64_t offset, TimePoint now,
                     int64_t wall_now_unix_ns);
  // One telemetry message of a poll; its payload and key outlive HandleMessages. The key is the
  // producer's message key: the training job, for every producer of this project.
  struct Message {
    std::string_view payload;
    int32_t partition = 0;
    int64_t offset = 0;
    std::string_view key = {};
  };
  // Handles the messages of one poll as HandleMessage would: each partition's in order, at the
  // times the clocks give as each is handled. With options.ingest_threads > 1 and messages of
  // several partitions, the partitions are shared out between the threads, largest first.
  // Partitions whose keys are missing, or also found on another partition of the poll (a job
  // moving between partitions, which a thread could otherwise create on the wrong one), are
  // handled one message after another once the threads are done, in the order they came.
  void HandleMessages(const std::vector<Message>& messages, TimePoint (*steady_now)(),
                      int64_t (*wall_now_unix_ns)());

  // Expires jobs, closes alignment timeouts and evaluates the jobs that changed, then publishes
  // in this order: their snapshots to the metrics (those of ids that are jobs, step counts
  // last), then to the SnapshotStore; their alerts are evaluated; each part's tick hook, in
  // order, sees what the tick produced and may add to its alerts (parts/tick_hook.h); the alerts
  // go to the AlertHub. With `input_idle` (the ingest thread found no input to read: its time
  // is free), changed jobs do not wait for the fleet's share of the thread: each is
  // re-evaluated once ten times its own cost has passed (PartitionTask::Evaluate).
  void Tick(TimePoint now, int64_t wall_now_unix_ns, bool input_idle = false);

  // Adds to `checkpoint` the changes of the tasks that changed, whole tasks oldest-changed
  // first, until `max_bytes` (estimated) were collected — after the task that crossed it, so at
  // least one goes each call; the others keep their changes for a later call. With
  // `by_partition`, each task's part is also added there (for the state changelog; the task of
  // partition -1 is left out). Returns whether every change was collected.
  bool Checkpoint(rankwatch::Checkpoint* checkpoint, TimePoint now, int64_t wall_now_unix_ns,
                  std::map<int32_t, rankwatch::Checkpoint>* by_partition = nullptr,
                  size_t max_bytes = SIZE_MAX);

  // Rebuilds every job stored in `store` into the tasks of their partitions (at start).
  // Damaged state is an error.
  absl::Status Restore(const StateStore& store, TimePoint now, int64_t wall_now_unix_ns);

  // Rebuilds the task of `partition` from `store`, replacing the one in memory (the partition
  // was assigned to this instance). Damaged state is an error.
  absl::Status RestorePartition(const StateStore& store, int32_t partition, TimePoint now,
                                int64_t wall_now_unix_ns);

  // The state of `partition`'s task covers its input up to `offset` (where consumption
  // resumes), until a message there is consumed.
  // Alignment timeouts of its restored jobs run again from `now` on.
  void ResumedAt(int32_t partition, int64_t offset, TimePoint now) {
    TaskOf(partition).ResumeAt(offset, now);
  }

  // Drops the task of `partition`: its jobs leave memory, metrics and snapshots; their stored
  // state stays (another instance owns the partition now). Checkpoint first.
  void ReleasePartition(int32_t partition);
  // `partition` was assigned with no stored position: its input begins at `offset` (see
  // PartitionTask::StartsAt).
  void StartsAt(int32_t partition, int64_t offset) { TaskOf(partition).StartsAt(offset); }
  // `messages` of `partition` were lost before they were read, all produced before `log_end`:
  // its jobs are marked, and so are jobs first seen there before it reads up to `log_end`.
  void InputLost(int32_t partition, uint64_t messages, int64_t log_end);

  // The jobs of `partition`'s task.
  std::vector<std::string> JobsOf(int32_t partition) const;
  // Partitions with a task (-1 for messages without one).
  std::set<int32_t> Partitions() const;
  // The offset the state of `partition` covers: the next to consume, or where it resumed.
  std::optional<int64_t> CoveredOffset(int32_t partition) const;

  size_t jobs() const { return job_partition_.size(); }
  // Ranks summed over the world sizes of the jobs in the table.
  uint64_t ranks() const { return total_ranks_; }

  // Whether this instance owns telemetry partition `partition` now.
  bool Owns(int32_t partition) const { return tasks_.count(partition) > 0; }

 private:
  struct Entry {
    int32_t partition = -1;
    uint32_t world_size = 0;
    bool provisional = true;  // not yet established_steps complete steps: may be evicted
    bool job = false;         // a job by DaemonMetrics::IsJob when last keyed (provisional)
    uint32_t batches = 0;     // accepted while provisional (capped)
    TimePoint last_input{};
  };
  using Index = std::map<std::string, Entry, std::less<>>;
  // Eviction order of provisional jobs: ids that are not (yet) jobs, then fewest batches, then
  // least recent input.
  using EvictionKey = std::tuple<bool, uint32_t, TimePoint, std::string>;

  // What one thread of HandleMessages decodes into.
  struct Lane {
    v1::Batch batch;
    std::string detail;
    DecodeNotes notes;
  };

  PartitionTask& TaskOf(int32_t partition);
  void Route(int32_t partition, const Lane& lane, TimePoint now, int64_t wall_now_unix_ns);
  // Route on a thread of HandleMessages: false, with nothing changed, when the batch needs the
  // whole table (room to make, a job that moved from another task).
  bool RouteInLane(PartitionTask& task, const Lane& lane, TimePoint now, int64_t wall_now_unix_ns);
  // After `task` took a batch of job `known`: its world size and whether it is established.
  void Routed(Index::iterator known, const PartitionTask& task, TimePoint now);
  void CountBatch(const Lane& lane, int64_t wall_now_unix_ns);
  void Rejected(RejectReason reason, TimePoint now, const std::string& detail);
  bool Fits(size_t jobs, uint64_t ranks) const {
    return job_partition_.size() + jobs <= options_.max_jobs &&
           total_ranks_ + ranks <= options_.max_ranks;
  }
  // Makes room for `jobs` more jobs and `ranks` more ranks by evicting provisional jobs other
  // than `keep`; false when it cannot.
  bool MakeRoom(size_t jobs, uint64_t ranks, std::string_view keep, TimePoint now);
  void Evict(Index::iterator it);
  // Adds or replaces the index entry of a job (restored or routed).
  Index::iterator Track(const std::string& name, int32_t partition, uint32_t world_size,
                        bool provisional, TimePoint now);
  void Track(const state::v1::JobMeta& meta, int32_t partition, TimePoint now);
  void Untrack(Index::iterator it);
  void SetProvisional(Index::iterator it, bool provisional, uint32_t batches, TimePoint now);

  const JobRouterOptions options_;
  const TaskSinks sinks_;
  BatchDecoder decoder_;
  // Reused decode targets: [0] the calling thread's, then one per thread of HandleMessages.
  std::vector<Lane> lanes_;
  std::unique_ptr<ForkJoin> fork_join_;  // with options.ingest_threads > 1
  // While HandleMessages' threads run: guards the job table (job_partition_, total_ranks_,
  // provisional_, provisional_ranks_) and the reject logs.
  std::mutex table_mu_;
  std::map<int32_t, std::unique_ptr<PartitionTask>> tasks_;
  Index job_partition_;  // every job: its task, world size and eviction state
  uint64_t total_ranks_ = 0;
  std::set<EvictionKey> provisional_;
  uint64_t provisional_ranks_ = 0;  // ranks of the provisional jobs
  // Log lines for rejected input: at most one per reason a minute, with the count since.
  std::array<LogThrottle, kRejectReasonCount + 1> reject_log_;  // the last: too_many_jobs
  uint64_t evicted_since_log_ = 0;
  // Checkpoint calls so far, and per task with uncollected changes the call that first saw
  // them (the order budgeted checkpoints collect tasks in).
  uint64_t checkpoint_calls_ = 0;
  Duration evaluation_costs_{};  // of every job, as of the last Tick (PartitionTask::Evaluate)
  std::map<int32_t, uint64_t> changed_since_;
  MetricCell* rejected_too_many_jobs_;
};

}  // namespace rankwatch
