#include "runtime/task_manager.h"

#include <spdlog/spdlog.h>

#include "state/job_state_store.h"

namespace rankwatch {

TaskManager::TaskManager(std::string topic, StateStore* store, CheckpointWriter* writer,
                         StateChangelog* changelog, JobRouter* router, DaemonMetrics* metrics,
                         StateHealth* health, TaskManagerOptions options)
    : topic_(std::move(topic)),
      store_(store),
      writer_(writer),
      changelog_(changelog),
      router_(router),
      metrics_(metrics),
      health_(health),
      options_(options) {}

TaskManager::~TaskManager() { (void)writer_->Drain(); }

absl::Status TaskManager::RestoreAll(TimePoint now, int64_t wall_now_unix_ns) {
  absl::Status s = router_->Restore(*store_, now, wall_now_unix_ns);
  if (s.ok()) restored_at_start_ = router_->Partitions();
  return s;
}

bool TaskManager::Checkpoint(TimePoint now, int64_t wall_now_unix_ns) {
  return Collect(now, wall_now_unix_ns, options_.checkpoint_max_bytes);
}

void TaskManager::CatchUp(TimePoint now, int64_t wall_now_unix_ns) {
  if (backlog_ && writer_->pending() == 0) Checkpoint(now, wall_now_unix_ns);
}

void TaskManager::Shutdown(TimePoint now, int64_t wall_now_unix_ns) {
  Collect(now, wall_now_unix_ns, SIZE_MAX);
  (void)writer_->Drain();  // an error was reported through the writer's on_error already
}

bool TaskManager::Collect(TimePoint now, int64_t wall_now_unix_ns, size_t max_bytes) {
  if (health_->failed()) return true;
  const TimePoint start = Clock::now();
  rankwatch::Checkpoint c;
  std::map<int32_t, rankwatch::Checkpoint> by_partition;
  const bool complete = router_->Checkpoint(
      &c, now, wall_now_unix_ns, changelog_ != nullptr ? &by_partition : nullptr, max_bytes);
  backlog_ = !complete;
  if (c.empty()) return complete;
  // Each owned partition's changelog append, with what the ingest thread knows now; it runs
  // on the writer thread after this checkpoint's commit.
  struct Append {
    int32_t partition;
    rankwatch::Checkpoint delta;
    int64_t next_offset;
    std::vector<std::string> jobs;
  };
  std::vector<Append> appends;
  for (auto& [partition, delta] : by_partition) {
    if (!owned_.count(partition)) continue;  // consumed before a revocation: not ours to log
    const std::optional<int64_t> covered = router_->CoveredOffset(partition);
    if (!covered) continue;
    appends.push_back({partition, std::move(delta), *covered, router_->JobsOf(partition)});
  }
  std::function<absl::Status()> after_commit;
  if (!appends.empty()) {
    after_commit = [this, appends = std::move(appends)]() mutable -> absl::Status {
      size_t bytes = 0;
      for (Append& a : appends) {
        if (changelog_->NeedsSnapshot(a.partition)) {
          rankwatch::Checkpoint full;
          if (absl::Status s = job_state::CopyJobs(*store_, a.jobs, &full); !s.ok()) return s;
          changelog_->Append(a.partition, full, a.next_offset, /*full=*/true);
          bytes += full.bytes();
        } else {
          a.delta.Materialize();
          changelog_->Append(a.partition, a.delta, a.next_offset, /*full=*/false);
          bytes += a.delta.bytes();
        }
      }
      spdlog::debug("changelog: {} bytes appended", bytes);
      return absl::OkStatus();
    };
  }
  // An error is reported through the writer's on_error already.
  (void)writer_->Enqueue(std::move(c), std::move(after_commit));
  metrics_->checkpoint_pause_seconds->Set(
      std::chrono::duration<double>(Clock::now() - start).count());
  return complete;
}

absl::Status TaskManager::Adopt(int32_t partition, const ChangelogPartition& from) {
  rankwatch::Checkpoint c;
  // Whatever this store still has of the partition is older than the changelog: drop it.
  if (absl::Status s = job_state::DeletePartition(*store_, partition, &c); !s.ok()) return s;
  for (const auto& [key, value] : from.values) c.Put(key.first, key.second, value);
  c.SetOffset(topic_, partition, from.next_offset);
  // Written through the writer, so it lands after every checkpoint queued before it.
  if (absl::Status s = writer_->Enqueue(std::move(c)); !s.ok()) return s;
  return writer_->Drain();
}

std::optional<int64_t> TaskManager::Assign(int32_t partition, TimePoint now,
                                           int64_t wall_now_unix_ns) {
  owned_.insert(partition);
  auto offsets = store_->Offsets();
  if (!offsets.ok()) {
    health_->Fail(offsets.status());
    return std::nullopt;
  }
  std::optional<int64_t> local;
  if (auto it = offsets->find({topic_, partition}); it != offsets->end()) local = it->second;
  if (changelog_ != nullptr) {
    auto logged = changelog_->Read(partition);
    if (!logged.ok()) {
      // Without the changelog the local state is the best there is; it may be older than
      // another instance's, which the metric and this line make visible.
      metrics_->state_errors->Add(1);
      spdlog::error("partition {}: {}; continuing from the local state", partition,
                    std::string(logged.status().message()));
    } else if (logged->present && (!local || logged->next_offset > *local)) {
      if (health_->failed()) {
        spdlog::warn(
            "partition {}: the changelog is ahead but the state store failed; its "
            "state is rebuilt in memory only",
            partition);
      } else if (absl::Status s = Adopt(partition, *logged); !s.ok()) {
        health_->Fail(s);
      }
      spdlog::info(
          "partition {}: state from the changelog ({} keys, checkpoint {}), resuming "
          "at offset {}",
          partition, logged->values.size(), logged->sequence, logged->next_offset);
      restored_at_start_.erase(partition);
      local = logged->next_offset;
    }
  }
  if (restored_at_start_.erase(partition) == 0) {
    if (absl::Status s = router_->RestorePartition(*store_, partition, now, wall_now_unix_ns);
        !s.ok()) {
      health_->Fail(s);
    }
  }
  if (local) router_->ResumedAt(partition, *local, now);
  return local;
}

std::vector<std::optional<int64_t>> TaskManager::OnAssigned(const std::vector<int32_t>& partitions,
                                                            TimePoint now,
                                                            int64_t wall_now_unix_ns) {
  // The store and the changelog must be as of every checkpoint queued so far.
  (void)writer_->Drain();
  std::vector<std::optional<int64_t>> offsets;
  for (int32_t p : partitions) offsets.push_back(Assign(p, now, wall_now_unix_ns));
  if (!assigned_once_) {
    assigned_once_ = true;
    // Jobs restored at start whose partition went to another instance are not ours to serve.
    for (int32_t p : restored_at_start_) {
      if (p >= 0 && !owned_.count(p)) router_->ReleasePartition(p);
    }
    restored_at_start_.clear();
  }
  return offsets;
}

void TaskManager::OnRevoked(const std::vector<int32_t>& partitions, TimePoint now,
                            int64_t wall_now_unix_ns) {
  // Everything, not a budget's worth: the partitions leave with all their changes.
  Collect(now, wall_now_unix_ns, SIZE_MAX);
  (void)writer_->Drain();
  if (changelog_ != nullptr) {
    if (absl::Status s = changelog_->Flush(std::chrono::seconds(10)); !s.ok()) {
      metrics_->state_errors->Add(1);
      spdlog::error("handing over partitions: {}", std::string(s.message()));
    }
  }
  for (int32_t p : partitions) {
    router_->ReleasePartition(p);
    if (changelog_ != nullptr) changelog_->Release(p);
    owned_.erase(p);
    restored_at_start_.erase(p);
  }
}

}  // namespace rankwatch
