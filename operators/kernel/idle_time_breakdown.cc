#include "operators/kernel/idle_time_breakdown.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>

#include "absl/container/flat_hash_map.h"

namespace rankwatch::kernel {

std::string_view IdleCategoryName(IdleCategory c) {
  switch (c) {
    case IdleCategory::kHostWait: return "host_wait";
    case IdleCategory::kKernelWait: return "kernel_wait";
    case IdleCategory::kOther: return "other";
  }
  return "other";
}

std::vector<IdleRow> ComputeIdleTimeBreakdown(const RankTimeline& t, int64_t delay_ns) {
  constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
  std::vector<int64_t> order;
  absl::flat_hash_map<int64_t, std::vector<const GpuOp*>> by_stream;
  for (const GpuOp& op : t.gpu) {
    if (!op.idle_eligible) continue;
    auto [it, added] = by_stream.try_emplace(op.stream);
    if (added) order.push_back(op.stream);
    it->second.push_back(&op);
  }
  std::vector<IdleRow> out;
  for (int64_t stream : order) {
    std::vector<const GpuOp*>& ks = by_stream[stream];
    std::stable_sort(ks.begin(), ks.end(),
                     [](const GpuOp* a, const GpuOp* b) { return a->ts < b->ts; });
    std::array<std::vector<double>, 3> gaps;
    std::array<bool, 3> present{};
    present[static_cast<int>(IdleCategory::kOther)] = true;  // the first kernel
    gaps[static_cast<int>(IdleCategory::kOther)].push_back(kNaN);
    for (size_t j = 1; j < ks.size(); ++j) {
      const int64_t prev_end = ks[j - 1]->end();
      const int64_t gap = ks[j]->ts - prev_end;
      IdleCategory c = IdleCategory::kOther;
      if (ks[j]->runtime_ts != kNoTime && ks[j]->runtime_ts > prev_end) {
        c = IdleCategory::kHostWait;
      } else if (gap < delay_ns) {
        c = IdleCategory::kKernelWait;
      }
      present[static_cast<int>(c)] = true;
      gaps[static_cast<int>(c)].push_back(static_cast<double>(gap) / 1000.0);
    }
    std::array<double, 3> sums{};
    double total = 0;
    for (int c = 0; c < 3; ++c) {
      for (double g : gaps[c]) {
        if (!std::isnan(g)) sums[c] += g;
      }
      total += sums[c];
    }
    for (int c = 0; c < 3; ++c) {
      if (!present[c]) continue;
      IdleRow row;
      row.rank = t.rank;
      row.stream = stream;
      row.category = static_cast<IdleCategory>(c);
      row.idle_us = sums[c];
      row.ratio = total == 0 ? kNaN : sums[c] / total;
      row.gaps_us = DescribeSample(gaps[c]);
      out.push_back(row);
    }
  }
  return out;
}

}  // namespace rankwatch::kernel
