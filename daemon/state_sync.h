// StateSync: keeps rankwatchd's state durable and lets telemetry partitions move between
// daemon instances of one consumer group.
//
// A checkpoint writes the JobRouter's changes and the offsets they cover to the local
// StateStore in one batch; with a StateChangelog it also appends each partition's part there
// (the whole partition when the changelog asks for a snapshot). On assignment a partition's
// state comes from whichever of the local store and the changelog covers more input — the
// changelog after another instance owned the partition, the local store after a restart of
// this one — and consumption resumes at the offset that state covers. On revocation the
// partition is checkpointed, the changelog flushed, and its jobs released.
//
// After a storage error the sync stops checkpointing for good (`on_failure` runs once).
//
// Not thread-safe: owned by the ingest thread (Kafka's rebalance callbacks run there too).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "daemon/job_router.h"
#include "ingest/state_changelog.h"
#include "sinks/daemon_metrics.h"
#include "state/state_store.h"

namespace rankwatch {

class StateSync {
 public:
  // `changelog` may be null (a single instance). `on_failure` receives the first storage error.
  StateSync(std::string topic, StateStore* store, StateChangelog* changelog, JobRouter* router,
            DaemonMetrics* metrics, std::function<void(const absl::Status&)> on_failure);

  // Restores every job of the local store (at start, before the group assigns anything), so
  // diagnoses are served at once. Damaged state is an error.
  absl::Status RestoreAll(TimePoint now, int64_t wall_now_unix_ns);

  // Writes a checkpoint. A no-op after a storage error.
  void Checkpoint(TimePoint now, int64_t wall_now_unix_ns);

  // `partitions` of the telemetry topic were assigned: restores their state and returns, per
  // partition, the offset to resume at (nullopt: no state; Kafka's committed offset applies).
  std::vector<std::optional<int64_t>> OnAssigned(const std::vector<int32_t>& partitions,
                                                 TimePoint now, int64_t wall_now_unix_ns);

  // `partitions` were revoked (or lost): checkpoints, flushes the changelog, releases them.
  void OnRevoked(const std::vector<int32_t>& partitions, TimePoint now, int64_t wall_now_unix_ns);

  bool failed() const { return failed_; }

  // A write elsewhere (the alert log) failed: the same sticky failure as a checkpoint's.
  void ReportFailure(const absl::Status& status);

 private:
  std::optional<int64_t> Assign(int32_t partition, TimePoint now, int64_t wall_now_unix_ns);
  // Replaces the local store's state of `partition` by the changelog's.
  absl::Status Adopt(int32_t partition, const ChangelogPartition& from);
  // The stored state of the jobs of `partition`, as puts.
  absl::Status FullState(int32_t partition, rankwatch::Checkpoint* out) const;
  void Fail(const absl::Status& status);

  const std::string topic_;
  StateStore* store_;
  StateChangelog* changelog_;
  JobRouter* router_;
  DaemonMetrics* metrics_;
  std::function<void(const absl::Status&)> on_failure_;
  bool failed_ = false;
  bool assigned_once_ = false;
  std::set<int32_t> owned_;
  // Partitions whose jobs in memory equal the local store (restored at start, untouched since).
  std::set<int32_t> restored_at_start_;
  std::map<int32_t, int64_t> resumed_at_;  // offset each owned partition resumed at
};

}  // namespace rankwatch
