#include "operators/kernel/gpu_time_breakdown.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>

#include "operators/kernel/interval_union.h"

namespace rankwatch::kernel {
namespace {

template <typename Pred>
std::vector<Interval> UnionOf(const RankTimeline& t, Pred pred) {
  std::vector<Interval> v;
  v.reserve(t.gpu.size());
  for (const GpuOp& op : t.gpu) {
    if (pred(op)) v.push_back({op.ts, op.end()});
  }
  return MergeIntervals(std::move(v));
}

}  // namespace

TemporalBreakdown ComputeTemporalBreakdown(const RankTimeline& t, AnalysisMode mode) {
  const bool hta = mode == AnalysisMode::kHtaCompat;
  const auto all = UnionOf(t, [&](const GpuOp& op) { return hta || !op.is_sync; });
  TemporalBreakdown b;
  if (all.empty()) return b;
  b.empty = false;
  b.kernel_ns = all.back().end - all.front().ts;
  b.idle_ns = b.kernel_ns - UnionLength(all);
  b.compute_ns =
      UnionLength(UnionOf(t, [](const GpuOp& op) { return op.type == KernelType::kComputation; }));
  b.non_compute_ns = b.kernel_ns - b.compute_ns - b.idle_ns;
  return b;
}

std::vector<std::pair<std::string, int64_t>> ComputeKernelTypeTime(const RankTimeline& t,
                                                                   bool include_memory) {
  constexpr std::array<KernelType, 3> kTypes = {KernelType::kComputation,
                                                KernelType::kCommunication, KernelType::kMemory};
  const int n = include_memory ? 3 : 2;
  struct Point {
    int64_t time;
    int delta;
  };
  std::vector<Point> points;
  for (int k = 0; k < n; ++k) {
    const KernelType type = kTypes[k];
    for (const Interval& i : UnionOf(t, [&](const GpuOp& op) { return op.type == type; })) {
      points.push_back({i.ts, 1 << k});
      points.push_back({i.end, -(1 << k)});
    }
  }
  // Ends before starts at equal times: zero-length segments only (sums are tie-invariant).
  std::sort(points.begin(), points.end(), [](const Point& a, const Point& b) {
    return a.time != b.time ? a.time < b.time : a.delta < b.delta;
  });
  std::array<int64_t, 8> by_mask{};
  std::array<bool, 8> seen{};
  std::vector<int> order;
  int running = 0;
  for (size_t i = 0; i + 1 < points.size(); ++i) {
    running += points[i].delta;
    if (running <= 0 || running >= 8) continue;
    by_mask[running] += points[i + 1].time - points[i].time;
    if (!seen[running]) {
      seen[running] = true;
      order.push_back(running);
    }
  }
  std::vector<std::pair<std::string, int64_t>> out;
  for (int mask : order) {
    std::string label;
    for (int k = 0; k < n; ++k) {
      if (!(mask & (1 << k))) continue;
      if (!label.empty()) label += " overlapping ";
      label += KernelTypeName(kTypes[k]);
    }
    out.emplace_back(std::move(label), by_mask[mask]);
  }
  return out;
}

double CommCompOverlap::ratio() const {
  if (comm_ns == 0) return std::numeric_limits<double>::quiet_NaN();
  return static_cast<double>(overlap_ns) / static_cast<double>(comm_ns);
}

CommCompOverlap ComputeCommCompOverlap(const RankTimeline& t) {
  const auto comm =
      UnionOf(t, [](const GpuOp& op) { return op.type == KernelType::kCommunication; });
  const auto comp = UnionOf(t, [](const GpuOp& op) { return op.type == KernelType::kComputation; });
  CommCompOverlap o;
  o.comm_ns = UnionLength(comm);
  o.overlap_ns = IntersectionLength(comm, comp);
  return o;
}

}  // namespace rankwatch::kernel
