#include "daemon/state_sync.h"

#include <spdlog/spdlog.h>

#include "daemon/job_state_keys.h"
#include "rankwatch/state/v1/job_state.pb.h"

namespace rankwatch {

StateSync::StateSync(std::string topic, StateStore* store, StateChangelog* changelog,
                     JobRouter* router, DaemonMetrics* metrics,
                     std::function<void(const absl::Status&)> on_failure)
    : topic_(std::move(topic)),
      store_(store),
      changelog_(changelog),
      router_(router),
      metrics_(metrics),
      on_failure_(std::move(on_failure)) {}

absl::Status StateSync::RestoreAll(TimePoint now, int64_t wall_now_unix_ns) {
  absl::Status s = router_->Restore(*store_, now, wall_now_unix_ns);
  if (s.ok()) restored_at_start_ = router_->Partitions();
  return s;
}

void StateSync::ReportFailure(const absl::Status& status) { Fail(status); }

void StateSync::Fail(const absl::Status& status) {
  if (failed_) return;
  failed_ = true;
  metrics_->state_errors->Add(1);
  metrics_->state_healthy->Set(0);
  spdlog::error("state checkpoint failed, checkpoints stop and health is NOT_SERVING: {}",
                std::string(status.message()));
  on_failure_(status);
}

void StateSync::Checkpoint(TimePoint now, int64_t wall_now_unix_ns) {
  if (failed_) return;
  const TimePoint start = Clock::now();
  rankwatch::Checkpoint c;
  std::map<int32_t, rankwatch::Checkpoint> by_partition;
  router_->Checkpoint(&c, now, wall_now_unix_ns, changelog_ != nullptr ? &by_partition : nullptr);
  if (c.empty()) return;
  if (absl::Status s = store_->Commit(c); !s.ok()) return Fail(s);
  size_t changelog_bytes = 0;
  for (auto& [partition, delta] : by_partition) {
    if (!owned_.count(partition)) continue;  // consumed before a revocation: not ours to log
    std::optional<int64_t> next = router_->NextOffset(topic_, partition);
    if (!next) {
      auto it = resumed_at_.find(partition);
      if (it == resumed_at_.end()) continue;
      next = it->second;  // nothing consumed since the assignment
    }
    if (changelog_->NeedsSnapshot(partition)) {
      rankwatch::Checkpoint full;
      if (absl::Status s = FullState(partition, &full); !s.ok()) return Fail(s);
      changelog_->Append(partition, full, *next, /*full=*/true);
      changelog_bytes += full.bytes();
    } else {
      changelog_->Append(partition, delta, *next, /*full=*/false);
      changelog_bytes += delta.bytes();
    }
  }
  metrics_->checkpoints->Add(1);
  metrics_->checkpoint_seconds->Set(std::chrono::duration<double>(Clock::now() - start).count());
  metrics_->checkpoint_bytes->Set(static_cast<double>(c.bytes()));
  spdlog::debug("checkpoint: {} bytes ({} to the changelog) in {:.3f} ms", c.bytes(),
                changelog_bytes,
                std::chrono::duration<double, std::milli>(Clock::now() - start).count());
}

absl::Status StateSync::FullState(int32_t partition, rankwatch::Checkpoint* out) const {
  for (const std::string& job : router_->JobsOf(partition)) {
    auto meta = store_->Get(StateFamily::kWindows, JobMetaKey(job));
    if (!meta.ok()) return meta.status();
    if (!*meta) continue;
    out->Put(StateFamily::kWindows, JobMetaKey(job), **meta);
    auto alerts = store_->Get(StateFamily::kWindows, JobAlertsKey(job));
    if (!alerts.ok()) return alerts.status();
    if (*alerts) out->Put(StateFamily::kWindows, JobAlertsKey(job), **alerts);
    absl::Status s = store_->ForEach(StateFamily::kWindows, JobStepPrefix(job),
                                     [&](std::string_view k, std::string_view v) {
                                       out->Put(StateFamily::kWindows, std::string(k),
                                                std::string(v));
                                     });
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status StateSync::Adopt(int32_t partition, const ChangelogPartition& from) {
  rankwatch::Checkpoint c;
  // Whatever this store still has of the partition is older than the changelog: drop it.
  absl::Status bad;
  absl::Status s = store_->ForEach(StateFamily::kWindows, "m",
                                   [&](std::string_view, std::string_view v) {
                                     state::v1::JobMeta meta;
                                     if (!meta.ParseFromArray(v.data(), static_cast<int>(v.size()))) {
                                       bad = absl::DataLossError("unreadable stored job metadata");
                                       return;
                                     }
                                     if (!meta.has_kafka_partition() ||
                                         meta.kafka_partition() != partition) {
                                       return;
                                     }
                                     const std::string& job = meta.training_job();
                                     c.Delete(StateFamily::kWindows, JobMetaKey(job));
                                     c.Delete(StateFamily::kWindows, JobAlertsKey(job));
                                     c.DeleteRange(StateFamily::kWindows, JobStepKey(job, 0),
                                                   JobStepKey(job, UINT64_MAX));
                                   });
  if (!s.ok()) return s;
  if (!bad.ok()) return bad;
  for (const auto& [key, value] : from.values) c.Put(key.first, key.second, value);
  c.SetOffset(topic_, partition, from.next_offset);
  return store_->Commit(c);
}

std::optional<int64_t> StateSync::Assign(int32_t partition, TimePoint now,
                                         int64_t wall_now_unix_ns) {
  owned_.insert(partition);
  auto offsets = store_->Offsets();
  if (!offsets.ok()) {
    Fail(offsets.status());
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
      if (failed_) {
        spdlog::warn("partition {}: the changelog is ahead but the state store failed; its "
                     "state is rebuilt in memory only", partition);
      } else if (absl::Status s = Adopt(partition, *logged); !s.ok()) {
        Fail(s);
      }
      spdlog::info("partition {}: state from the changelog ({} keys, checkpoint {}), resuming "
                   "at offset {}", partition, logged->values.size(), logged->sequence,
                   logged->next_offset);
      restored_at_start_.erase(partition);
      local = logged->next_offset;
    }
  }
  if (restored_at_start_.erase(partition) == 0) {
    if (absl::Status s = router_->RestorePartition(*store_, partition, now, wall_now_unix_ns);
        !s.ok()) {
      Fail(s);
    }
  }
  if (local) resumed_at_[partition] = *local;
  return local;
}

std::vector<std::optional<int64_t>> StateSync::OnAssigned(const std::vector<int32_t>& partitions,
                                                          TimePoint now,
                                                          int64_t wall_now_unix_ns) {
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

void StateSync::OnRevoked(const std::vector<int32_t>& partitions, TimePoint now,
                          int64_t wall_now_unix_ns) {
  Checkpoint(now, wall_now_unix_ns);
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
    resumed_at_.erase(p);
  }
}

}  // namespace rankwatch
