#include "runtime/partition_task.h"

#include <spdlog/spdlog.h>

#include "serving/diagnosis_proto.h"

namespace rankwatch {

struct PartitionTask::Job {
  std::unique_ptr<JobPipeline> pipeline;
  bool dirty = true;
  bool unsaved = true;          // changed since the last checkpoint
  bool alerts_unsaved = false;  // alert lifecycle changed since the last checkpoint
  TimePoint published_at{};
  Duration evaluation_cost{};  // of the last snapshot (bounds how often it is re-evaluated)
  bool evaluated = false;      // a snapshot was taken
  TimePoint last_input{};
  bool expired = false;
  TimePoint expired_at{};
  int64_t triggered_unix_ns = 0;  // wall clock of the newest step aligned since evaluation
  std::unique_ptr<kernel::KernelAccumulator> kernel;  // once the job sent kernel events
  bool kernel_dirty = false;
};

PartitionTask::PartitionTask(int32_t partition, const PartitionTaskOptions* options,
                             const TaskSinks* sinks)
    : partition_(partition), options_(options), sinks_(sinks), alerts_(options->alerts) {}

PartitionTask::~PartitionTask() = default;

PartitionTask::Job& PartitionTask::Insert(const std::string& name,
                                          std::unique_ptr<JobPipeline> pipeline, TimePoint now) {
  auto job = std::make_unique<Job>();
  job->pipeline = std::move(pipeline);
  job->last_input = now;
  Job& inserted = *job;
  jobs_.insert_or_assign(name, std::move(job));
  return inserted;
}

void PartitionTask::Add(const v1::Batch& batch, TimePoint now, int64_t wall_now_unix_ns) {
  ReadAgain(now);  // input arrives: whatever the offsets said, the partition is read again
  const v1::SourceIdentity& source = batch.source();
  for (TickHook* hook : sinks_->hooks) hook->OnBatch(batch);
  // Events that answer a control request (trace.capture_id) are evidence, not the rank's live
  // telemetry.
  if (!batch.trace().capture_id().empty()) {
    if (auto it = jobs_.find(source.training_job()); it != jobs_.end()) {
      it->second->last_input = now;
    }
    return;
  }
  auto it = jobs_.find(source.training_job());
  Job* job;
  if (it != jobs_.end()) {
    job = it->second.get();
  } else {
    spdlog::info("new training job '{}' with {} ranks", source.training_job(), source.world_size());
    job = &Insert(source.training_job(),
                  std::make_unique<JobPipeline>(source.training_job(), source.world_size(),
                                                options_->pipeline),
                  now);
    // Its first records may have been among messages lost just before.
    if (recent_loss_) job->pipeline->NoteInputLost(recent_loss_->messages);
  }
  job->last_input = now;
  if (job->expired) {
    spdlog::info("training job '{}' is back after expiring", source.training_job());
    job->expired = false;
  }
  const JobDelta delta = job->pipeline->AddBatch(batch, now);
  if (!delta.note.empty()) spdlog::warn("training job '{}': {}", source.training_job(), delta.note);
  Count(*job, delta, wall_now_unix_ns);
  if (job->kernel == nullptr && batch.kernels_size() > 0) {
    job->kernel =
        std::make_unique<kernel::KernelAccumulator>(source.training_job(), options_->kernel);
  }
  if (job->kernel != nullptr) {
    // Batches without kernel events still matter when they are final (open steps close).
    const kernel::KernelDelta d = job->kernel->Add(batch);
    if (d.steps_closed > 0 || d.late > 0 || d.unstepped > 0 || d.over_limit > 0) {
      job->kernel_dirty = true;
    }
  }
}

void PartitionTask::Consumed(int64_t offset) {
  next_offset_ = offset + 1;
  offset_unsaved_ = true;
  if (recent_loss_ && *next_offset_ >= recent_loss_->until) recent_loss_.reset();
}

void PartitionTask::StartsAt(int64_t offset) {
  next_offset_ = offset;
  offset_unsaved_ = true;
}

void PartitionTask::InputLost(uint64_t messages, int64_t log_end) {
  for (auto& [name, job] : jobs_) {
    job->pipeline->NoteInputLost(messages);
    job->dirty = true;
    job->unsaved = true;
  }
  if (!recent_loss_) recent_loss_.emplace();
  recent_loss_->messages += messages;
  recent_loss_->until = std::max(recent_loss_->until, log_end);
}

void PartitionTask::MoveJob(const std::string& name, PartitionTask* to) {
  auto it = jobs_.find(name);
  if (it == jobs_.end()) return;
  std::unique_ptr<Job> job = std::move(it->second);
  jobs_.erase(it);
  // Its alert lifecycle goes with it.
  to->alerts_.RestoreJob(alerts_.ExportJob(name));
  alerts_.DropJob(name);
  job->unsaved = true;  // its metadata names the new partition
  job->alerts_unsaved = true;
  to->jobs_.insert_or_assign(name, std::move(job));
}

void PartitionTask::Forget(const std::string& name) {
  alerts_.DropJob(name);
  jobs_.erase(name);
}

void PartitionTask::Evict(const std::string& name) {
  auto it = jobs_.find(name);
  if (it == jobs_.end()) return;
  removed_.push_back(name);
  Drop(it);
}

uint32_t PartitionTask::WorldSizeOf(const std::string& name) const {
  auto it = jobs_.find(name);
  return it == jobs_.end() ? 0 : it->second->pipeline->world_size();
}

uint64_t PartitionTask::CompleteStepsOf(const std::string& name) const {
  auto it = jobs_.find(name);
  return it == jobs_.end() ? 0 : it->second->pipeline->complete_steps();
}

void PartitionTask::Count(Job& job, const JobDelta& d, int64_t wall_now_unix_ns) {
  DaemonMetrics* m = sinks_->metrics;
  if (d.aligned) job.triggered_unix_ns = wall_now_unix_ns;
  if (d.late) m->rejected_late->Add(d.late);
  if (d.duplicate) m->rejected_duplicate->Add(d.duplicate);
  if (d.rank_out_of_range) m->rejected_rank_out_of_range->Add(d.rank_out_of_range);
  if (d.rank_conflict) m->rejected_rank_conflict->Add(d.rank_conflict);
  if (d.stale_world_size) m->rejected_stale_world_size->Add(d.stale_world_size);
  if (d.step_jump) m->rejected_step_jump->Add(d.step_jump);
  if (d.world_size_changed) m->world_size_changes->Add(d.world_size_changed);
  if (d.aligned || d.accepted) {
    job.dirty = true;
    job.unsaved = true;
  }
}

void PartitionTask::Drop(std::map<std::string, std::unique_ptr<Job>, std::less<>>::iterator it) {
  const std::string& name = it->first;
  alerts_.DropJob(name);
  if (it->second->kernel != nullptr) {
    sinks_->metrics->kernel.RemoveJob(name);
    if (sinks_->kernel_snapshots != nullptr) sinks_->kernel_snapshots->Remove(name);
  }
  if (sinks_->alert_hub != nullptr) sinks_->alert_hub->SetFiring(name, {});
  sinks_->metrics->RemoveJob(name);
  dropped_snapshots_.push_back(name);
  jobs_.erase(it);
}

void PartitionTask::Expire(TimePoint now, int64_t wall_now_unix_ns, TickOutput* out) {
  for (auto it = jobs_.begin(); it != jobs_.end();) {
    Job& job = *it->second;
    if (!job.expired && now - job.last_input >= options_->job_ttl) {
      job.expired = true;
      job.expired_at = now;
      spdlog::info(
          "training job '{}' expired: no input for {:.0f} s; its last diagnosis stays "
          "queryable for {:.0f} s",
          it->first, std::chrono::duration<double>(options_->job_ttl).count(),
          std::chrono::duration<double>(options_->job_retention).count());
    }
    if (job.expired && now - job.expired_at >= options_->job_retention) {
      spdlog::info("training job '{}' removed", it->first);
      ToAlerts(alerts_.ForgetJob(it->first, wall_now_unix_ns), it->first, wall_now_unix_ns, out);
      removed_.push_back(it->first);
      just_removed_.push_back(it->first);
      Drop(it++);
    } else {
      ++it;
    }
  }
}

void PartitionTask::Evaluate(TimePoint now, int64_t wall_now_unix_ns, TickOutput* out,
                             Duration fleet_evaluation_cost) {
  std::vector<DueEvaluation> due;
  PlanEvaluation(now, wall_now_unix_ns, out, fleet_evaluation_cost, &due);
  for (DueEvaluation& d : due) d.Run(now, options_->stopwatch);
  FinishEvaluation(wall_now_unix_ns, &due, out);
}

void PartitionTask::DueEvaluation::Run(TimePoint now, TimePoint (*stopwatch)()) {
  const TimePoint started = stopwatch();
  snapshot = std::make_shared<JobSnapshot>(pipeline->Snapshot(now));
  cost = stopwatch() - started;
}

void PartitionTask::PlanEvaluation(TimePoint now, int64_t wall_now_unix_ns, TickOutput* out,
                                   Duration fleet_evaluation_cost,
                                   std::vector<DueEvaluation>* due) {
  evaluated_.clear();
  Expire(now, wall_now_unix_ns, out);
  evaluation_costs_ = {};
  for (auto& [name, job_ptr] : jobs_) {
    Job& job = *job_ptr;
    if (job.kernel_dirty) {
      job.kernel_dirty = false;
      auto snapshot = std::make_shared<const kernel::KernelJobSnapshot>(job.kernel->Snapshot());
      sinks_->metrics->kernel.Publish(*snapshot);
      if (sinks_->kernel_snapshots != nullptr)
        sinks_->kernel_snapshots->Update(std::move(snapshot));
    }
    if (job.expired) continue;                 // its last diagnosis is frozen
    evaluation_costs_ += job.evaluation_cost;  // its latest (updated when re-evaluated)
    // Until its partition is read again, a restored job's open steps wait (ResumeAt).
    if (!restored_unread_since_) Count(job, job.pipeline->Tick(now), wall_now_unix_ns);
    // Silent jobs are re-evaluated every second too: silence is itself a diagnosis (a hang),
    // and alerts pending on a diagnosis fire with time. Only jobs with the steps they are
    // judged on: ids that never became jobs cost nothing while silent.
    if (!job.dirty &&
        (!job.pipeline->judged() || now - job.published_at < std::chrono::seconds(1))) {
      continue;
    }
    // A job whose evaluation is costly (thousands of ranks), or one of many that change (a
    // fleet of jobs, a backlog read at many steps a second), is re-evaluated at most every ten
    // times its cost or the fleet's, so that evaluating takes at most ~10% of the ingest thread.
    // A job's first evaluation does not wait.
    if (job.dirty && job.evaluated &&
        now - job.published_at < 10 * std::max(job.evaluation_cost, fleet_evaluation_cost)) {
      continue;
    }
    job.dirty = false;
    job.evaluated = true;
    job.published_at = now;
    // Ranks serving evidence (a capture) may lag: their silence is not a hang.
    for (const TickHook* hook : sinks_->hooks) {
      job.pipeline->NoteEvidenceBusy(hook->BusyRanks(name, wall_now_unix_ns), now);
    }
    due->push_back({&job, job.pipeline.get(), nullptr, {}});
  }
}

void PartitionTask::FinishEvaluation(int64_t wall_now_unix_ns, std::vector<DueEvaluation>* due,
                                     TickOutput* out) {
  for (DueEvaluation& d : *due) {
    evaluation_costs_ += d.cost - d.job->evaluation_cost;
    d.job->evaluation_cost = d.cost;
    d.snapshot->evaluated_unix_ns = wall_now_unix_ns;
    evaluated_.emplace_back(d.job, d.snapshot);
    out->snapshots.push_back(std::move(d.snapshot));
  }
  due->clear();
}

void PartitionTask::RaiseAlerts(int64_t wall_now_unix_ns, TickOutput* out) {
  for (auto& [job, snapshot] : evaluated_) {
    // The trigger is the newest step aligned since the job's previous evaluation; without one
    // (silence: a hang, or a finished job's clean evaluations) the evaluation itself.
    const int64_t triggered =
        job->triggered_unix_ns > 0 ? job->triggered_unix_ns : wall_now_unix_ns;
    job->triggered_unix_ns = 0;
    const std::string& name = snapshot->training_job;
    ToAlerts(alerts_.Evaluate(snapshot, wall_now_unix_ns), name, triggered, out);
  }
  evaluated_.clear();
  // What the jobs' straggler alerts charged their nodes (kept with the jobs' alert state).
  for (NodeCharge& c : alerts_.TakeNodeCharges()) {
    if (auto it = jobs_.find(c.training_job); it != jobs_.end()) it->second->alerts_unsaved = true;
    out->node_charges.push_back(std::move(c));
  }
}

void PartitionTask::ToAlerts(const std::vector<AlertEvent>& events, const std::string& job,
                             int64_t triggered, TickOutput* out) {
  if (events.empty()) return;
  DaemonMetrics* m = sinks_->metrics;
  for (const AlertEvent& e : events) {
    m->CountAlert(e.kind, e.state);
    // Subscribers see an alert fire and resolve; one that never fired stays internal.
    if (e.state == AlertState::kPending || (e.state == AlertState::kResolved && !e.fired)) continue;
    const bool memory = e.kind == AlertKind::kMemoryCreep || e.kind == AlertKind::kMemoryPressure ||
                        e.kind == AlertKind::kMemoryImbalance;
    // A pipeline job's straggler alert comes from its what-if verdict.
    const bool whatif = e.kind == AlertKind::kStraggler && e.evidence && e.evidence->whatif &&
                        e.evidence->whatif->verdict.verdict != whatif::Verdict::kNone &&
                        e.evidence->whatif->verdict.verdict != whatif::Verdict::kBalanced;
    const std::string note = !e.evidence ? std::string()
                             : memory    ? e.evidence->memory.note
                             : whatif    ? e.evidence->whatif->verdict.note
                                         : e.evidence->step.note;
    if (e.state == AlertState::kFiring) {
      spdlog::warn("alert firing: {} ({}): {}", e.id, SeverityName(e.severity), note);
    } else {
      spdlog::info("alert resolved: {}", e.id);
    }
    out->alerts.emplace_back();
    ToProto(e, &out->alerts.back());
    out->alerts.back().set_triggered_unix_ns(triggered);
  }
  m->SetFiring(job, alerts_.Firing(job));
  auto it = jobs_.find(job);
  if (it != jobs_.end()) it->second->alerts_unsaved = true;
  // The job's lifecycle state is stored with its alerts, so a restart neither forgets a firing
  // alert nor fires it again.
  job_state::PutJobAlerts(job, alerts_.ExportJob(job), &out->alert_states);
}

bool PartitionTask::changed() const {
  if (offset_unsaved_ || !removed_.empty()) return true;
  for (const auto& [name, job] : jobs_) {
    if (job->unsaved || job->alerts_unsaved) return true;
  }
  return false;
}

void PartitionTask::Checkpoint(TimePoint now, int64_t wall_now_unix_ns,
                               rankwatch::Checkpoint* out) {
  // Removals first: a job removed and then back since the last checkpoint is stored anew.
  for (const std::string& name : removed_) job_state::DeleteJob(name, out);
  removed_.clear();
  for (auto& [name, job] : jobs_) {
    if (job->unsaved) {
      job->unsaved = false;
      JobCheckpoint jc = job->pipeline->TakeCheckpoint(now, wall_now_unix_ns);
      if (partition_ >= 0) jc.meta.set_kafka_partition(partition_);
      job_state::PutJob(name, std::move(jc.meta), std::move(jc.new_steps), jc.keep_from_step, out);
      if (!jc.new_whatif_steps.empty() || jc.whatif_keep_from_step > 0) {
        job_state::PutWhatIfSteps(name, std::move(jc.new_whatif_steps), jc.whatif_keep_from_step,
                                  out);
      }
    }
    if (job->alerts_unsaved) {
      job->alerts_unsaved = false;
      job_state::PutJobAlerts(name, alerts_.ExportJob(name), out);
    }
  }
  offset_unsaved_ = false;
}

absl::Status PartitionTask::Restore(std::vector<job_state::StoredJob> stored, TimePoint now,
                                    int64_t wall_now_unix_ns) {
  for (job_state::StoredJob& s : stored) {
    auto pipeline = JobPipeline::Restore(s.meta, s.steps, options_->pipeline, now, wall_now_unix_ns,
                                         s.whatif_steps);
    if (!pipeline.ok()) return pipeline.status();
    const std::string& name = s.meta.training_job();
    Job& job = Insert(name, std::move(*pipeline), now);
    job.unsaved = false;
    if (s.alerts) {
      alerts_.RestoreJob(*s.alerts);
      if (sinks_->alert_hub != nullptr) {
        std::vector<std::string> firing;
        for (const auto& a : s.alerts->alerts()) {
          if (a.state() == static_cast<uint32_t>(AlertState::kFiring)) firing.push_back(a.id());
        }
        sinks_->alert_hub->SetFiring(name, std::move(firing));
      }
    }
    spdlog::debug("restored training job '{}': {} aligned steps, {} stored steps", name,
                  s.meta.aligned_steps(), s.steps.size());
  }
  if (partition_ >= 0 && !stored.empty()) restored_unread_since_ = now;
  return absl::OkStatus();
}

void PartitionTask::ResumeAt(int64_t offset, TimePoint now) {
  resumed_at_ = offset;
  ReadAgain(now);
}

void PartitionTask::ReadAgain(TimePoint now) {
  if (!restored_unread_since_) return;
  const Duration held = now - *restored_unread_since_;
  for (auto& [name, job] : jobs_) job->pipeline->DelayAlignment(held);
  restored_unread_since_.reset();
}

void PartitionTask::Release() {
  const size_t released = jobs_.size();
  while (!jobs_.empty()) Drop(jobs_.begin());
  if (released > 0) spdlog::info("released {} training jobs of partition {}", released, partition_);
}

std::vector<std::string> PartitionTask::JobNames() const {
  std::vector<std::string> names;
  names.reserve(jobs_.size());
  for (const auto& [name, job] : jobs_) names.push_back(name);
  return names;
}

}  // namespace rankwatch
