// CheckpointWriter: commits checkpoints to a StateStore on a thread of its own, so that the
// serialisation of deferred values, the RocksDB write and its fsync never pause the thread that
// collects them (the daemon's ingest thread). Every write of the daemon's state goes through it:
// checkpoints (runtime/task_manager.h) and the alert log (alerting/alert_hub.h), so they land in
// the order they were made.
//
// Order: checkpoints are committed whole and in the order they were enqueued. After a commit,
// its `after_commit` step runs on the writer thread before the next checkpoint is written, so
// it sees the store exactly as of that commit (the changelog's full snapshots read it).
//
// Back-pressure: at most `max_queued` checkpoints wait behind the one being written; Enqueue
// blocks while that many wait, so a producer that outruns the disk slows to the disk's pace
// instead of piling checkpoints up in memory. EnqueueNoWait admits small writes past that
// bound (the alert log: the ingest thread never waits for it).
//
// Errors are sticky, as in StateStore: after the first failed commit, after_commit step or
// flush, the writer drops every checkpoint still queued or enqueued later, `on_error` runs once
// (on the writer thread), and Enqueue and Drain return that error.
//
// Thread-safety: Enqueue, Drain and the destructor are called by one producer thread; health()
// from any thread. The callbacks run on the writer thread and must be thread-safe.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "state/state_store.h"

namespace rankwatch {

struct CheckpointWriterOptions {
  // Checkpoints waiting behind the one being written before Enqueue blocks. Default: 2.
  size_t max_queued = 2;
  // Once this many bytes were committed since the last flush, the writer flushes the store's
  // memtables to tables, so that a crash leaves at most about this much write-ahead log to
  // replay at the next start (RocksDB replays ~100-150 MB/s here). 0: never flush (RocksDB
  // still does as memtables fill). Default: 32 MiB.
  size_t flush_after_bytes = size_t{32} << 20;
};

// What one commit cost, reported to `on_commit` after it.
struct CheckpointCommitStats {
  size_t bytes = 0;      // keys and values written
  double seconds = 0;    // serialisation + write + fsync + after_commit (+ flush)
  bool flushed = false;  // the memtables were flushed after it
};

class CheckpointWriter {
 public:
  // `store` must outlive the writer. `on_commit` and `on_error` may be empty.
  CheckpointWriter(StateStore* store, CheckpointWriterOptions options,
                   std::function<void(const CheckpointCommitStats&)> on_commit,
                   std::function<void(const absl::Status&)> on_error);
  // Drains the queue (every checkpoint enqueued is committed or, after an error, dropped) and
  // stops the thread.
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // Queues `checkpoint` (blocking while `max_queued` wait). `after_commit`, when set, runs on
  // the writer thread right after the commit; an error from it is a sticky failure. Returns
  // the sticky error, without queueing, once the writer failed.
  absl::Status Enqueue(Checkpoint checkpoint, std::function<absl::Status()> after_commit = {});

  // Queues `checkpoint` without waiting for room. `then` runs exactly once with the outcome: on
  // the writer thread with OK after the commit, or with the error when the commit failed or the
  // checkpoint was dropped after an earlier failure — on the calling thread, before this
  // returns, when the writer had failed already.
  void EnqueueNoWait(Checkpoint checkpoint, std::function<void(const absl::Status&)> then);

  // Waits until every checkpoint enqueued so far is committed (with its after_commit step) or
  // dropped. Returns health().
  absl::Status Drain();

  // OK while every commit succeeded; otherwise the first failure.
  absl::Status health() const;

  // Checkpoints queued or being written.
  size_t pending() const;

 private:
  struct Item {
    Checkpoint checkpoint;
    std::function<absl::Status()> after_commit;
    std::function<void(const absl::Status&)> then;  // EnqueueNoWait's outcome callback
  };
  void Run();
  absl::Status Write(Item& item, CheckpointCommitStats* stats);

  StateStore* const store_;
  const CheckpointWriterOptions options_;
  const std::function<void(const CheckpointCommitStats&)> on_commit_;
  const std::function<void(const absl::Status&)> on_error_;
  size_t bytes_since_flush_ = 0;  // writer thread only

  mutable std::mutex mu_;
  std::condition_variable changed_;  // queue, busy_, stop_ or sticky_ changed
  std::deque<Item> queue_ ABSL_GUARDED_BY(mu_);
  bool busy_ ABSL_GUARDED_BY(mu_) = false;  // a checkpoint is being written
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status sticky_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;  // last: starts after every member above is initialised
};

}  // namespace rankwatch
