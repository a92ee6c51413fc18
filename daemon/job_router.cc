#include "daemon/job_router.h"

#include <spdlog/spdlog.h>

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

void JobRouter::Checkpoint(rankwatch::Checkpoint* c, TimePoint now, int64_t wall_now_unix_ns,
                           std::map<int32_t, rankwatch::Checkpoint>* by_partition) {
  // With `by_partition` each job's writes go to a checkpoint of their own first, then to both.
  rankwatch::Checkpoint own;
  rankwatch::Checkpoint* out = by_partition != nullptr ? &own : c;
  const auto done = [&](int32_t partition) {
    if (by_partition == nullptr) return;
    c->Append(own);
    if (partition >= 0) (*by_partition)[partition].Append(own);
    own = rankwatch::Checkpoint();
  };
  for (auto& [name, job] : jobs_) {
    if (!job.unsaved && !job.alerts_unsaved) continue;
    job.unsaved = false;
    JobCheckpoint jc = job.pipeline->TakeCheckpoint(now, wall_now_unix_ns);
    if (job.partition >= 0) jc.meta.set_kafka_partition(job.partition);
    out->Put(StateFamily::kWindows, JobMetaKey(name), jc.meta.SerializeAsString());
    for (const state::v1::StoredStep& step : jc.new_steps) {
      out->Put(StateFamily::kWindows, JobStepKey(name, step.step()), step.SerializeAsString());
    }
    out->DeleteRange(StateFamily::kWindows, JobStepKey(name, 0), JobStepKey(name, jc.keep_from_step));
    if (job.alerts_unsaved) {
      job.alerts_unsaved = false;
      out->Put(StateFamily::kWindows, JobAlertsKey(name), alerts_.ExportJob(name).SerializeAsString());
    }
    done(job.partition);
  }
  for (const auto& [name, partition] : removed_jobs_) {
    out->Delete(StateFamily::kWindows, JobMetaKey(name));
    out->Delete(StateFamily::kWindows, JobAlertsKey(name));
    out->DeleteRange(StateFamily::kWindows, JobStepKey(name, 0), JobStepKey(name, UINT64_MAX));
    done(partition);
  }
  removed_jobs_.clear();
  for (const auto& [tp, next] : next_offsets_) c->SetOffset(tp.first, tp.second, next);
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
    job.dirty = false;
    job.published_at = now;
    changed_jobs.push_back(&job);
    auto snapshot = std::make_shared<JobSnapshot>(job.pipeline->Snapshot(now));
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
