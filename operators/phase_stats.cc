#include "operators/phase_stats.h"

#include <algorithm>
#include <cassert>

namespace rankwatch {

double MedianInPlace(std::vector<double>& v) {
  assert(!v.empty());
  const size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + mid, v.end());
  const double upper = v[mid];
  if (v.size() % 2 == 1) return upper;
  const double lower = *std::max_element(v.begin(), v.begin() + mid);
  return (lower + upper) / 2;
}

PhaseStats ComputePhaseStats(const StepWindow& window) {
  PhaseStats stats;
  std::vector<double> means;
  means.reserve(window.world_size());
  const auto& totals = window.totals();
  for (int p = 0; p < kPhaseCount; ++p) {
    means.clear();
    PhaseStat& st = stats[p];
    for (uint32_t r = 0; r < totals.size(); ++r) {
      const uint32_t n = totals[r].count[p];
      if (n == 0) continue;
      // Averaged over every step the rank reported (a sparse phase counts 0 where absent).
      const uint32_t steps = std::max(n, totals[r].count[static_cast<int>(Phase::kStep)]);
      const double mean = static_cast<double>(totals[r].sum_ns[p]) / steps * 1e-9;
      if (means.empty() || mean > st.worst_seconds) {
        st.worst_seconds = mean;
        st.worst_rank = r;
      }
      means.push_back(mean);
    }
    if (means.empty()) continue;
    st.present = true;
    st.ranks = static_cast<uint32_t>(means.size());
    st.median_seconds = MedianInPlace(means);
    if (st.ranks == 1) st.median_seconds = st.worst_seconds;
    st.skew = (st.ranks > 1 && st.median_seconds > 0)
                  ? (st.worst_seconds - st.median_seconds) / st.median_seconds
                  : 0.0;
  }
  return stats;
}

}  // namespace rankwatch
