// JobRouter: the daemon's ingest stage without Kafka — decodes each message, routes its
// records to the job's pipeline (created on first sight), counts everything in the daemon
// metrics, and publishes job snapshots.
//
// Not thread-safe: owned by the ingest thread (the single owner of every job's state).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>

#include "ingest/batch_decoder.h"
#include "operators/job_pipeline.h"
#include "sinks/daemon_metrics.h"
#include "sinks/snapshot_store.h"

namespace rankwatch {

struct JobRouterOptions {
  JobPipelineOptions pipeline;
  BatchLimits limits;
  size_t max_jobs = 10'000;  // default: 10,000; batches of further jobs are rejected
};

class JobRouter {
 public:
  JobRouter(JobRouterOptions options, DaemonMetrics* metrics, SnapshotStore* snapshots);

  // Handles one Kafka message. `wall_now_unix_ns` is used for the lag metric only.
  void HandleMessage(std::string_view payload, TimePoint now, int64_t wall_now_unix_ns);

  // Expires alignment timeouts and publishes snapshots of the jobs that changed: first to the
  // SnapshotStore, then to the metrics.
  void Tick(TimePoint now);

  size_t jobs() const { return jobs_.size(); }

 private:
  struct Job {
    std::unique_ptr<JobPipeline> pipeline;
    MetricCell* steps_aligned;
    MetricCell* steps_timed_out;
    // Aligned since the last publication: counted at Tick together with the snapshot, so a
    // scrape never sees a step count ahead of the statistics of those steps.
    uint32_t unpublished_aligned = 0;
    uint32_t unpublished_timed_out = 0;
    bool dirty = true;
    TimePoint published_at{};
  };

  Job* FindOrCreate(const v1::SourceIdentity& source);
  void Count(Job& job, const JobDelta& delta);

  const JobRouterOptions options_;
  DaemonMetrics* metrics_;
  SnapshotStore* snapshots_;
  BatchDecoder decoder_;
  v1::Batch batch_;  // reused decode target
  std::string detail_;
  std::map<std::string, Job, std::less<>> jobs_;
  MetricCell* rejected_too_many_jobs_;
};

}  // namespace rankwatch
