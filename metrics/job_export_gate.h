// JobExportGate: decides which training job ids get per-job Prometheus series (cardinality by
// design). Every id the daemon evaluates is a *candidate* until what it sent makes it
// a job; only jobs are exported, and at most `max_exported` of them.
//
//  - An id becomes a job when an evaluation shows evidence that it is one (the caller judges:
//    DaemonMetrics says a step aligned with at least two ranks present, or `min_steps` aligned
//    steps; for kernel results, two ranks or `min_steps` analysed steps). It stays a job until
//    it is removed: the evidence is sticky.
//  - Jobs are exported in the order they became jobs: the first `max_exported` are exported, the
//    rest are *over the limit* (counted, not exported). When an exported job is removed, the
//    over-the-limit job that became a job first takes its place (its series appear at its next
//    evaluation). Exported series never move from one job to another while both run in this
//    process and it keeps their partitions, so a dashboard does not flap, and a later flood
//    cannot displace the jobs already exported. A restart or a rebalance (eager: every
//    partition is released and assigned again) forgets the order: the jobs are exported again
//    in the order they are restored and evaluated.
//  - Ids that never become jobs cost no series: they are counted (candidates()).
//
// Owned by DaemonMetrics. Thread-safe (one mutex): the ingest thread evaluates and removes jobs;
// any thread may read.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "metrics/prometheus_registry.h"

namespace rankwatch {

struct JobExportOptions {
  // Aligned steps (or analysed kernel steps) that make a one-rank id a job. Default 5.
  uint64_t min_steps = 5;
  // Jobs exported at most. Default 1,000.
  size_t max_exported = 1'000;
};

class JobExportGate {
 public:
  enum class State { kCandidate, kExported, kOverLimit };
  struct Counts {
    size_t candidates = 0;
    size_t exported = 0;
    size_t over_limit = 0;
  };

  explicit JobExportGate(JobExportOptions options) : options_(options) {}

  // Gauges kept equal to counts() from now on (each may be null); they outlive the gate.
  void ShowCountsIn(MetricCell* candidates, MetricCell* exported, MetricCell* over_limit);

  const JobExportOptions& options() const { return options_; }

  // One evaluation of `job`; `is_job`: what it showed makes the id a job. Returns the id's
  // state after it (kExported: publish its series).
  State Evaluate(const std::string& job, bool is_job);

  // Whether `job` became a job (exported or over the limit); false for an unknown id.
  bool IsJob(const std::string& job) const;
  // Whether `job` is exported.
  bool Exported(const std::string& job) const;

  // Forgets `job` (retired, evicted, released). Returns whether it was exported (its series
  // are to be removed). An over-the-limit job may be exported in its place.
  bool Remove(const std::string& job);

  Counts counts() const;

 private:
  struct Entry {
    State state = State::kCandidate;
    uint64_t became_job = 0;  // sequence number, for jobs
  };

  const JobExportOptions options_;
  mutable std::mutex mu_;
  std::map<std::string, Entry, std::less<>> ids_ ABSL_GUARDED_BY(mu_);
  // Over-the-limit jobs in the order they became jobs.
  std::set<std::pair<uint64_t, std::string>> waiting_ ABSL_GUARDED_BY(mu_);
  uint64_t next_sequence_ ABSL_GUARDED_BY(mu_) = 0;
  Counts counts_ ABSL_GUARDED_BY(mu_);
  MetricCell* shown_[3] ABSL_GUARDED_BY(mu_) = {nullptr, nullptr, nullptr};
  void Show() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
};

}  // namespace rankwatch
