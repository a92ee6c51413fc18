#include "operators/step_time/signals.h"

#include <algorithm>

#include "operators/phase_stats.h"

namespace rankwatch::step_time {

SignalEvidence EvidenceOf(const RankValues& v) {
  SignalEvidence e;
  std::vector<double> present;
  present.reserve(v.size());
  for (uint32_t r = 0; r < v.size(); ++r) {
    if (!Known(v[r])) continue;
    if (present.empty() || v[r] > e.stat.worst_seconds) {
      e.stat.worst_seconds = v[r];
      e.stat.worst_rank = r;
    }
    present.push_back(v[r]);
  }
  if (present.empty()) return e;
  e.stat.present = true;
  e.stat.ranks = static_cast<uint32_t>(present.size());
  e.stat.median_seconds = e.stat.ranks == 1 ? e.stat.worst_seconds : MedianInPlace(present);
  e.stat.skew = (e.stat.ranks > 1 && e.stat.median_seconds > 0)
                    ? (e.stat.worst_seconds - e.stat.median_seconds) / e.stat.median_seconds
                    : 0.0;
  for (uint32_t r = 0; r < v.size(); ++r) {
    if (!Known(v[r]) || v[r] <= e.stat.median_seconds) continue;
    RankExcess x{r, v[r] - e.stat.median_seconds};
    auto less = [](const RankExcess& a, const RankExcess& b) {
      return a.excess_seconds > b.excess_seconds;
    };
    e.top.insert(std::upper_bound(e.top.begin(), e.top.end(), x, less), x);
    if (e.top.size() > 3) e.top.pop_back();
  }
  return e;
}

bool WindowSignals::IsMissing(Phase p) const {
  return std::any_of(missing.begin(), missing.end(),
                     [p](const MissingSignal& m) { return m.phase == p; });
}

bool WindowSignals::ComputeConsistent() const {
  for (const MissingSignal& m : missing) {
    if (m.phase != Phase::kDataloader && m.phase != Phase::kStep && m.reporting > 0) return false;
  }
  return true;
}

WindowSignals MeasureWindow(const StepWindow& w) {
  const uint32_t n = w.world_size();
  WindowSignals s;
  for (auto& v : s.phase) v.assign(n, NAN);
  s.present.assign(n, 0);
  s.gc.assign(n, NAN);
  s.gc_collections.assign(n, NAN);
  for (uint32_t r = 0; r < n; ++r) {
    const StepWindow::RankTotals& t = w.totals()[r];
    s.gc[r] = WindowGcMean(t);
    s.gc_collections[r] = WindowGcCollections(t);
    for (int p = 0; p < kPhaseCount; ++p) {
      const double m = WindowMean(t, static_cast<Phase>(p));
      if (!Known(m)) continue;
      s.phase[p][r] = m;
      s.present[r] |= 1u << p;
    }
  }
  for (int p = 0; p < kPhaseCount; ++p) s.evidence[p] = EvidenceOf(s.phase[p]);
  s.gc_evidence = EvidenceOf(s.gc);
  s.gc_median_collections = EvidenceOf(s.gc_collections).stat.median_seconds;
  s.missing = MissingSignals(w);
  return s;
}

std::vector<MissingSignal> MissingSignals(const StepWindow& w) {
  std::vector<uint32_t> ranks;
  for (uint32_t r = 0; r < w.world_size(); ++r) {
    if (w.totals()[r].count[PhaseIndex(Phase::kStep)] > 0) ranks.push_back(r);
  }
  std::vector<MissingSignal> out;
  if (ranks.size() < w.world_size()) {  // ranks silent for the whole window
    MissingSignal m;
    m.phase = Phase::kStep;
    m.ranks = w.world_size();
    m.reporting = static_cast<uint32_t>(ranks.size());
    for (uint32_t r = 0, i = 0; r < w.world_size() && m.missing_ranks.size() < 16; ++r) {
      if (i < ranks.size() && ranks[i] == r) {
        ++i;
      } else {
        m.missing_ranks.push_back(r);
      }
    }
    out.push_back(std::move(m));
  }
  for (Phase p : {Phase::kDataloader, Phase::kForward, Phase::kBackward, Phase::kOptimizer}) {
    MissingSignal m;
    m.phase = p;
    m.ranks = static_cast<uint32_t>(ranks.size());
    for (uint32_t r : ranks) {
      const auto& c = w.totals()[r].count;
      const bool has = c[PhaseIndex(p)] > 0 || ((p == Phase::kForward || p == Phase::kBackward) &&
                                                c[PhaseIndex(Phase::kForwardBackward)] > 0);
      if (has) {
        ++m.reporting;
      } else if (m.missing_ranks.size() < 16) {
        m.missing_ranks.push_back(r);
      }
    }
    if (m.reporting < m.ranks) out.push_back(std::move(m));
  }
  return out;
}

}  // namespace rankwatch::step_time
