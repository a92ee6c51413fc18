#include "operators/step_time/scores.h"

#include <algorithm>

namespace rankwatch::step_time {
namespace {

// The worst rank's excess over the median rank, per unit of burden; 0 with fewer than 2 ranks.
double Score(const SignalEvidence& e, double burden) {
  if (!e.stat.present || e.stat.ranks < 2 || burden <= 0) return 0;
  return std::max(0.0, e.stat.worst_seconds - e.stat.median_seconds) / burden;
}

}  // namespace

Excess Largest(const RankValues& excess) {
  Excess best;
  for (uint32_t r = 0; r < excess.size(); ++r) {
    if (Known(excess[r]) && excess[r] > best.seconds) best = {r, excess[r]};
  }
  return best;
}

StragglerScores ScoreStragglers(const StepWindow& w, const WindowSignals& s,
                                const OwnTimeSignals& t, const StepDiagnosisOptions& o) {
  StragglerScores x;
  const double step_median = s.step().median_seconds;
  x.burden = t.compute_evidence.stat.present
                 ? s.Median(Phase::kDataloader) + t.compute_evidence.stat.median_seconds
                 : step_median;
  x.onset = NewestSteps(w, o.onset_steps, t.blocked);
  x.onset_burden = t.compute_evidence.stat.present ? x.onset.burden : step_median;
  const bool full_counts = w.size() >= std::min<size_t>(2 * size_t{o.onset_steps}, w.capacity());
  auto score = [&](const SignalEvidence& evidence, const RankValues& onset_excess) {
    SignalScore sc;
    sc.onset_worst = Largest(onset_excess);
    sc.full = full_counts ? Score(evidence, x.burden) : 0;
    sc.onset = x.onset_burden > 0 ? sc.onset_worst.seconds / x.onset_burden : 0;
    return sc;
  };
  x.input = score(s.evidence[PhaseIndex(Phase::kDataloader)], x.onset.dl_excess);
  x.compute = score(t.compute_evidence, x.onset.compute_excess);
  if (!s.ComputeConsistent()) x.compute.full = x.compute.onset = 0;
  x.own = score(t.own_evidence, x.onset.own_excess);
  x.input_hit = AtLeast(x.input.score(), o.straggler_warn);
  x.compute_hit = AtLeast(x.compute.score(), o.straggler_warn);
  x.own_hit = AtLeast(x.own.score(), o.straggler_warn);
  return x;
}

}  // namespace rankwatch::step_time
