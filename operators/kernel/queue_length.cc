#include "operators/kernel/queue_length.h"

#include <algorithm>
#include <map>

#include "absl/container/flat_hash_map.h"

namespace rankwatch::kernel {

std::vector<QueueLengthRow> ComputeQueueLength(const RankTimeline& t, int64_t max_queue_length) {
  absl::flat_hash_map<int64_t, std::vector<const GpuOp*>> gpu_by_corr;
  for (const GpuOp& op : t.gpu) gpu_by_corr[op.correlation].push_back(&op);
  struct Point {
    int64_t ts;
    int delta;
  };
  std::map<int64_t, std::vector<Point>> by_stream;
  absl::flat_hash_map<int64_t, bool> launched;  // correlations of counted launch calls
  for (const CpuCall& c : t.calls) {
    if (!c.queue_launch || c.index_correlation <= 0) continue;
    launched[c.correlation] = true;
    auto it = gpu_by_corr.find(c.correlation);
    if (it == gpu_by_corr.end()) continue;
    for (const GpuOp* op : it->second) by_stream[op->stream].push_back({c.ts, +1});
  }
  for (const GpuOp& op : t.gpu) {
    if (launched.contains(op.correlation)) by_stream[op.stream].push_back({op.ts, -1});
  }
  std::vector<QueueLengthRow> out;
  const double span = static_cast<double>(t.max_ts - t.min_ts);
  for (auto& [stream, points] : by_stream) {
    std::stable_sort(points.begin(), points.end(), [](const Point& a, const Point& b) {
      return a.ts != b.ts ? a.ts < b.ts : a.delta > b.delta;
    });
    std::vector<double> values;
    values.reserve(points.size());
    int64_t running = 0;
    int64_t blocked = 0;
    for (size_t i = 0; i < points.size(); ++i) {
      running += points[i].delta;
      values.push_back(static_cast<double>(running));
      if (running >= max_queue_length && i + 1 < points.size())
        blocked += points[i + 1].ts - points[i].ts;
    }
    QueueLengthRow row;
    row.rank = t.rank;
    row.stream = stream;
    row.queue_length = DescribeSample(std::move(values));
    row.blocked_us = static_cast<double>(blocked) / 1000.0;
    row.blocked_ratio = span > 0 ? static_cast<double>(blocked) / span : 0.0;
    out.push_back(row);
  }
  return out;
}

}  // namespace rankwatch::kernel
