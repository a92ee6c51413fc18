// TaskManager: the assignment handling of rankwatchd's partition tasks, and their checkpoints.
// It keeps the tasks' state durable and lets telemetry partitions move between daemon instances
// of one consumer group, as Kafka Streams' task manager does.
//
// A checkpoint collects the changed tasks (JobRouter::Checkpoint: whole partitions, jobs and
// offset together, values deferred) and queues them on the CheckpointWriter, which writes them
// to the local StateStore on its own thread, so the serialisation, the RocksDB write and its
// fsync never pause the ingest thread. With a StateChangelog each owned partition's part is
// also appended there, on the writer thread right after the commit it covers (the whole
// partition when the changelog asks for a snapshot: full snapshots read the store as of that
// commit). A periodic checkpoint collects at most `checkpoint_max_bytes`; a large backlog, such
// as the first checkpoint after a restart, spreads over several rounds.
//
// On assignment a partition's state comes from whichever of the local store and the changelog
// covers more input — the changelog after another instance owned the partition (adopted into
// the local store first), the local store after a restart of this one — and consumption
// resumes at the offset that state covers. On revocation the partition is checkpointed, the
// changelog flushed, and its task released. Assignment, revocation and shutdown first wait for
// the writer to drain.
//
// After a storage error nothing is committed again: `health` (shared with the writer's
// on_error) is failed once, and checkpoints become no-ops.
//
// Not thread-safe: owned by the ingest thread (Kafka's rebalance callbacks run there too).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "metrics/daemon_metrics.h"
#include "runtime/job_router.h"
#include "runtime/state_health.h"
#include "state/checkpoint_writer.h"
#include "state/state_changelog.h"
#include "state/state_store.h"

namespace rankwatch {

struct TaskManagerOptions {
  // Estimated bytes a periodic checkpoint collects on the ingest thread (whole partitions, so
  // one large partition may exceed it). Default: 16 MiB, about 10-20 ms of collection and well
  // under a second of writing.
  size_t checkpoint_max_bytes = size_t{16} << 20;
};

class TaskManager {
 public:
  // `changelog` may be null (a single instance). Every pointer outlives the manager; `writer`
  // writes to `store`, and its on_error must fail `health`.
  TaskManager(std::string topic, StateStore* store, CheckpointWriter* writer,
              StateChangelog* changelog, JobRouter* router, DaemonMetrics* metrics,
              StateHealth* health, TaskManagerOptions options = {});
  // Waits for the checkpoints it queued: their changelog appends use this manager.
  ~TaskManager();

  // Restores every task of the local store (at start, before the group assigns anything), so
  // diagnoses are served at once. Damaged state is an error.
  absl::Status RestoreAll(TimePoint now, int64_t wall_now_unix_ns);

  // Queues a checkpoint of at most `checkpoint_max_bytes` of changes (blocking while the writer
  // is behind by its `max_queued`). Returns whether every change was collected. A no-op after
  // a storage error.
  bool Checkpoint(TimePoint now, int64_t wall_now_unix_ns);

  // When the last checkpoint left changes for later and the writer is idle, queues another
  // budget's worth at once (so a large backlog is written at the disk's pace, not one budget
  // per interval). Cheap otherwise: call it every loop.
  void CatchUp(TimePoint now, int64_t wall_now_unix_ns);

  // At shutdown: checkpoints every change and waits until it is written.
  void Shutdown(TimePoint now, int64_t wall_now_unix_ns);

  // `partitions` of the telemetry topic were assigned: restores their tasks and returns, per
  // partition, the offset to resume at (nullopt: no state; Kafka's committed offset applies).
  std::vector<std::optional<int64_t>> OnAssigned(const std::vector<int32_t>& partitions,
                                                 TimePoint now, int64_t wall_now_unix_ns);

  // `partitions` were revoked (or lost): checkpoints them, flushes the changelog, releases
  // their tasks.
  void OnRevoked(const std::vector<int32_t>& partitions, TimePoint now, int64_t wall_now_unix_ns);

  // Whether the last checkpoint left changes for later (CatchUp will collect them).
  bool backlog() const { return backlog_; }
  // Partitions this instance owns now.
  const std::set<int32_t>& owned() const { return owned_; }

 private:
  bool Collect(TimePoint now, int64_t wall_now_unix_ns, size_t max_bytes);
  std::optional<int64_t> Assign(int32_t partition, TimePoint now, int64_t wall_now_unix_ns);
  // Replaces the local store's state of `partition` by the changelog's.
  absl::Status Adopt(int32_t partition, const ChangelogPartition& from);

  const std::string topic_;
  StateStore* store_;
  CheckpointWriter* writer_;
  StateChangelog* changelog_;
  JobRouter* router_;
  DaemonMetrics* metrics_;
  StateHealth* health_;
  const TaskManagerOptions options_;
  bool backlog_ = false;  // the last collection left changes for later
  bool assigned_once_ = false;
  std::set<int32_t> owned_;
  // Partitions whose tasks in memory equal the local store (restored at start, untouched since).
  std::set<int32_t> restored_at_start_;
};

}  // namespace rankwatch
