#include "operators/kernel/kernel_duration_stats.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <map>

#include "operators/kernel/describe.h"

namespace rankwatch::kernel {
namespace {

struct Group {
  std::string name;
  std::vector<double> values;
};

KernelStatRow Stats(const Group& g, KernelType type, uint32_t rank) {
  KernelStatRow r;
  r.name = g.name;
  r.type = type;
  r.rank = rank;
  double sum = 0;
  for (double v : g.values) sum += v;
  r.sum_us = sum;
  r.max_us = *std::max_element(g.values.begin(), g.values.end());
  r.min_us = *std::min_element(g.values.begin(), g.values.end());
  r.mean_us = sum / static_cast<double>(g.values.size());
  const double sd = SampleStd(g.values);
  r.std_us = std::isnan(sd) ? 0.0 : sd;
  return r;
}

}  // namespace

std::vector<KernelStatRow> ComputeKernelStats(const RankTimeline& t, const KernelStatsOptions& o) {
  constexpr std::array<KernelType, 3> kTypes = {KernelType::kComputation,
                                                KernelType::kCommunication, KernelType::kMemory};
  std::vector<KernelStatRow> out;
  for (int k = 0; k < (o.include_memory ? 3 : 2); ++k) {
    const KernelType type = kTypes[k];
    std::map<uint32_t, std::vector<double>> by_id;
    for (const GpuOp& op : t.gpu) {
      if (op.type == type) by_id[op.name].push_back(static_cast<double>(op.dur) / 1000.0);
    }
    // groupby(name): sorted by name, then by sum descending.
    std::vector<Group> groups;
    for (auto& [id, values] : by_id) groups.push_back({(*t.strings)[id], std::move(values)});
    std::sort(groups.begin(), groups.end(),
              [](const Group& a, const Group& b) { return a.name < b.name; });
    std::vector<KernelStatRow> rows;
    for (const Group& g : groups) rows.push_back(Stats(g, type, t.rank));
    std::stable_sort(rows.begin(), rows.end(), [](const KernelStatRow& a, const KernelStatRow& b) {
      return a.sum_us > b.sum_us;
    });
    if (rows.size() > o.num_kernels) {
      std::vector<double> cumsum;
      double c = 0;
      for (const KernelStatRow& r : rows) cumsum.push_back(c += r.sum_us);
      std::vector<double> sorted = cumsum;
      std::sort(sorted.begin(), sorted.end());
      const double q = LinearQuantile(sorted, o.duration_ratio);
      std::map<std::string, std::vector<double>> folded;
      for (size_t i = 0; i < rows.size(); ++i) {
        const bool other = cumsum[i] > q || i >= o.num_kernels;
        folded[other ? "others" : rows[i].name].push_back(rows[i].sum_us);
      }
      rows.clear();
      for (auto& [name, sums] : folded)
        rows.push_back(Stats(Group{name, std::move(sums)}, type, t.rank));
    } else {
      std::sort(rows.begin(), rows.end(),
                [](const KernelStatRow& a, const KernelStatRow& b) { return a.name < b.name; });
    }
    out.insert(out.end(), rows.begin(), rows.end());
  }
  return out;
}

}  // namespace rankwatch::kernel
