#include "operators/kernel/memory_bandwidth.h"

#include <algorithm>
#include <map>

namespace rankwatch::kernel {

std::vector<MemoryBandwidthRow> ComputeMemoryBandwidth(const RankTimeline& t) {
  struct Point {
    int64_t ts;
    double bw;
    int kind;
  };
  std::vector<std::string> kinds;
  std::map<std::string, int> kind_ids;
  std::vector<Point> starts, ends;
  for (const GpuOp& op : t.gpu) {
    if (op.type != KernelType::kMemory) continue;
    const std::string kind = MemorySubtype((*t.strings)[op.name]);
    auto [it, added] = kind_ids.try_emplace(kind, static_cast<int>(kinds.size()));
    if (added) kinds.push_back(kind);
    const int64_t dur = op.dur == 0 ? 1000 : op.dur;
    starts.push_back({op.ts, op.memory_bw_gbps, it->second});
    ends.push_back({op.ts + dur, -op.memory_bw_gbps, it->second});
  }
  std::vector<Point> points = std::move(starts);
  points.insert(points.end(), ends.begin(), ends.end());
  std::stable_sort(points.begin(), points.end(),
                   [](const Point& a, const Point& b) { return a.ts < b.ts; });
  std::vector<double> running(kinds.size(), 0.0);
  std::vector<std::vector<double>> samples(kinds.size());
  for (const Point& p : points) {
    running[p.kind] += p.bw;
    if (running[p.kind] > 0) samples[p.kind].push_back(running[p.kind]);
  }
  std::vector<MemoryBandwidthRow> out;
  for (const auto& [kind, id] : kind_ids) {
    MemoryBandwidthRow row;
    row.rank = t.rank;
    row.kind = kind;
    row.gbps = DescribeSample(std::move(samples[id]));
    out.push_back(std::move(row));
  }
  return out;
}

}  // namespace rankwatch::kernel
