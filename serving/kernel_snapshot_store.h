// KernelSnapshotStore: the latest immutable KernelJobSnapshot of every job with kernel events
// (per-rank GPU-timeline summaries, job aggregates, outlier ranks), published by the ingest
// thread and read by the HTTP `/kernel` endpoint and, later, gRPC's per-rank detail:
//
//   auto job = store.Get("my-job");                        // nullptr when unknown
//   const kernel::RankKernelSummary* r = job->Rank(3);     // nullptr when rank 3 has no step yet
//
// Thread-safe: writers replace the whole map (copy-on-write); readers get a shared pointer to a
// map that never changes.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include "absl/base/thread_annotations.h"

#include "operators/kernel/kernel_job_summary.h"

namespace rankwatch {

class KernelSnapshotStore {
 public:
  using Map = std::map<std::string, std::shared_ptr<const kernel::KernelJobSnapshot>>;

  std::shared_ptr<const Map> GetAll() const {
    std::lock_guard<std::mutex> lock(mu_);
    return current_;
  }

  // The job's snapshot, or nullptr.
  std::shared_ptr<const kernel::KernelJobSnapshot> Get(const std::string& job) const {
    auto all = GetAll();
    auto it = all->find(job);
    return it == all->end() ? nullptr : it->second;
  }

  void Update(std::shared_ptr<const kernel::KernelJobSnapshot> snapshot) {
    std::lock_guard<std::mutex> lock(mu_);
    auto next = std::make_shared<Map>(*current_);
    (*next)[snapshot->training_job] = std::move(snapshot);
    current_ = std::move(next);
  }

  void Remove(const std::string& job) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!current_->contains(job)) return;
    auto next = std::make_shared<Map>(*current_);
    next->erase(job);
    current_ = std::move(next);
  }

 private:
  mutable std::mutex mu_;
  std::shared_ptr<const Map> current_ ABSL_GUARDED_BY(mu_) = std::make_shared<Map>();
};

}  // namespace rankwatch
