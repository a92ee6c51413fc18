#include "operators/kernel/straggler_heuristic.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <tuple>

#include "operators/kernel/describe.h"

namespace rankwatch::kernel {

std::vector<uint32_t> FindPotentialStragglers(const std::vector<RankTimeline>& ranks,
                                              const std::vector<int64_t>& steps,
                                              const StragglerOptions& o) {
  if (ranks.size() < 2 || steps.empty()) return {};
  const std::set<int64_t> selected(steps.begin(), steps.end());
  int64_t lo = std::numeric_limits<int64_t>::max(), hi = std::numeric_limits<int64_t>::min();
  for (const RankTimeline& t : ranks) {
    for (const GpuOp& op : t.gpu) {
      if (!selected.contains(op.iteration)) continue;
      lo = std::min(lo, op.ts);
      hi = std::max(hi, op.end());
    }
    for (const CpuCall& c : t.calls) {
      if (!selected.contains(c.iteration)) continue;
      lo = std::min(lo, c.ts);
      hi = std::max(hi, c.ts + c.dur);
    }
  }
  if (lo >= hi) return {};
  const double mean_iter = static_cast<double>(hi - lo) / static_cast<double>(selected.size());
  // The last qualifying collective per (stream, name, iteration, rank).
  using Key = std::tuple<int64_t, std::string, int64_t>;  // stream, name, iteration
  std::map<Key, std::map<uint32_t, const GpuOp*>> last;
  for (const RankTimeline& t : ranks) {
    for (const GpuOp& op : t.gpu) {
      const std::string& name = (*t.strings)[op.name];
      if (op.stream <= 0 || op.iteration <= 0 || !selected.contains(op.iteration)) continue;
      if (!IsStragglerCommKernel(name, o.hta_compat)) continue;
      if (static_cast<double>(op.dur) < 0.01 * mean_iter) continue;
      const GpuOp*& slot = last[{op.stream, name, op.iteration}][t.rank];
      if (slot == nullptr || op.ts >= slot->ts) slot = &op;
    }
  }
  // Pick the (stream, name) whose duration varies most across ranks, averaged over iterations.
  std::map<std::pair<int64_t, std::string>, std::vector<double>> spread;
  for (const auto& [key, per_rank] : last) {
    std::vector<double> d;
    for (const auto& [rank, op] : per_rank) d.push_back(static_cast<double>(op->dur) / mean_iter);
    const double sd = SampleStd(d);
    if (!std::isnan(sd)) spread[{std::get<0>(key), std::get<1>(key)}].push_back(sd);
  }
  if (spread.empty()) return {};
  auto best = spread.begin();
  double best_value = -1;
  for (auto it = spread.begin(); it != spread.end(); ++it) {
    double s = 0;
    for (double v : it->second) s += v;
    s /= static_cast<double>(it->second.size());
    if (s > best_value) best_value = s, best = it;
  }
  std::map<uint32_t, int> flags;
  for (const auto& [key, per_rank] : last) {
    if (std::get<0>(key) != best->first.first || std::get<1>(key) != best->first.second) continue;
    std::vector<double> metric;
    for (const auto& [rank, op] : per_rank)
      metric.push_back(static_cast<double>(op->ts - lo) / mean_iter);
    std::vector<double> sorted = metric;
    std::sort(sorted.rbegin(), sorted.rend());
    const double kth = sorted[std::min(o.num_candidates, sorted.size()) - 1];
    size_t i = 0;
    for (const auto& [rank, op] : per_rank) {
      flags[rank] += metric[i++] >= kth ? 1 : 0;
    }
  }
  std::vector<std::pair<int, uint32_t>> ranked;
  for (const auto& [rank, n] : flags) {
    if (n > 0) ranked.push_back({-n, rank});
  }
  std::sort(ranked.begin(), ranked.end());
  std::vector<uint32_t> out;
  for (size_t i = 0; i < ranked.size() && i < o.num_candidates; ++i)
    out.push_back(ranked[i].second);
  return out;
}

}  // namespace rankwatch::kernel
