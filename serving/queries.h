// Queries: the read-only answers rankwatchd gives about its jobs — every job's summary, a
// job's diagnosis (with what the daemon's parts add to it), one rank's detail, captures, the
// cross-rank timeline, the ranks x steps heatmap, a job's alerts, the fleet view of nodes — built
// once for every front end (the gRPC service, the web UI's JSON API), so that they say the same
// thing about the same snapshot. What the parts serve (captures, nodes, diagnosis evidence) is
// found in their PartServices (parts/part_services.h); a service no part offers answers
// Unavailable.
//
// Errors are absl statuses: NotFound (no such job, capture), OutOfRange (a rank past the
// world size), Unavailable (the feature is off), InvalidArgument (a bad request), DataLoss
// (unreadable stored state).
//
// Thread-safe: every source it reads is.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "alerting/alert_hub.h"
#include "parts/part_services.h"
#include "rankwatch/v1/service.pb.h"
#include "serving/kernel_snapshot_store.h"
#include "serving/snapshot_store.h"
#include "state/state_store.h"

namespace rankwatch {

// What the queries read. Only `snapshots` is required; a null source turns its queries off.
struct QuerySources {
  const SnapshotStore* snapshots = nullptr;
  const AlertHub* alerts = nullptr;              // firing alerts, a job's alerts
  const KernelSnapshotStore* kernels = nullptr;  // per-rank GPU timelines
  const StateStore* state = nullptr;             // timelines
  // What the daemon's parts serve: what they add to a diagnosis, the capture store
  // (evidence/capture_store.h), the fleet view of nodes (fleet/node_view.h).
  const PartServices* parts = nullptr;
};

// A job's window of steps, rank by rank, as the web UI's heatmap draws it: per step its number
// and whether it timed out; for one metric — STEP (step time), OWN (step time less the time
// blocked on other ranks, as the diagnosis counts it) or a phase by its upper-case name
// (FORWARD, ...) — the value of every rank and step in milliseconds, rank-major
// (values[rank * steps.size() + s]), NaN where a rank did not report it.
struct JobHeatmap {
  std::string training_job;
  uint32_t world_size = 0;
  bool truncated = false;  // older steps of the window were left out (max_rank_steps)
  std::vector<uint64_t> steps;
  std::vector<bool> timed_out;
  std::vector<uint32_t> culprit_ranks;
  std::vector<std::string> rank_nodes;
  std::vector<std::string> metrics;  // the metrics the steps hold, STEP and OWN first
  std::string metric;                // the one in `values`
  std::vector<float> values;
  // With a rank asked for: `values` holds that rank's steps only, and `medians` each step's
  // median over every rank that reported it.
  std::optional<uint32_t> rank;
  std::vector<float> medians;
};

class Queries {
 public:
  explicit Queries(QuerySources sources) : s_(sources) {}

  // Every job with its labels, culprits, shares, lost time and firing alerts.
  v1::ListJobsResponse ListJobs() const;
  // The job's whole diagnosis with evidence, its newest capture comparison and, while hung,
  // its ranks' stacks.
  absl::StatusOr<v1::Diagnosis> GetDiagnosis(const std::string& job) const;
  // One rank's phases against the median rank, memory peaks and GPU timeline.
  absl::StatusOr<v1::RankDetail> GetRankDetail(const std::string& job, uint32_t rank) const;
  // Captures of `job` (every job when empty), newest first.
  absl::StatusOr<v1::ListCapturesResponse> ListCaptures(const std::string& job) const;
  absl::StatusOr<v1::GetCaptureResponse> GetCapture(const std::string& id, bool with_events) const;
  // The job's stored steps rank by rank, its alert events and captures (serving/timeline.h).
  absl::StatusOr<v1::Timeline> GetTimeline(const v1::GetTimelineRequest& request) const;
  // The job's newest `max` stored alerts (raised, updated, resolved), newest first; NotFound
  // for an unknown job.
  absl::StatusOr<std::vector<v1::Alert>> RecentAlerts(const std::string& job, size_t max) const;

  // `metric` (empty: OWN where known, else STEP) over the diagnosis window's stored steps (the
  // store lags the live diagnosis by up to a checkpoint interval), at most `max_rank_steps`
  // rank-steps, the newest kept. A metric the steps do not hold is InvalidArgument.
  // With `rank`: that rank's values and every step's median over the ranks (OutOfRange past
  // the world size).
  absl::StatusOr<JobHeatmap> GetHeatmap(const std::string& job, const std::string& metric,
                                        uint32_t max_rank_steps,
                                        std::optional<uint32_t> rank = std::nullopt) const;

  // The fleet view of nodes as of now (the wall clock): the top nodes by lost rank-seconds, or
  // one node with its jobs (an unknown one: no node). Unavailable without a NodeView.
  absl::StatusOr<v1::ListNodesResponse> ListNodes(const v1::ListNodesRequest& request) const;
  // One node's record with its jobs; NotFound when the view holds none within its horizon.
  absl::StatusOr<v1::ListNodesResponse> GetNode(const std::string& node) const;

  const QuerySources& sources() const { return s_; }

 private:
  const QuerySources s_;
};

}  // namespace rankwatch
