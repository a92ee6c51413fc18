// SnapshotStore: the latest immutable JobSnapshot of every job, published by the ingest
// thread and read by the gRPC service.
//
// Thread-safe: writers replace the whole map (copy-on-write); readers get a shared pointer to
// a map that never changes.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include "absl/base/thread_annotations.h"

#include "operators/job_pipeline.h"

namespace rankwatch {

class SnapshotStore {
 public:
  // Snapshots are shared: publishing one job copies pointers, not the other jobs' evidence.
  using Map = std::map<std::string, std::shared_ptr<const JobSnapshot>>;

  std::shared_ptr<const Map> Get() const {
    std::lock_guard<std::mutex> lock(mu_);
    return current_;
  }

  // Forgets a job.
  void Remove(const std::string& job) {
    std::lock_guard<std::mutex> lock(mu_);
    auto next = std::make_shared<Map>(*current_);
    next->erase(job);
    current_ = std::move(next);
  }

  // Publishes shared snapshots for their jobs, keeping the others; first forgets the jobs in
  // `removed` (one copy of the map for all of them).
  void Update(const std::vector<std::shared_ptr<const JobSnapshot>>& updates,
              const std::vector<std::string>& removed = {}) {
    std::lock_guard<std::mutex> lock(mu_);
    auto next = std::make_shared<Map>(*current_);
    for (const std::string& job : removed) next->erase(job);
    for (const auto& s : updates) (*next)[s->training_job] = s;
    current_ = std::move(next);
  }

  // Publishes new snapshots for the jobs in `updates`, keeping the others.
  void Update(std::vector<JobSnapshot> updates) {
    std::lock_guard<std::mutex> lock(mu_);
    auto next = std::make_shared<Map>(*current_);
    for (JobSnapshot& s : updates) {
      std::string job = s.training_job;
      (*next)[job] = std::make_shared<const JobSnapshot>(std::move(s));
    }
    current_ = std::move(next);
  }

 private:
  mutable std::mutex mu_;
  std::shared_ptr<const Map> current_ ABSL_GUARDED_BY(mu_) = std::make_shared<Map>();
};

}  // namespace rankwatch
