// The cross-rank timeline of a job: its aligned steps rank by rank, read from the daemon's
// state store (GetTimeline), and their Chrome trace form (`rankwatch timeline`), which Perfetto
// and chrome://tracing open: one process per node (or one for the job), one thread per rank,
// each step a slice with its phases inside, alerts and captures as instant events.
//
// The collectors report how long each phase took, not when it began: the phases of a step are
// laid end to end from the step's start in the order dataloader, forward, backward (or
// forward_backward), optimizer, and the step's remaining time after them is the wait. The
// collective time overlaps the backward pass in data-parallel training; it is an argument of
// the step slice, not a slice of its own.
//
// Pure functions; thread-safe as the stores they read.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "alerting/alert_hub.h"
#include "evidence/capture_store.h"
#include "operators/job_pipeline.h"
#include "rankwatch/v1/service.pb.h"
#include "state/state_store.h"

namespace rankwatch {

// Rank-steps a timeline holds when the request does not say (and the most it may ask for).
inline constexpr uint32_t kDefaultTimelineRankSteps = 200'000;
inline constexpr uint32_t kMaxTimelineRankSteps = 2'000'000;

// The timeline of the job `snapshot` describes, from the steps `store` holds for it. `alerts`
// and `captures` may be null (then none are listed). A range the request gets wrong (first
// after last) is InvalidArgument; unreadable stored steps are DataLoss.
absl::StatusOr<v1::Timeline> BuildTimeline(const JobSnapshot& snapshot,
                                           const v1::GetTimelineRequest& request,
                                           const StateStore& store, const AlertHub* alerts,
                                           const CaptureStore* captures);

enum class TimelineGrouping {
  kNode,  // one process per node, its ranks as threads
  kRank,  // one process for the job, every rank a thread
};

// The Chrome trace event format (JSON object form: {"traceEvents": [...], ...}).
std::string TimelineChromeTrace(const v1::Timeline& timeline, TimelineGrouping grouping);

}  // namespace rankwatch
