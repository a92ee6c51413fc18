#include "daemon/job_router.h"

#include <spdlog/spdlog.h>

namespace rankwatch {

JobRouter::JobRouter(JobRouterOptions options, DaemonMetrics* metrics, SnapshotStore* snapshots)
    : options_(std::move(options)),
      metrics_(metrics),
      snapshots_(snapshots),
      decoder_(options_.limits),
      rejected_too_many_jobs_(metrics->rejected_too_many_jobs) {}

void JobRouter::HandleMessage(std::string_view payload, TimePoint now, int64_t wall_now_unix_ns) {
  const RejectReason reason = decoder_.Decode(payload, &batch_, &detail_);
  if (reason != RejectReason::kNone) {
    metrics_->rejected_by_reason[static_cast<int>(reason)]->Add(1);
    spdlog::debug("rejected a message ({}): {}", RejectReasonName(reason), detail_);
    return;
  }
  Job* job = FindOrCreate(batch_.source());
  if (job == nullptr) {
    rejected_too_many_jobs_->Add(1);
    return;
  }
  metrics_->events_batches->Add(1);
  metrics_->events_steps->Add(batch_.steps_size());
  metrics_->events_kernels->Add(batch_.kernels_size());
  metrics_->events_samples->Add(batch_.samples_size());
  if (batch_.created_unix_ns() > 0) {
    metrics_->ingest_lag_seconds->Set(
        static_cast<double>(wall_now_unix_ns - batch_.created_unix_ns()) * 1e-9);
  }
  Count(*job, job->pipeline->AddBatch(batch_, now));
}

JobRouter::Job* JobRouter::FindOrCreate(const v1::SourceIdentity& source) {
  auto it = jobs_.find(source.training_job());
  if (it != jobs_.end()) return &it->second;
  if (jobs_.size() >= options_.max_jobs) return nullptr;
  spdlog::info("new training job '{}' with {} ranks", source.training_job(), source.world_size());
  Job job;
  job.pipeline = std::make_unique<JobPipeline>(source.training_job(), source.world_size(),
                                               options_.pipeline);
  job.steps_aligned = metrics_->StepsAligned(source.training_job());
  job.steps_timed_out = metrics_->StepsTimedOut(source.training_job());
  metrics_->jobs->Set(static_cast<double>(jobs_.size() + 1));
  return &jobs_.emplace(source.training_job(), std::move(job)).first->second;
}

void JobRouter::Count(Job& job, const JobDelta& d) {
  if (d.late) metrics_->rejected_late->Add(d.late);
  if (d.duplicate) metrics_->rejected_duplicate->Add(d.duplicate);
  if (d.rank_out_of_range) metrics_->rejected_rank_out_of_range->Add(d.rank_out_of_range);
  job.unpublished_aligned += d.aligned;
  job.unpublished_timed_out += d.aligned_timed_out;
  if (d.aligned || d.accepted) job.dirty = true;
}

void JobRouter::Tick(TimePoint now) {
  std::vector<Job*> changed_jobs;
  std::vector<JobSnapshot> changed;
  for (auto& [name, job] : jobs_) {
    Count(job, job.pipeline->Tick(now));
    // Silent jobs are re-evaluated every second too: silence is itself a diagnosis (hang).
    if (!job.dirty && now - job.published_at < std::chrono::seconds(1)) continue;
    job.dirty = false;
    job.published_at = now;
    changed_jobs.push_back(&job);
    changed.push_back(job.pipeline->Snapshot(now));
    changed.back().evaluated_unix_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                                           std::chrono::system_clock::now().time_since_epoch())
                                           .count();
  }
  if (changed.empty()) return;
  for (const JobSnapshot& s : changed) metrics_->PublishJob(s);
  snapshots_->Update(std::move(changed));
  for (Job* job : changed_jobs) {
    job->steps_aligned->Add(job->unpublished_aligned);
    job->steps_timed_out->Add(job->unpublished_timed_out);
    job->unpublished_aligned = 0;
    job->unpublished_timed_out = 0;
  }
}

}  // namespace rankwatch
