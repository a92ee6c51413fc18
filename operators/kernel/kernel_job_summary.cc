#include "operators/kernel/kernel_job_summary.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>

#include "operators/kernel/describe.h"

namespace rankwatch::kernel {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

double Ratio(double part, double whole) { return whole > 0 ? part / whole : 0; }

double Median(std::vector<double> v) {
  if (v.empty()) return kNaN;
  std::sort(v.begin(), v.end());
  return LinearQuantile(v, 0.5);
}

// Adds the outliers of one signal (a share per rank) to `out`.
void FindOutliers(const std::vector<std::pair<uint32_t, double>>& shares, const std::string& signal,
                  const KernelOutlierOptions& o, std::vector<KernelOutlier>* out) {
  if (shares.size() < o.min_ranks || shares.size() < 2) return;
  std::vector<double> values;
  for (const auto& [rank, share] : shares) values.push_back(share);
  const double median = Median(values);
  std::vector<double> deviations;
  for (double v : values) deviations.push_back(std::fabs(v - median));
  const double mad = Median(deviations);
  for (const auto& [rank, share] : shares) {
    const double d = std::fabs(share - median);
    if (d < o.min_difference || d < o.mad_multiple * mad) continue;
    char note[200];
    std::snprintf(note, sizeof(note),
                  "rank %u: %s %.1f%% of GPU time vs median %.1f%% across %zu ranks", rank,
                  signal.c_str(), 100 * share, 100 * median, shares.size());
    out->push_back({rank, signal, share, median, note});
  }
}

}  // namespace

double KernelStepSummary::comm_comp_overlap_ratio() const {
  return comm_ns > 0 ? static_cast<double>(comm_overlap_ns) / static_cast<double>(comm_ns) : kNaN;
}

KernelStepSummary SummarizeStep(const RankKernelReport& r) {
  KernelStepSummary s;
  s.rank = r.rank;
  s.step = r.step;
  s.gpu_ops = r.gpu_ops;
  s.kernel_ns = r.temporal.kernel_ns;
  s.idle_ns = r.temporal.idle_ns;
  s.compute_ns = r.temporal.compute_ns;
  s.non_compute_ns = r.temporal.non_compute_ns;
  s.comm_ns = r.overlap.comm_ns;
  s.comm_overlap_ns = r.overlap.overlap_ns;
  for (const IdleRow& row : r.idle) s.idle_us[static_cast<int>(row.category)] += row.idle_us;
  s.kernel_type_ns = r.kernel_type_ns;
  const LaunchSummary& l = r.launch_summary;
  s.launches = l.launches;
  s.short_kernels = l.short_kernels;
  s.runtime_outliers = l.runtime_outliers;
  s.launch_delay_outliers = l.launch_delay_outliers;
  std::vector<double> delays;
  delays.reserve(r.launches.size());
  for (const LaunchRow& row : r.launches) delays.push_back(row.launch_delay_us);
  std::sort(delays.begin(), delays.end());
  s.delay_p50_us = delays.empty() ? kNaN : LinearQuantile(delays, 0.5);
  s.delay_p90_us = delays.empty() ? kNaN : LinearQuantile(delays, 0.9);
  s.delay_p99_us = delays.empty() ? kNaN : LinearQuantile(delays, 0.99);
  s.delay_max_us = delays.empty() ? kNaN : delays.back();
  return s;
}

const RankKernelSummary* KernelJobSnapshot::Rank(uint32_t rank) const {
  auto it = std::lower_bound(ranks.begin(), ranks.end(), rank,
                             [](const RankKernelSummary& r, uint32_t x) { return r.rank < x; });
  return it != ranks.end() && it->rank == rank ? &*it : nullptr;
}

void SummarizeJob(const KernelOutlierOptions& options, KernelJobSnapshot* s) {
  double kernel = 0, idle = 0, compute = 0, non_compute = 0, idle_cat[3] = {0, 0, 0};
  std::map<std::string, double> type_ns;
  std::vector<std::string> type_order;
  std::vector<double> overlaps, p50, p90, p99;
  double delay_max = -1;
  std::vector<std::pair<uint32_t, double>> idle_shares, comm_shares;
  for (RankKernelSummary& r : s->ranks) {
    KernelStepSummary& t = r.total;
    t = KernelStepSummary{};
    t.rank = r.rank;
    t.delay_p50_us = t.delay_p90_us = t.delay_p99_us = t.delay_max_us = kNaN;
    std::map<std::string, int64_t> rank_types;
    std::vector<std::string> rank_type_order;
    for (const KernelStepSummary& x : r.recent) {
      t.gpu_ops += x.gpu_ops;
      t.kernel_ns += x.kernel_ns;
      t.idle_ns += x.idle_ns;
      t.compute_ns += x.compute_ns;
      t.non_compute_ns += x.non_compute_ns;
      t.comm_ns += x.comm_ns;
      t.comm_overlap_ns += x.comm_overlap_ns;
      for (int c = 0; c < 3; ++c) t.idle_us[c] += x.idle_us[c];
      for (const auto& [label, ns] : x.kernel_type_ns) {
        if (!rank_types.contains(label)) rank_type_order.push_back(label);
        rank_types[label] += ns;
      }
      t.launches += x.launches;
      t.short_kernels += x.short_kernels;
      t.runtime_outliers += x.runtime_outliers;
      t.launch_delay_outliers += x.launch_delay_outliers;
      if (x.launches > 0) {
        auto max_of = [](double a, double b) { return std::isnan(a) ? b : std::max(a, b); };
        t.delay_p50_us = max_of(t.delay_p50_us, x.delay_p50_us);
        t.delay_p90_us = max_of(t.delay_p90_us, x.delay_p90_us);
        t.delay_p99_us = max_of(t.delay_p99_us, x.delay_p99_us);
        t.delay_max_us = max_of(t.delay_max_us, x.delay_max_us);
        p50.push_back(x.delay_p50_us);
        p90.push_back(x.delay_p90_us);
        p99.push_back(x.delay_p99_us);
        delay_max = std::max(delay_max, x.delay_max_us);
      }
    }
    for (const std::string& label : rank_type_order) {
      t.kernel_type_ns.emplace_back(label, rank_types[label]);
      if (!type_ns.contains(label)) type_order.push_back(label);
      type_ns[label] += static_cast<double>(rank_types[label]);
    }
    r.steps = static_cast<uint32_t>(r.recent.size());
    r.first_step = r.recent.empty() ? -1 : r.recent.front().step;
    r.last_step = r.recent.empty() ? -1 : r.recent.back().step;
    r.idle_share = Ratio(static_cast<double>(t.idle_ns), static_cast<double>(t.kernel_ns));
    r.comm_share = Ratio(static_cast<double>(t.comm_ns), static_cast<double>(t.kernel_ns));
    kernel += static_cast<double>(t.kernel_ns);
    idle += static_cast<double>(t.idle_ns);
    compute += static_cast<double>(t.compute_ns);
    non_compute += static_cast<double>(t.non_compute_ns);
    for (int c = 0; c < 3; ++c) idle_cat[c] += t.idle_us[c];
    if (t.comm_ns > 0) overlaps.push_back(t.comm_comp_overlap_ratio());
    if (t.kernel_ns > 0) {
      idle_shares.emplace_back(r.rank, r.idle_share);
      comm_shares.emplace_back(r.rank, r.comm_share);
    }
  }
  s->gpu_idle_ratio = Ratio(idle, kernel);
  s->gpu_compute_ratio = Ratio(compute, kernel);
  s->gpu_non_compute_ratio = Ratio(non_compute, kernel);
  const double idle_total = idle_cat[0] + idle_cat[1] + idle_cat[2];
  s->idle_host_wait_ratio = Ratio(idle_cat[0], idle_total);
  s->idle_kernel_wait_ratio = Ratio(idle_cat[1], idle_total);
  s->idle_other_ratio = Ratio(idle_cat[2], idle_total);
  double type_total = 0;
  for (const auto& [label, ns] : type_ns) type_total += ns;
  s->kernel_type_ratio.clear();
  for (const std::string& label : type_order) {
    s->kernel_type_ratio.emplace_back(label, Ratio(type_ns[label], type_total));
  }
  s->has_overlap = !overlaps.empty();
  if (s->has_overlap) {
    s->overlap_median = Median(overlaps);
    s->overlap_min = *std::min_element(overlaps.begin(), overlaps.end());
    s->overlap_max = *std::max_element(overlaps.begin(), overlaps.end());
  }
  s->has_launches = !p50.empty();
  if (s->has_launches) {
    s->delay_p50_s = Median(p50) * 1e-6;
    s->delay_p90_s = Median(p90) * 1e-6;
    s->delay_p99_s = Median(p99) * 1e-6;
    s->delay_max_s = delay_max * 1e-6;
  }
  s->outliers.clear();
  FindOutliers(idle_shares, "idle", options, &s->outliers);
  FindOutliers(comm_shares, "communication", options, &s->outliers);
  std::stable_sort(s->outliers.begin(), s->outliers.end(),
                   [](const KernelOutlier& a, const KernelOutlier& b) {
                     return std::fabs(a.share - a.median) > std::fabs(b.share - b.median);
                   });
}

}  // namespace rankwatch::kernel
