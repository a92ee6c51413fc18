#include "operators/step_time/cause.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <functional>
#include <vector>

#include "operators/phase_stats.h"

namespace rankwatch::step_time {

ExcessParts ExcessPartsOf(uint32_t rank, const WindowSignals& s, const OwnTimeSignals& t) {
  auto excess_of = [rank](const RankValues& v, const SignalEvidence& ev) {
    return Known(v[rank]) && ev.stat.present ? v[rank] - ev.stat.median_seconds : 0.0;
  };
  ExcessParts x;
  x.own = excess_of(t.own, t.own_evidence);
  x.dataloader = s.IsMissing(Phase::kDataloader)
                     ? 0.0
                     : excess_of(s.phase[PhaseIndex(Phase::kDataloader)],
                                 s.evidence[PhaseIndex(Phase::kDataloader)]);
  x.compute = s.ComputeConsistent() ? excess_of(t.compute, t.compute_evidence) : 0.0;
  x.outside = s.missing.empty() ? excess_of(t.outside, t.outside_evidence) : 0.0;
  x.gc = std::max(0.0, excess_of(s.gc, s.gc_evidence));
  return x;
}

bool GcExplains(const ExcessParts& x, double named) {
  if (!(x.gc > 0)) return false;
  std::array<double, 3> parts = {std::max(0.0, x.dataloader), std::max(0.0, x.compute),
                                 std::max(0.0, x.outside)};
  const double held = parts[0] + parts[1] + parts[2];
  double rest = std::max(0.0, std::max(x.own, Known(named) ? named : 0.0) - held);
  // A pause lengthens the part it fell in; the part that stands out most is where it most
  // plausibly fell, and taking it out elsewhere would leave that part's excess standing as a
  // second cause the pause itself made.
  std::sort(parts.begin(), parts.end(), std::greater<>());
  double left = x.gc;
  for (double& part : parts) {
    const double taken = std::min(left, part);
    part -= taken;
    left -= taken;
  }
  rest = std::max(0.0, rest - left);
  return x.gc >= std::max({parts[0], parts[1], parts[2], rest});
}

StragglerCause CauseOf(CulpritSignal signal, bool input_hit, bool compute_hit,
                       const ExcessParts& x) {
  switch (signal) {
    case CulpritSignal::kInput: return compute_hit ? StragglerCause::kBoth : StragglerCause::kInput;
    case CulpritSignal::kCompute:
      return input_hit ? StragglerCause::kBoth : StragglerCause::kCompute;
    case CulpritSignal::kOwn: break;
  }
  if (x.compute <= 0 && x.dataloader <= 0 && x.outside <= 0) return StragglerCause::kNone;
  return x.outside >= x.dataloader && x.outside >= x.compute ? StragglerCause::kOutside
         : x.dataloader >= x.compute                         ? StragglerCause::kInput
                                                             : StragglerCause::kCompute;
}

CulpritPhase CulpritPhaseOf(StragglerCause cause, CulpritSignal signal, uint32_t rank,
                            const ExcessParts& parts, const WindowSignals& s,
                            const OwnTimeSignals& t) {
  CulpritPhase out{Phase::kDataloader, parts.dataloader, s.Median(Phase::kDataloader)};
  if (cause != StragglerCause::kCompute && signal != CulpritSignal::kCompute) {
    if (cause == StragglerCause::kOutside || cause == StragglerCause::kGc ||
        cause == StragglerCause::kNone) {
      out.phase = Phase::kWait;
    }
    return out;
  }
  // A rank's local time in `p`: backward (forward_backward without backward) less the time it
  // spent blocked in it.
  const bool has_backward = s.evidence[PhaseIndex(Phase::kBackward)].stat.present;
  const RankValues& step = s.phase[PhaseIndex(Phase::kStep)];
  auto local = [&](Phase p, uint32_t r) {
    double v = s.phase[PhaseIndex(p)][r];
    const bool absorbs_wait =
        p == Phase::kBackward || (p == Phase::kForwardBackward && !has_backward);
    if (absorbs_wait && Known(v) && Known(t.own[r])) {
      v = std::max(0.0, v - (step[r] - t.own[r]));  // less blocked
    }
    return v;
  };
  double best = -INFINITY;
  std::vector<double> values;
  const uint32_t ranks = static_cast<uint32_t>(s.present.size());
  for (Phase p : {Phase::kForward, Phase::kBackward, Phase::kOptimizer, Phase::kForwardBackward}) {
    const double v = local(p, rank);
    if (!Known(v)) continue;
    values.clear();
    for (uint32_t r = 0; r < ranks; ++r) {
      if (const double x = local(p, r); Known(x)) values.push_back(x);
    }
    const double m = MedianInPlace(values);
    if (v - m > best) {
      best = v - m;
      out = {p, v - m, m};
    }
  }
  return out;
}

Attribution Attribute(const Culprit& c, const StragglerScores& scores, const WindowSignals& s,
                      const OwnTimeSignals& t) {
  Attribution a;
  a.parts = ExcessPartsOf(c.rank, s, t);
  const double named = c.rank < c.excess.size() ? c.excess[c.rank] : NAN;
  a.cause = GcExplains(a.parts, named)
                ? StragglerCause::kGc
                : CauseOf(c.signal, scores.input_hit, scores.compute_hit, a.parts);
  a.phase = CulpritPhaseOf(a.cause, c.signal, c.rank, a.parts, s, t);
  return a;
}

}  // namespace rankwatch::step_time
