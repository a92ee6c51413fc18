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
// Checkpoints are written by a CheckpointWriter thread: the ingest thread only collects the
// changes (JobRouter::Checkpoint, values deferred) and queues them, so the serialisation, the
// RocksDB write and its fsync do not pause ingestion. A periodic checkpoint collects at most
// `checkpoint_max_bytes` (whole partitions, oldest-changed first); a large backlog, such as the
// first checkpoint after a restart, spreads over several intervals. A partition's changelog
// append runs on the writer thread right after the commit it covers (full snapshots read the
// store). Assignment, revocation and shutdown first wait for the writer to drain.
//
// After a storage error the sync stops checkpointing for good (`on_failure` runs once, on
// whichever thread saw the error: it must be thread-safe).
//
// Not thread-safe: owned by the ingest thread (Kafka's rebalance callbacks run there too).
#pragma once

#include <atomic>
#include <cstddef>
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
#include "state/checkpoint_writer.h"
#include "state/state_store.h"

namespace rankwatch {

struct StateSyncOptions {
  // Estimated bytes a periodic checkpoint collects on the ingest thread (whole partitions, so
  // one large partition may exceed it). Default: 16 MiB, about 10-20 ms of collection and well
  // under a second of writing.
  size_t checkpoint_max_bytes = size_t{16} << 20;
  CheckpointWriterOptions writer;
};

class StateSync {
 public:
  // `changelog` may be null (a single instance). `on_failure` receives the first storage error.
  StateSync(std::string topic, StateStore* store, StateChangelog* changelog, JobRouter* router,
            DaemonMetrics* metrics, std::function<void(const absl::Status&)> on_failure,
            StateSyncOptions options = {});
  // Waits for the queued checkpoints to be written.
  ~StateSync();

  // Restores every job of the local store (at start, before the group assigns anything), so
  // diagnoses are served at once. Damaged state is an error.
  absl::Status RestoreAll(TimePoint now, int64_t wall_now_unix_ns);

  // Queues a checkpoint of at most `checkpoint_max_bytes` of changes (blocking while the writer
  // is `writer.max_queued` checkpoints behind). Returns whether every change was collected. A
  // no-op after a storage error.
  bool Checkpoint(TimePoint now, int64_t wall_now_unix_ns);

  // When the last checkpoint left changes for later and the writer is idle, queues another
  // budget's worth at once (so a large backlog is written at the disk's pace, not one budget
  // per interval). Cheap otherwise: call it every loop.
  void CatchUp(TimePoint now, int64_t wall_now_unix_ns);

  // At shutdown: checkpoints every change and waits until it is written.
  void Shutdown(TimePoint now, int64_t wall_now_unix_ns);

  // Waits until every checkpoint queued so far is written (or dropped after an error).
  void WaitForWriter();

  // `partitions` of the telemetry topic were assigned: restores their state and returns, per
  // partition, the offset to resume at (nullopt: no state; Kafka's committed offset applies).
  std::vector<std::optional<int64_t>> OnAssigned(const std::vector<int32_t>& partitions,
                                                 TimePoint now, int64_t wall_now_unix_ns);

  // `partitions` were revoked (or lost): checkpoints, flushes the changelog, releases them.
  void OnRevoked(const std::vector<int32_t>& partitions, TimePoint now, int64_t wall_now_unix_ns);

  bool failed() const { return failed_; }
  // Whether the last checkpoint left changes for later (CatchUp will collect them).
  bool backlog() const { return backlog_; }

  // A write elsewhere (the alert log) failed: the same sticky failure as a checkpoint's.
  void ReportFailure(const absl::Status& status);

 private:
  bool Collect(TimePoint now, int64_t wall_now_unix_ns, size_t max_bytes);
  std::optional<int64_t> Assign(int32_t partition, TimePoint now, int64_t wall_now_unix_ns);
  // Replaces the local store's state of `partition` by the changelog's.
  absl::Status Adopt(int32_t partition, const ChangelogPartition& from);
  // The stored state of `jobs`, as puts.
  absl::Status FullState(const std::vector<std::string>& jobs, rankwatch::Checkpoint* out) const;
  void Fail(const absl::Status& status);

  const std::string topic_;
  StateStore* store_;
  StateChangelog* changelog_;
  JobRouter* router_;
  DaemonMetrics* metrics_;
  std::function<void(const absl::Status&)> on_failure_;
  const StateSyncOptions options_;
  std::atomic<bool> failed_{false};  // set by either thread
  bool backlog_ = false;  // the last collection left changes for later
  bool assigned_once_ = false;
  std::set<int32_t> owned_;
  // Partitions whose jobs in memory equal the local store (restored at start, untouched since).
  std::set<int32_t> restored_at_start_;
  std::map<int32_t, int64_t> resumed_at_;  // offset each owned partition resumed at
  CheckpointWriter writer_;  // last: its thread uses the members above until it is joined
};

}  // namespace rankwatch
