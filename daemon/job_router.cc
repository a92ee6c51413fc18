#include "daemon/job_router.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "daemon/job_state_keys.h"
#include "daemon/kernel_stage.h"
#include "operators/step_codec.h"
#include "sinks/diagnosis_proto.h"

namespace rankwatch {

JobRouter::JobRouter(JobRouterOptions options, DaemonMetrics* metrics, SnapshotStore* snapshots,
                     AlertHub* alert_hub)
    : options_(std::move(options)),
      metrics_(metrics),
      snapshots_(snapshots),
      alert_hub_(alert_hub),
      decoder_(options_.limits),
      alerts_(options_.alerts),
      rejected_too_many_jobs_(metrics->rejected_too_many_jobs) {}

namespace {

int64_t WallNowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// A stored value that the checkpoint writer serialises (off the ingest thread).
template <typename Message>
class DeferredMessage : public DeferredValue {
 public:
  DeferredMessage(Message message, size_t estimated_bytes)
      : message_(std::move(message)), estimated_bytes_(estimated_bytes) {}
  void SerializeTo(std::string* out) const override { message_.SerializeToString(out); }
  size_t EstimatedBytes() const override { return estimated_bytes_; }

 private:
  const Message message_;
  const size_t estimated_bytes_;
};

// Adds one job's checkpoint to `out`, its values deferred.
void AddJobCheckpoint(const std::string& name, JobCheckpoint jc, int32_t partition,
                      rankwatch::Checkpoint* out) {
  if (partition >= 0) jc.meta.set_kafka_partition(partition);
  const size_t meta_bytes = jc.meta.ByteSizeLong();
  out->PutDeferred(StateFamily::kWindows, JobMetaKey(name),
                   std::make_shared<DeferredMessage<state::v1::JobMeta>>(std::move(jc.meta),
                                                                         meta_bytes));
  // Steps of one job are about the same size: one measured step estimates them all.
  const size_t step_bytes = jc.new_steps.empty() ? 0 : jc.new_steps.front().ByteSizeLong();
  for (state::v1::StoredStep& step : jc.new_steps) {
    std::string key = JobStepKey(name, step.step());
    out->PutDeferred(StateFamily::kWindows, std::move(key),
                     std::make_shared<DeferredMessage<state::v1::StoredStep>>(std::move(step),
                                                                              step_bytes));
  }
  out->DeleteRange(StateFamily::kWindows, JobStepKey(name, 0), JobStepKey(name, jc.keep_from_step));
}

}  // namespace

void JobRouter::HandleMessage(std::string_view payload, const std::string& topic,
                              int32_t partition, int64_t offset, TimePoint now,
                              int64_t wall_now_unix_ns) {
  current_partition_ = partition;
  HandleMessage(payload, now, wall_now_unix_ns);
  current_partition_ = -1;
  // Rejected messages count too: they are consumed, and never read again.
  next_offsets_[{topic, partition}] = offset + 1;
}

void JobRouter::HandleMessage(std::string_view payload, TimePoint now, int64_t wall_now_unix_ns) {
  const RejectReason reason = decoder_.Decode(payload, &batch_, &detail_);
  if (reason != RejectReason::kNone) {
    metrics_->rejected_by_reason[static_cast<int>(reason)]->Add(1);
    spdlog::debug("rejected a message ({}): {}", RejectReasonName(reason), detail_);
    return;
  }
  Job* job = FindOrCreate(batch_.source(), now);
  if (job == nullptr) {
    rejected_too_many_jobs_->Add(1);
    return;
  }
  job->last_input = now;
  if (current_partition_ >= 0 && job->partition != current_partition_) {
    job->partition = current_partition_;
    job->unsaved = true;
  }
  if (job->expired) {
    spdlog::info("training job '{}' is back after expiring", batch_.source().training_job());
    job->expired = false;
  }
  metrics_->events_batches->Add(1);
  metrics_->events_steps->Add(batch_.steps_size());
  metrics_->events_kernels->Add(batch_.kernels_size());
  metrics_->events_samples->Add(batch_.samples_size());
  if (batch_.created_unix_ns() > 0) {
    metrics_->ingest_lag_seconds->Set(
        static_cast<double>(wall_now_unix_ns - batch_.created_unix_ns()) * 1e-9);
  }
  Count(*job, job->pipeline->AddBatch(batch_, now), wall_now_unix_ns);
  if (kernel_ != nullptr) kernel_->Add(batch_);
}

JobRouter::Job* JobRouter::FindOrCreate(const v1::SourceIdentity& source, TimePoint now) {
  auto it = jobs_.find(source.training_job());
  if (it != jobs_.end()) return &it->second;
  if (jobs_.size() >= options_.max_jobs) return nullptr;
  spdlog::info("new training job '{}' with {} ranks", source.training_job(), source.world_size());
  return &Insert(source.training_job(),
                 std::make_unique<JobPipeline>(source.training_job(), source.world_size(),
                                               options_.pipeline),
                 now);
}

JobRouter::Job& JobRouter::Insert(const std::string& name, std::unique_ptr<JobPipeline> pipeline,
                                  TimePoint now) {
  Job job;
  job.pipeline = std::move(pipeline);
  job.last_input = now;
  job.steps_aligned = metrics_->StepsAligned(name);
  job.steps_timed_out = metrics_->StepsTimedOut(name);
  Job& inserted = jobs_.insert_or_assign(name, std::move(job)).first->second;
  metrics_->jobs->Set(static_cast<double>(jobs_.size()));
  return inserted;
}

bool JobRouter::Checkpoint(rankwatch::Checkpoint* c, TimePoint now, int64_t wall_now_unix_ns,
                           std::map<int32_t, rankwatch::Checkpoint>* by_partition,
                           size_t max_bytes) {
  ++checkpoint_calls_;
  // The groups with changes: partition -> its changed jobs (removed jobs are found below).
  std::map<int32_t, std::vector<std::pair<const std::string*, Job*>>> changed;
  for (auto& [name, job] : jobs_) {
    if (job.unsaved || job.alerts_unsaved) changed[job.partition].emplace_back(&name, &job);
  }
  for (const auto& removed : removed_jobs_) changed[removed.second];
  std::vector<std::pair<uint64_t, int32_t>> order;  // (first seen changed, partition)
  for (const auto& group : changed) {
    order.emplace_back(changed_since_.try_emplace(group.first, checkpoint_calls_).first->second,
                       group.first);
  }
  std::sort(order.begin(), order.end());

  std::set<int32_t> collected;
  const size_t bytes_before = c->bytes();
  for (const auto& [since, partition] : order) {
    if (c->bytes() - bytes_before >= max_bytes) break;
    rankwatch::Checkpoint group;
    // Removals first: a job removed and then back since the last checkpoint is stored anew.
    for (auto it = removed_jobs_.begin(); it != removed_jobs_.end();) {
      if (it->second != partition) {
        ++it;
        continue;
      }
      group.Delete(StateFamily::kWindows, JobMetaKey(it->first));
      group.Delete(StateFamily::kWindows, JobAlertsKey(it->first));
      group.DeleteRange(StateFamily::kWindows, JobStepKey(it->first, 0),
                        JobStepKey(it->first, UINT64_MAX));
      it = removed_jobs_.erase(it);
    }
    // A job's alert lifecycle state: the AlertHub writes it to the local store together with
    // the alerts, in order (a checkpoint, written later by the writer thread, could otherwise
    // put back an older state); checkpoints carry it only to the changelog.
    rankwatch::Checkpoint alert_states;
    rankwatch::Checkpoint* alerts_to = alert_hub_ != nullptr ? &alert_states : &group;
    for (auto& [name, job] : changed[partition]) {
      job->unsaved = false;
      AddJobCheckpoint(*name, job->pipeline->TakeCheckpoint(now, wall_now_unix_ns),
                       job->partition, &group);
      if (job->alerts_unsaved) {
        job->alerts_unsaved = false;
        alerts_to->Put(StateFamily::kWindows, JobAlertsKey(*name),
                       alerts_.ExportJob(*name).SerializeAsString());
      }
    }
    if (by_partition != nullptr && partition >= 0) {
      (*by_partition)[partition].Append(group);
      (*by_partition)[partition].Append(alert_states);
    }
    c->Append(std::move(group));
    collected.insert(partition);
    changed_since_.erase(partition);
  }
  // A partition's offset goes with its changes, or alone when it has none left.
  for (const auto& [tp, next] : next_offsets_) {
    if (!changed.count(tp.second) || collected.count(tp.second)) {
      c->SetOffset(tp.first, tp.second, next);
    }
  }
  return collected.size() == changed.size();
}

absl::Status JobRouter::Restore(const StateStore& store, TimePoint now, int64_t wall_now_unix_ns) {
  return RestoreJobs(store, now, wall_now_unix_ns, [](const state::v1::JobMeta&) { return true; });
}

absl::Status JobRouter::RestorePartition(const StateStore& store, int32_t partition,
                                         TimePoint now, int64_t wall_now_unix_ns) {
  ReleasePartition(partition);
  return RestoreJobs(store, now, wall_now_unix_ns, [partition](const state::v1::JobMeta& meta) {
    return meta.has_kafka_partition() && meta.kafka_partition() == partition;
  });
}

absl::Status JobRouter::RestoreJobs(const StateStore& store, TimePoint now,
                                    int64_t wall_now_unix_ns,
                                    const std::function<bool(const state::v1::JobMeta&)>& accept) {
  std::vector<state::v1::JobMeta> metas;
  absl::Status bad;
  absl::Status s = store.ForEach(StateFamily::kWindows, "m", [&](std::string_view, std::string_view v) {
    state::v1::JobMeta meta;
    if (!meta.ParseFromArray(v.data(), static_cast<int>(v.size()))) {
      bad = absl::DataLossError("unreadable stored job metadata");
      return;
    }
    if (accept(meta)) metas.push_back(std::move(meta));
  });
  if (!s.ok()) return s;
  if (!bad.ok()) return bad;
  for (const state::v1::JobMeta& meta : metas) {
    std::vector<state::v1::StoredStep> steps;
    s = store.ForEach(StateFamily::kWindows, JobStepPrefix(meta.training_job()),
                      [&](std::string_view, std::string_view v) {
                        steps.emplace_back();
                        if (!steps.back().ParseFromArray(v.data(), static_cast<int>(v.size()))) {
                          bad = absl::DataLossError("unreadable stored step of job '" +
                                                    meta.training_job() + "'");
                        }
                      });
    if (!s.ok()) return s;
    if (!bad.ok()) return bad;
    auto pipeline = JobPipeline::Restore(meta, steps, options_.pipeline, now, wall_now_unix_ns);
    if (!pipeline.ok()) return pipeline.status();
    Job& job = Insert(meta.training_job(), std::move(*pipeline), now);
    job.partition = meta.has_kafka_partition() ? meta.kafka_partition() : -1;
    job.steps_aligned->Set(static_cast<double>(meta.aligned_steps()));
    job.steps_timed_out->Set(static_cast<double>(meta.timed_out_steps()));
    job.unsaved = false;
    auto alerts = store.Get(StateFamily::kWindows, JobAlertsKey(meta.training_job()));
    if (!alerts.ok()) return alerts.status();
    if (*alerts) {
      state::v1::AlertTrackerState tracker;
      if (!tracker.ParseFromString(**alerts)) {
        return absl::DataLossError("unreadable stored alerts of job '" + meta.training_job() + "'");
      }
      alerts_.RestoreJob(tracker);
      if (alert_hub_ != nullptr) {
        std::vector<std::string> firing;
        for (const auto& a : tracker.alerts()) {
          if (a.state() == static_cast<uint32_t>(AlertState::kFiring)) firing.push_back(a.id());
        }
        alert_hub_->SetFiring(meta.training_job(), std::move(firing));
      }
    }
    spdlog::debug("restored training job '{}': {} aligned steps, {} stored steps",
                  meta.training_job(), meta.aligned_steps(), steps.size());
  }
  if (!metas.empty()) spdlog::info("restored {} training jobs from the state store", metas.size());
  return absl::OkStatus();
}

void JobRouter::Drop(std::map<std::string, Job, std::less<>>::iterator it) {
  alerts_.DropJob(it->first);
  if (kernel_ != nullptr) kernel_->DropJob(it->first);
  if (alert_hub_ != nullptr) alert_hub_->SetFiring(it->first, {});
  metrics_->RemoveJob(it->first);
  snapshots_->Remove(it->first);
  jobs_.erase(it);
  metrics_->jobs->Set(static_cast<double>(jobs_.size()));
}

void JobRouter::ReleasePartition(int32_t partition) {
  size_t released = 0;
  for (auto it = jobs_.begin(); it != jobs_.end();) {
    if (it->second.partition == partition) {
      Drop(it++);
      ++released;
    } else {
      ++it;
    }
  }
  for (auto it = next_offsets_.begin(); it != next_offsets_.end();) {
    it = it->first.second == partition ? next_offsets_.erase(it) : std::next(it);
  }
  if (released > 0) spdlog::info("released {} training jobs of partition {}", released, partition);
}

std::vector<std::string> JobRouter::JobsOf(int32_t partition) const {
  std::vector<std::string> names;
  for (const auto& [name, job] : jobs_) {
    if (job.partition == partition) names.push_back(name);
  }
  return names;
}

std::set<int32_t> JobRouter::Partitions() const {
  std::set<int32_t> out;
  for (const auto& [name, job] : jobs_) out.insert(job.partition);
  return out;
}

std::optional<int64_t> JobRouter::NextOffset(const std::string& topic, int32_t partition) const {
  auto it = next_offsets_.find({topic, partition});
  if (it == next_offsets_.end()) return std::nullopt;
  return it->second;
}

void JobRouter::Count(Job& job, const JobDelta& d, int64_t wall_now_unix_ns) {
  if (d.aligned) job.triggered_unix_ns = wall_now_unix_ns;
  if (d.late) metrics_->rejected_late->Add(d.late);
  if (d.duplicate) metrics_->rejected_duplicate->Add(d.duplicate);
  if (d.rank_out_of_range) metrics_->rejected_rank_out_of_range->Add(d.rank_out_of_range);
  job.unpublished_aligned += d.aligned;
  job.unpublished_timed_out += d.aligned_timed_out;
  if (d.aligned || d.accepted) {
    job.dirty = true;
    job.unsaved = true;
  }
}

void JobRouter::Publish(const std::vector<AlertEvent>& events, const std::string& job,
                        int64_t triggered) {
  if (events.empty()) return;
  std::vector<v1::Alert> published;
  for (const AlertEvent& e : events) {
    metrics_->CountAlert(e.kind, e.state);
    // Subscribers see an alert fire and resolve; one that never fired stays internal.
    if (e.state == AlertState::kPending || (e.state == AlertState::kResolved && !e.fired)) continue;
    const std::string& note = e.evidence ? (e.kind == AlertKind::kMemoryCreep ||
                                                    e.kind == AlertKind::kMemoryPressure ||
                                                    e.kind == AlertKind::kMemoryImbalance
                                                ? e.evidence->memory.note
                                                : e.evidence->step.note)
                                         : std::string();
    if (e.state == AlertState::kFiring) {
      spdlog::warn("alert firing: {} ({}): {}", e.id, SeverityName(e.severity), note);
    } else {
      spdlog::info("alert resolved: {}", e.id);
    }
    published.emplace_back();
    ToProto(e, &published.back());
    published.back().set_triggered_unix_ns(triggered);
  }
  metrics_->SetFiring(job, alerts_.Firing(job));
  auto it = jobs_.find(job);
  if (it != jobs_.end()) it->second.alerts_unsaved = true;
  if (alert_hub_ == nullptr) return;
  // The job's lifecycle state is stored with its alerts, so a restart neither forgets a firing
  // alert nor fires it again.
  rankwatch::Checkpoint state;
  state.Put(StateFamily::kWindows, JobAlertsKey(job), alerts_.ExportJob(job).SerializeAsString());
  if (absl::Status s = alert_hub_->Append(std::move(published), state); !s.ok()) {
    if (options_.on_storage_error) options_.on_storage_error(s);
  }
}

void JobRouter::ExpireJobs(TimePoint now) {
  for (auto it = jobs_.begin(); it != jobs_.end();) {
    Job& job = it->second;
    if (!job.expired && now - job.last_input >= options_.job_ttl) {
      job.expired = true;
      job.expired_at = now;
      spdlog::info("training job '{}' expired: no input for {:.0f} s; its last diagnosis stays "
                   "queryable for {:.0f} s",
                   it->first, std::chrono::duration<double>(options_.job_ttl).count(),
                   std::chrono::duration<double>(options_.job_retention).count());
    }
    if (job.expired && now - job.expired_at >= options_.job_retention) {
      spdlog::info("training job '{}' removed", it->first);
      Publish(alerts_.ForgetJob(it->first, WallNowNs()), it->first, WallNowNs());
      removed_jobs_.emplace_back(it->first, job.partition);
      Drop(it++);
    } else {
      ++it;
    }
  }
}

void JobRouter::Tick(TimePoint now) {
  ExpireJobs(now);
  if (kernel_ != nullptr) kernel_->Publish();
  std::vector<Job*> changed_jobs;
  std::vector<std::shared_ptr<const JobSnapshot>> changed;
  const int64_t wall = WallNowNs();
  for (auto& [name, job] : jobs_) {
    if (job.expired) continue;  // its last diagnosis is frozen
    Count(job, job.pipeline->Tick(now), WallNowNs());
    // Silent jobs are re-evaluated every second too: silence is itself a diagnosis (hang).
    if (!job.dirty && now - job.published_at < std::chrono::seconds(1)) continue;
    // A job whose evaluation is costly (thousands of ranks) is re-evaluated at most every ten
    // times that cost, so that evaluating it takes at most ~10% of the ingest thread.
    if (job.dirty && now - job.published_at < 10 * job.evaluation_cost) continue;
    job.dirty = false;
    job.published_at = now;
    changed_jobs.push_back(&job);
    const TimePoint started = Clock::now();
    auto snapshot = std::make_shared<JobSnapshot>(job.pipeline->Snapshot(now));
    job.evaluation_cost = Clock::now() - started;
    snapshot->evaluated_unix_ns = wall;
    changed.push_back(std::move(snapshot));
  }
  if (changed.empty()) return;
  for (const auto& s : changed) metrics_->PublishJob(*s);
  snapshots_->Update(changed);
  for (const auto& s : changed) {
    auto it = jobs_.find(s->training_job);
    // The trigger is the newest step aligned since the job's previous evaluation; without one
    // (silence: a hang, or a finished job's clean evaluations) the evaluation itself.
    int64_t triggered = wall;
    if (it != jobs_.end()) {
      if (it->second.triggered_unix_ns > 0) triggered = it->second.triggered_unix_ns;
      it->second.triggered_unix_ns = 0;
    }
    Publish(alerts_.Evaluate(s, wall), s->training_job, triggered);
  }
  for (Job* job : changed_jobs) {
    job->steps_aligned->Add(job->unpublished_aligned);
    job->steps_timed_out->Add(job->unpublished_timed_out);
    job->unpublished_aligned = 0;
    job->unpublished_timed_out = 0;
  }
}

}  // namespace rankwatch
