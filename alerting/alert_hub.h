// AlertHub: the daemon's alert log and its subscribers.
//
// Append stores alerts durably (the alert log of state/job_state_store.h, written by the
// CheckpointWriter thread like every other state, so the ingest thread never waits for an
// fsync) and only once they are stored publishes them: to a ring of recent alerts, to the
// per-job list of firing alerts, and to every subscriber whose filter matches. Sequence numbers
// are assigned here, daemon-wide (one sequence per daemon instance): consecutive,
// starting after the newest stored alert, so a subscriber that saw sequence N resumes with
// `after_sequence = N` and gets every later alert exactly once, in order, across its own
// reconnects and daemon restarts (within the log's retention).
//
// A subscriber has a bounded queue. Append never blocks on a subscriber: a full queue marks
// it overflowed and its stream ends with a position to resume from. A subscriber whose stream
// is stuck (its writer blocked on a client that does not read) is cancelled through its
// `cancel` callback after `stuck_after`, by the hub's reaper thread.
//
// Thread-safe: Append runs on the ingest thread, publication on the checkpoint writer's thread,
// subscribers on gRPC threads.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "metrics/prometheus_registry.h"
#include "rankwatch/v1/service.pb.h"
#include "state/checkpoint_writer.h"
#include "state/state_store.h"

namespace rankwatch {

struct AlertHubOptions {
  size_t ring_capacity = 4096;  // recent alerts kept in memory; default 4,096
  // ... and at most this many bytes of them (each alert carries its whole diagnosis); older ones
  // are read back from the alert log when a subscriber resumes. Default: 4 MiB.
  size_t ring_max_bytes = size_t{4} << 20;
  size_t subscriber_queue = 1024;    // alerts a subscriber may lag behind; default 1,024
  uint64_t log_retention = 100'000;  // stored alerts kept; older ones are deleted; default 100k
  // An overflowed subscriber still not gone after this long is cancelled. Default: 1 s.
  std::chrono::milliseconds stuck_after{1000};
};

struct AlertFilter {
  std::string training_job;  // empty: every job
  std::set<int> kinds;       // v1::AlertKind values; empty: every kind
  int min_severity = 0;      // v1::Severity
  bool Matches(const v1::Alert& alert) const;
};

struct AlertHubMetrics {
  MetricCell* subscribers = nullptr;          // gauge
  MetricCell* subscribers_dropped = nullptr;  // counter: disconnected as too slow
  MetricCell* delivered = nullptr;            // counter: alerts handed to subscribers
};

class AlertHub {
 public:
  // `store` (read: the backlog and the newest stored sequence) and `writer` (which writes to
  // it) may both be null: alerts are then only live. Both outlive the hub.
  AlertHub(const StateStore* store, CheckpointWriter* writer, AlertHubOptions options,
           AlertHubMetrics metrics);
  // Waits for the writes it queued (Flush), then ends every subscription.
  ~AlertHub();

  // Assigns sequence numbers to `alerts` and queues them, together with `extra` (other state
  // that must change with them), as one write; once it is committed they are published. Never
  // waits for the disk. A storage error is the writer's (its on_error reports it); the alerts
  // are then still published live, and are lost to resumption. Call from one thread only.
  void Append(std::vector<v1::Alert> alerts, Checkpoint extra);

  // Waits until every alert appended so far is stored (or failed) and published. Returns the
  // writer's health.
  absl::Status Flush();

  // Ids of the firing alerts of `training_job`.
  std::vector<std::string> Firing(const std::string& training_job) const;
  // Sets them (a job restored from state) or forgets them (a job that moved away).
  void SetFiring(const std::string& training_job, std::vector<std::string> ids);

  class Subscription {
   public:
    enum class Wait { kAlert, kTimeout, kOverflow, kClosed };
    // Waits up to `timeout` for the next live alert.
    Wait Next(std::chrono::milliseconds timeout, std::shared_ptr<const v1::Alert>* alert);
    // Alerts with a sequence below this came before the subscription: read them as backlog.
    uint64_t live_from() const { return live_from_; }
    ~Subscription();

   private:
    friend class AlertHub;
    AlertHub* hub_ = nullptr;
    AlertFilter filter_;
    uint64_t live_from_ = 0;
    std::function<void()> cancel_;
    std::deque<std::shared_ptr<const v1::Alert>> queue_;  // guarded by hub_->mu_
    bool overflowed_ = false;                             // guarded by hub_->mu_
    bool cancelled_ = false;                              // guarded by hub_->mu_
    std::chrono::steady_clock::time_point overflowed_at;  // guarded by hub_->mu_
  };

  // Registers a subscriber for live alerts matching `filter`. `cancel` ends its stream from
  // another thread (it must not block).
  std::unique_ptr<Subscription> Subscribe(const AlertFilter& filter,
                                          std::function<void()> cancel = nullptr);

  // Calls `fn` for each alert matching `filter` with after < sequence < before, in order,
  // from memory or the store. Returns false when alerts in that range are no longer stored.
  bool Backlog(uint64_t after, uint64_t before, const AlertFilter& filter,
               const std::function<void(std::shared_ptr<const v1::Alert>)>& fn) const;

  // Ends every subscription (shutdown).
  void Close();

  uint64_t last_sequence() const;

 private:
  // Publishes stored alerts (on the writer thread, in sequence order).
  void Publish(std::vector<v1::Alert> alerts);

  const StateStore* store_;
  CheckpointWriter* writer_;
  const AlertHubOptions options_;
  AlertHubMetrics metrics_;
  uint64_t next_to_assign_ = 1;  // the appending thread only
  mutable std::mutex mu_;
  std::condition_variable changed_;
  uint64_t next_sequence_ ABSL_GUARDED_BY(mu_) = 1;  // the next to publish
  std::deque<std::shared_ptr<const v1::Alert>> ring_ ABSL_GUARDED_BY(mu_);
  std::deque<size_t> ring_sizes_ ABSL_GUARDED_BY(mu_);  // bytes of each alert in ring_
  size_t ring_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  std::set<Subscription*> subscribers_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::set<std::string>> firing_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  std::thread reaper_;
};

}  // namespace rankwatch
