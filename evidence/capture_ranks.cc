#include "evidence/capture_ranks.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "operators/step_time_diagnosis.h"

namespace rankwatch {
namespace {

// A rank's own compute per step: forward + backward + optimizer (or forward_backward) minus its
// time in collectives; NaN when it reports none of them.
double ComputeOf(const JobSnapshot& s, uint32_t rank) {
  double sum = 0;
  bool any = false;
  for (Phase p : {Phase::kForward, Phase::kBackward, Phase::kOptimizer, Phase::kForwardBackward}) {
    const double m = RankMeanSeconds(s, rank, p);
    if (!std::isnan(m)) {
      sum += m;
      any = true;
    }
  }
  if (!any) return std::nan("");
  const double collective = RankMeanSeconds(s, rank, Phase::kCollective);
  return std::isnan(collective) ? sum : sum - collective;
}

}  // namespace

double RankMeanSeconds(const JobSnapshot& s, uint32_t rank, Phase phase) {
  if (!s.rank_totals || rank >= s.rank_totals->size()) return std::nan("");
  return WindowMean((*s.rank_totals)[rank], phase);
}

std::optional<std::pair<uint32_t, uint32_t>> CulpritAndReference(const JobSnapshot& s) {
  if (s.step.culprit_ranks.empty() || s.world_size < 2) return std::nullopt;
  const uint32_t culprit = s.step.culprit_ranks.front();
  std::vector<std::pair<double, uint32_t>> typical;  // (compute time, rank), non-culprits
  for (uint32_t r = 0; r < s.world_size; ++r) {
    if (std::find(s.step.culprit_ranks.begin(), s.step.culprit_ranks.end(), r) !=
        s.step.culprit_ranks.end()) {
      continue;
    }
    double t = ComputeOf(s, r);
    if (std::isnan(t)) t = RankMeanSeconds(s, r, Phase::kStep);
    if (!std::isnan(t)) typical.emplace_back(t, r);
  }
  if (typical.empty()) {
    // No per-rank figures: any rank that is not a culprit.
    for (uint32_t r = 0; r < s.world_size; ++r) {
      if (r != culprit) return std::make_pair(culprit, r);
    }
    return std::nullopt;
  }
  std::nth_element(typical.begin(), typical.begin() + typical.size() / 2, typical.end());
  return std::make_pair(culprit, typical[typical.size() / 2].second);
}

absl::StatusOr<CaptureRanks> ChooseCaptureRanks(const v1::RequestCaptureRequest& request,
                                                const JobSnapshot& snapshot) {
  CaptureRanks out;
  out.ranks.assign(request.ranks().begin(), request.ranks().end());
  if (out.ranks.empty()) {
    const auto pair = CulpritAndReference(snapshot);
    if (!pair) {
      return absl::FailedPreconditionError("training job '" + snapshot.training_job +
                                           "' names no culprit rank now: say which ranks to "
                                           "capture");
    }
    out.ranks = {pair->first, pair->second};
    out.culprit = static_cast<int32_t>(pair->first);
    out.reference = static_cast<int32_t>(pair->second);
  } else if (request.has_reference_rank()) {
    out.culprit = static_cast<int32_t>(out.ranks.front());
    out.reference = static_cast<int32_t>(request.reference_rank());
    out.ranks.push_back(request.reference_rank());
  }
  return out;
}

}  // namespace rankwatch
