// Which ranks a capture asks for a profiler trace, and which two of them it compares: the
// job's culprit and a typical rank when no one says, or the ranks someone named. One choice for
// every front end that starts captures (the gRPC service, the JSON API) and for the automatic
// captures a straggler alert starts (evidence/capture_store.h).
//
// Pure functions of a job's snapshot; thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "operators/job_pipeline.h"
#include "rankwatch/v1/service.pb.h"

namespace rankwatch {

struct CaptureRanks {
  std::vector<uint32_t> ranks;  // the ranks asked (unsorted, as chosen)
  int32_t culprit = -1;         // compared with `reference` when both are set (-1: none)
  int32_t reference = -1;
};

// The job's culprit (its first culprit rank) and a typical rank to compare it with: the
// non-culprit rank whose mean compute time over the window (forward, backward and optimizer
// less the time in collectives; else its step time) is the median; any other rank when none
// reports them. Nothing when the job names no culprit or has a single rank.
std::optional<std::pair<uint32_t, uint32_t>> CulpritAndReference(const JobSnapshot& snapshot);

// The ranks an on-demand capture (RequestCapture) of the job `snapshot` describes asks:
//  - no ranks named: the job's culprit and a typical rank, compared; FailedPrecondition when the
//    job names no culprit now;
//  - ranks named with a reference rank: those and the reference, ranks[0] compared with it;
//  - ranks named alone: those, compared with nothing.
// The ranks themselves are checked when the capture is requested (CaptureStore::Request).
absl::StatusOr<CaptureRanks> ChooseCaptureRanks(const v1::RequestCaptureRequest& request,
                                                const JobSnapshot& snapshot);

// A rank's per-step mean of `phase` over the snapshot's window, in seconds; NaN when unknown.
double RankMeanSeconds(const JobSnapshot& snapshot, uint32_t rank, Phase phase);

}  // namespace rankwatch
