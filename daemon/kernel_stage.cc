#include "daemon/kernel_stage.h"

namespace rankwatch {

KernelStage::KernelStage(kernel::KernelAccumulatorOptions options, KernelMetrics* metrics,
                         KernelSnapshotStore* snapshots)
    : options_(std::move(options)), metrics_(metrics), snapshots_(snapshots) {}

void KernelStage::Add(const v1::Batch& batch) {
  const std::string& name = batch.source().training_job();
  auto it = jobs_.find(name);
  if (it == jobs_.end()) {
    if (batch.kernels_size() == 0) return;  // a job without kernel events has no kernel stage
    it = jobs_.emplace(name, Job{std::make_unique<kernel::KernelAccumulator>(name, options_)}).first;
  }
  const kernel::KernelDelta d = it->second.accumulator->Add(batch);
  if (d.steps_closed > 0 || d.late > 0 || d.unstepped > 0 || d.over_limit > 0) it->second.dirty = true;
}

void KernelStage::Publish() {
  for (auto& [name, job] : jobs_) {
    if (!job.dirty) continue;
    job.dirty = false;
    auto snapshot = std::make_shared<const kernel::KernelJobSnapshot>(job.accumulator->Snapshot());
    if (metrics_ != nullptr) metrics_->Publish(*snapshot);
    if (snapshots_ != nullptr) snapshots_->Update(std::move(snapshot));
  }
}

void KernelStage::DropJob(const std::string& job) {
  jobs_.erase(job);
  if (metrics_ != nullptr) metrics_->RemoveJob(job);
  if (snapshots_ != nullptr) snapshots_->Remove(job);
}

const kernel::KernelAccumulator* KernelStage::Find(const std::string& job) const {
  auto it = jobs_.find(job);
  return it == jobs_.end() ? nullptr : it->second.accumulator.get();
}

}  // namespace rankwatch
