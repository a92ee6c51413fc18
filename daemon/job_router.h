// JobRouter: the daemon's ingest stage without Kafka — decodes each message, routes its
// records to the job's pipeline (created on first sight), counts everything in the daemon
// metrics, and publishes job snapshots.
//
// Not thread-safe: owned by the ingest thread (the single owner of every job's state).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "ingest/batch_decoder.h"
#include "operators/job_pipeline.h"
#include "sinks/alert_hub.h"
#include "sinks/daemon_metrics.h"
#include "sinks/snapshot_store.h"
#include "state/state_store.h"

namespace rankwatch {

class KernelStage;

struct JobRouterOptions {
  JobPipelineOptions pipeline;
  BatchLimits limits;
  size_t max_jobs = 10'000;  // default: 10,000; batches of further jobs are rejected
  // A job without input for this long is finished: its last diagnosis is frozen and stays
  // queryable for `job_retention`, then the job, its metrics and its state are removed.
  // Defaults: 1 h each. Input for an expired job brings it back.
  Duration job_ttl = std::chrono::hours(1);
  Duration job_retention = std::chrono::hours(1);
  AlertOptions alerts;
  // Called when storing alerts fails (the daemon reports it like a failed checkpoint).
  std::function<void(const absl::Status&)> on_storage_error;
};

class JobRouter {
 public:
  // `alert_hub` (may be null) stores and publishes the alerts.
  JobRouter(JobRouterOptions options, DaemonMetrics* metrics, SnapshotStore* snapshots,
            AlertHub* alert_hub = nullptr);

  // Handles one Kafka message. `wall_now_unix_ns` is used for the lag metric only.
  void HandleMessage(std::string_view payload, TimePoint now, int64_t wall_now_unix_ns);
  // The same for a message at `offset` of `partition` of `topic`: the next offset to consume
  // there becomes part of the state (requires options.pipeline.record_changes for durability).
  void HandleMessage(std::string_view payload, const std::string& topic, int32_t partition,
                     int64_t offset, TimePoint now, int64_t wall_now_unix_ns);

  // Adds to `checkpoint` the jobs' changes since the previous call and the next offsets of the
  // partitions consumed. Stored steps that no window needs any more are deleted. Step and job
  // values are deferred (serialised by whoever writes the checkpoint), so this is cheap. With
  // `by_partition`, each job's writes are also added there under its telemetry partition
  // (for the state changelog; jobs of an unknown partition are left out).
  //
  // Changes are collected by telemetry partition: all changed and removed jobs of a partition
  // together with its next offset (what keeps recovery exact); jobs of an unknown partition
  // (-1) are one more group. Groups go oldest-changed first, and collection stops once
  // `max_bytes` (estimated) were collected — after the group that crossed it, so at least one
  // group goes each call. The other groups keep their changes and their offsets for a later
  // call. Returns whether every change was collected.
  bool Checkpoint(Checkpoint* checkpoint, TimePoint now, int64_t wall_now_unix_ns,
                  std::map<int32_t, rankwatch::Checkpoint>* by_partition = nullptr,
                  size_t max_bytes = SIZE_MAX);

  // Rebuilds every job stored in `store` (at start). Damaged state is an error.
  absl::Status Restore(const StateStore& store, TimePoint now, int64_t wall_now_unix_ns);

  // Rebuilds the jobs of one telemetry partition from `store`, replacing those in memory
  // (the partition was assigned to this instance). Damaged state is an error.
  absl::Status RestorePartition(const StateStore& store, int32_t partition, TimePoint now,
                                int64_t wall_now_unix_ns);

  // Drops the jobs of `partition` from memory, metrics and snapshots without touching their
  // stored state (another instance owns the partition now). Checkpoint first.
  void ReleasePartition(int32_t partition);

  // The jobs known to arrive on `partition`.
  std::vector<std::string> JobsOf(int32_t partition) const;

  // Partitions of the jobs in memory (-1 for jobs of an unknown partition).
  std::set<int32_t> Partitions() const;

  // The next offset to consume in (topic, partition), when something was consumed there.
  std::optional<int64_t> NextOffset(const std::string& topic, int32_t partition) const;

  // Expires alignment timeouts and publishes snapshots of the jobs that changed: first to the
  // SnapshotStore, then to the metrics.
  void Tick(TimePoint now);

  size_t jobs() const { return jobs_.size(); }

  // Also feeds every batch to `stage` (kernel events, issue #6), publishes it at Tick and drops
  // its jobs with the router's. Null (the default): no kernel stage. The stage outlives the router.
  void SetKernelStage(KernelStage* stage) { kernel_ = stage; }

 private:
  struct Job {
    std::unique_ptr<JobPipeline> pipeline;
    MetricCell* steps_aligned;
    MetricCell* steps_timed_out;
    // Aligned since the last publication: counted at Tick together with the snapshot, so a
    // scrape never sees a step count ahead of the statistics of those steps.
    uint32_t unpublished_aligned = 0;
    uint32_t unpublished_timed_out = 0;
    bool dirty = true;
    bool unsaved = true;  // changed since the last checkpoint
    TimePoint published_at{};
    Duration evaluation_cost{};  // of the last snapshot (bounds how often it is re-evaluated)
    TimePoint last_input{};
    bool expired = false;
    TimePoint expired_at{};
    int32_t partition = -1;  // telemetry partition, -1 while unknown
    bool alerts_unsaved = false;  // alert lifecycle changed since the last checkpoint
    int64_t triggered_unix_ns = 0;  // wall clock of the newest step aligned since evaluation
  };

  Job* FindOrCreate(const v1::SourceIdentity& source, TimePoint now);
  Job& Insert(const std::string& name, std::unique_ptr<JobPipeline> pipeline, TimePoint now);
  void ExpireJobs(TimePoint now);
  // Rebuilds the stored jobs `accept` selects (by their metadata), replacing those in memory.
  absl::Status RestoreJobs(const StateStore& store, TimePoint now, int64_t wall_now_unix_ns,
                           const std::function<bool(const state::v1::JobMeta&)>& accept);
  void Drop(std::map<std::string, Job, std::less<>>::iterator it);
  void Publish(const std::vector<AlertEvent>& events, const std::string& job, int64_t triggered);
  void Count(Job& job, const JobDelta& delta, int64_t wall_now_unix_ns);

  const JobRouterOptions options_;
  DaemonMetrics* metrics_;
  SnapshotStore* snapshots_;
  AlertHub* alert_hub_;
  BatchDecoder decoder_;
  v1::Batch batch_;  // reused decode target
  std::string detail_;
  std::map<std::string, Job, std::less<>> jobs_;
  std::map<std::pair<std::string, int32_t>, int64_t> next_offsets_;  // (topic, partition)
  // State to delete at the next checkpoint: job and its partition.
  std::vector<std::pair<std::string, int32_t>> removed_jobs_;
  int32_t current_partition_ = -1;  // of the message being handled
  // Checkpoint calls so far, and per partition with uncollected changes the call that first
  // saw them (the order budgeted checkpoints collect partitions in).
  uint64_t checkpoint_calls_ = 0;
  std::map<int32_t, uint64_t> changed_since_;
  AlertTracker alerts_;
  MetricCell* rejected_too_many_jobs_;
  KernelStage* kernel_ = nullptr;  // issue #6
};

}  // namespace rankwatch
