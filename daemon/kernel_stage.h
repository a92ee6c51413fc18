// KernelStage: the daemon's live GPU-timeline stage. It feeds the kernel events of every
// validated batch to the job's KernelAccumulator (created on first sight), and publishes the
// snapshots of jobs that changed — to KernelSnapshotStore (HTTP /kernel, gRPC per-rank detail)
// and to KernelMetrics. Kernel state is in memory only: it is not checkpointed, so after a
// restart the kernel results start again from the batches consumed after it.
//
// Not thread-safe: owned by the ingest thread, like JobRouter, which calls it.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "operators/kernel/kernel_accumulator.h"
#include "sinks/kernel_metrics.h"
#include "sinks/kernel_snapshot_store.h"

namespace rankwatch {

class KernelStage {
 public:
  // `metrics` and `snapshots` may be null (nothing is published there); both outlive the stage.
  KernelStage(kernel::KernelAccumulatorOptions options, KernelMetrics* metrics,
              KernelSnapshotStore* snapshots);

  // Adds the kernel events of a validated batch; batches without kernel events only matter
  // when they are final (the rank's open steps close).
  void Add(const v1::Batch& batch);

  // Publishes the jobs changed since the previous call.
  void Publish();

  // Forgets a job (expired, or its partition moved to another instance).
  void DropJob(const std::string& job);

  const kernel::KernelAccumulator* Find(const std::string& job) const;

 private:
  struct Job {
    std::unique_ptr<kernel::KernelAccumulator> accumulator;
    bool dirty = false;
  };

  const kernel::KernelAccumulatorOptions options_;
  KernelMetrics* metrics_;
  KernelSnapshotStore* snapshots_;
  std::map<std::string, Job, std::less<>> jobs_;
};

}  // namespace rankwatch
