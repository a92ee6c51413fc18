#include "operators/memory_diagnosis.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "operators/phase_stats.h"

namespace rankwatch {
namespace {

constexpr double kGiB = 1024.0 * 1024 * 1024;

struct Slice {
  double worst_head, worst_tail, median_head, median_tail;
  int seg;
  double worst_growth() const {
    return worst_head > 0 ? (worst_tail - worst_head) / worst_head : 0;
  }
  double median_growth() const {
    return median_head > 0 ? (median_tail - median_head) / median_head : 0;
  }
};

Slice SliceOf(const std::vector<double>& worst, const std::vector<double>& median, double f) {
  const int n = static_cast<int>(worst.size());
  const int seg = std::min(std::max(4, static_cast<int>(std::lround(n * f))), n / 2);
  auto mean = [](const std::vector<double>& v, int from, int count) {
    double s = 0;
    for (int i = from; i < from + count; ++i) s += v[i];
    return s / count;
  };
  return {mean(worst, 0, seg), mean(worst, n - seg, seg), mean(median, 0, seg),
          mean(median, n - seg, seg), seg};
}

// A series grows steadily (still at the end) and significantly (above its own noise).
bool Steady(const TrendFit& f, const MemoryDiagnosisOptions& o) {
  return f.present && f.slope > 0 && f.recent_slope >= o.trend_steady_ratio * f.slope &&
         f.recent_growth_bytes() >= o.trend_recent_noise * f.sigma &&
         f.growth_bytes() >= o.trend_noise * f.sigma;
}

// Judges the trend on `points` (a horizon covering `steps` memory steps).
MemoryTrendEvidence JudgeHorizon(const std::vector<MemoryTrend::Point>& points, uint64_t steps,
                                 const MemoryDiagnosisOptions& o, std::vector<double>* scratch) {
  MemoryTrendEvidence e;
  e.steps = steps;
  if (points.size() < std::max<uint32_t>(o.trend_min_points, 3)) return e;
  e.worst =
      FitTrend(points, TrendSeries::kWorst, o.trend_recent_fraction, o.trend_max_pairs, scratch);
  e.present = e.worst.present && e.worst.span_steps >= o.trend_min_steps;
  if (!e.present) return e;
  e.worst_growth = e.worst.level > 0 ? e.worst.growth_bytes() / e.worst.level : 0;
  // The median rank's series only when the worst rank's grows (half the cost otherwise).
  if (!Steady(e.worst, o) || e.worst.growth_bytes() < o.trend_min_growth_bytes) return e;
  e.median =
      FitTrend(points, TrendSeries::kMedian, o.trend_recent_fraction, o.trend_max_pairs, scratch);
  e.median_growth = e.median.level > 0 ? e.median.growth_bytes() / e.median.level : 0;
  e.steady = Steady(e.median, o);
  if (!e.steady) return e;
  if (e.worst_growth >= o.trend_confirmed_growth &&
      e.median_growth >= o.trend_median_ratio * o.trend_confirmed_growth) {
    e.label = MemoryLabel::kCreep;
  } else if (e.worst_growth >= o.trend_early_growth &&
             e.median_growth >= o.trend_median_ratio * o.trend_early_growth) {
    e.label = MemoryLabel::kCreepEarly;
  }
  return e;
}

// The job's whole life; when that finds no creep, the later half of it (a leak that began late
// in a long job: the whole life's slope is the median of pairwise slopes mostly between the
// flat points before it).
MemoryTrendEvidence AssessTrend(const MemoryTrend& t, MemoryKind kind,
                                const MemoryDiagnosisOptions& o) {
  std::vector<MemoryTrend::Point> points;
  t.Points(kind, &points);
  std::vector<double> scratch;
  MemoryTrendEvidence whole = JudgeHorizon(points, t.steps(kind), o, &scratch);
  if (whole.label != MemoryLabel::kBalanced || !o.trend_last_half) return whole;
  // Drop the older half of the points (all full points: stride steps each).
  const size_t drop = points.size() / 2;
  points.erase(points.begin(), points.begin() + static_cast<std::ptrdiff_t>(drop));
  MemoryTrendEvidence half =
      JudgeHorizon(points, t.steps(kind) - drop * t.stride(kind), o, &scratch);
  if (half.label == MemoryLabel::kBalanced) return whole;
  half.last_half = true;
  return half;
}

MemoryKindEvidence Assess(const MemoryWindow& w, const MemoryTrend* trend,
                          const std::vector<double>& rank_peak, MemoryKind kind, uint64_t capacity,
                          const MemoryDiagnosisOptions& o) {
  const int k = static_cast<int>(kind);
  MemoryKindEvidence e;
  if (trend != nullptr && o.trend) e.trend = AssessTrend(*trend, kind, o);
  std::vector<double> worst, median;
  for (const MemoryWindow::Step& s : w.steps()) {
    if (s.worst[k] <= 0) continue;
    worst.push_back(s.worst[k]);
    median.push_back(s.median[k]);
  }
  if (worst.size() < o.min_steps) return e;
  e.present = true;
  std::vector<double> peaks;
  for (uint32_t r = 0; r < rank_peak.size(); ++r) {
    if (rank_peak[r] <= 0) continue;
    if (peaks.empty() || rank_peak[r] > e.worst_peak_bytes) {
      e.worst_peak_bytes = rank_peak[r];
      e.worst_rank = r;
    }
    peaks.push_back(rank_peak[r]);
  }
  e.median_peak_bytes = peaks.size() == 1 ? e.worst_peak_bytes : MedianInPlace(peaks);
  e.skew = (peaks.size() > 1 && e.median_peak_bytes > 0)
               ? (e.worst_peak_bytes - e.median_peak_bytes) / e.median_peak_bytes
               : 0;
  e.pressure = capacity > 0 ? e.worst_peak_bytes / static_cast<double>(capacity) : 0;

  for (double f : {0.10, 0.20, 0.30}) {
    const Slice s = SliceOf(worst, median, f);
    if (s.worst_growth() >= o.early_worst && s.median_growth() >= o.early_median) ++e.early_votes;
    if (s.worst_growth() >= o.confirmed_worst && s.median_growth() >= o.confirmed_median) {
      ++e.confirmed_votes;
    }
  }
  const Slice overall = SliceOf(worst, median, 0.20);
  e.worst_growth = overall.worst_growth();
  e.median_growth = overall.median_growth();
  e.delta_bytes = overall.worst_tail - overall.worst_head;
  const double cap = static_cast<double>(capacity);
  const bool confirmed = e.confirmed_votes == 3 && e.worst_growth >= o.confirmed_overall_worst &&
                         e.median_growth >= o.confirmed_overall_median &&
                         e.delta_bytes >= std::max({o.confirmed_delta_bytes,
                                                    o.confirmed_delta_head * overall.worst_head,
                                                    o.confirmed_delta_capacity * cap});
  const bool early =
      e.early_votes >= 2 && e.worst_growth >= o.early_overall_worst &&
      e.median_growth >= o.early_overall_median &&
      e.delta_bytes >= std::max({o.early_delta_bytes, o.early_delta_head * overall.worst_head,
                                 o.early_delta_capacity * cap});
  // Rate: the growth between the centres of the head and tail segments.
  const int n = static_cast<int>(worst.size());
  if (n > overall.seg) e.creep_bytes_per_step = e.delta_bytes / (n - overall.seg);

  if (e.pressure >= o.pressure_warn) {
    e.label = MemoryLabel::kHighPressure;
    e.severity = e.pressure >= o.pressure_crit ? Severity::kCrit : Severity::kWarn;
  } else if (e.skew >= o.imbalance_warn &&
             (capacity == 0 || e.pressure >= o.imbalance_min_pressure)) {
    e.label = MemoryLabel::kImbalance;
    e.severity = e.skew >= o.imbalance_crit ? Severity::kCrit : Severity::kWarn;
  } else if (confirmed) {
    e.label = MemoryLabel::kCreep;
    e.severity = Severity::kCrit;
  } else if (e.trend.label == MemoryLabel::kCreep) {
    e.label = MemoryLabel::kCreep;
    e.severity = Severity::kCrit;
    e.lifetime_trend = true;
  } else if (early) {
    e.label = MemoryLabel::kCreepEarly;
    e.severity = Severity::kWarn;
  } else if (e.trend.label == MemoryLabel::kCreepEarly) {
    e.label = MemoryLabel::kCreepEarly;
    e.severity = Severity::kWarn;
    e.lifetime_trend = true;
  } else {
    e.label = MemoryLabel::kBalanced;
  }
  // A creep found by the trend grows at the trend's rate.
  if (e.lifetime_trend) e.creep_bytes_per_step = e.trend.bytes_per_step();
  if (capacity > 0 && e.creep_bytes_per_step > 0) {
    const double room = std::max(0.0, cap - worst.back());
    e.projected_steps_to_full = static_cast<uint64_t>(std::ceil(room / e.creep_bytes_per_step));
  }
  return e;
}

// 30000 -> "30,000".
std::string Grouped(uint64_t v) {
  std::string digits = std::to_string(v), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

// Bytes per step in MiB, with decimals while the rate is small.
std::string MiBPerStep(double bytes) {
  const double mib = bytes / (1024 * 1024);
  return mib < 10 ? fmt::format("{:.2f}", mib) : fmt::format("{:.0f}", mib);
}

std::string_view NextStep(MemoryLabel label) {
  switch (label) {
    case MemoryLabel::kNoData: return "wait for more aligned steps with memory peaks";
    case MemoryLabel::kHighPressure: return "reduce memory load";
    case MemoryLabel::kImbalance: return "inspect per-rank memory workload";
    case MemoryLabel::kCreep: return "inspect retained tensors and growing caches";
    case MemoryLabel::kCreepEarly: return "inspect retained state and watch the next window";
    case MemoryLabel::kBalanced: return "nothing to do";
  }
  return "";
}

}  // namespace

std::string_view MemoryLabelName(MemoryLabel label) {
  switch (label) {
    case MemoryLabel::kNoData: return "no_data";
    case MemoryLabel::kHighPressure: return "high_pressure";
    case MemoryLabel::kImbalance: return "imbalance";
    case MemoryLabel::kCreep: return "memory_creep";
    case MemoryLabel::kCreepEarly: return "memory_creep_early";
    case MemoryLabel::kBalanced: return "balanced";
  }
  return "unknown";
}

std::string_view MemoryKindName(MemoryKind kind) {
  return kind == MemoryKind::kAllocated ? "allocated" : "reserved";
}

MemoryDiagnosis DiagnoseMemory(const MemoryWindow& w, const MemoryTrend* trend,
                               const MemoryDiagnosisOptions& o) {
  MemoryDiagnosis d;
  d.window_steps = static_cast<uint32_t>(w.steps().size());
  if (!w.steps().empty()) {
    d.first_step = w.steps().front().step;
    d.last_step = w.steps().back().step;
  }
  d.capacity_bytes = w.capacity();
  for (int k = 0; k < kMemoryKindCount; ++k) {
    const auto kind = static_cast<MemoryKind>(k);
    d.kinds[k] = Assess(w, trend, w.rank_peaks(kind), kind, d.capacity_bytes, o);
  }
  // The worse of the two kinds: earlier in the first-match order, then the higher severity.
  auto worse = [](const MemoryKindEvidence& a, const MemoryKindEvidence& b) {
    if (a.label != b.label) {
      // no_data ranks last: any diagnosis from the other kind is more informative.
      if (a.label == MemoryLabel::kNoData) return false;
      if (b.label == MemoryLabel::kNoData) return true;
      return a.label < b.label;
    }
    return a.severity > b.severity;
  };
  const bool reserved_worse = worse(d.kinds[1], d.kinds[0]);
  d.kind = reserved_worse ? MemoryKind::kReserved : MemoryKind::kAllocated;
  const MemoryKindEvidence& e = d.kinds[static_cast<int>(d.kind)];
  d.label = e.label;
  d.severity = e.severity;
  d.lifetime_trend = e.lifetime_trend;
  d.next_step = std::string(NextStep(d.label));
  const std::string_view kind = MemoryKindName(d.kind);
  switch (d.label) {
    case MemoryLabel::kNoData:
      d.note = fmt::format("{} aligned steps with memory peaks; the diagnosis needs {}",
                           d.window_steps, o.min_steps);
      break;
    case MemoryLabel::kHighPressure:
      d.note = fmt::format("rank {} peaks at {:.1f} GiB {}, {:.0f}% of its {:.0f} GiB device",
                           e.worst_rank, e.worst_peak_bytes / kGiB, kind, e.pressure * 100,
                           d.capacity_bytes / kGiB);
      break;
    case MemoryLabel::kImbalance:
      d.note = fmt::format("rank {} peaks at {:.1f} GiB {}, {:.0f}% above the median rank",
                           e.worst_rank, e.worst_peak_bytes / kGiB, kind, e.skew * 100);
      break;
    case MemoryLabel::kCreep:
    case MemoryLabel::kCreepEarly:
      if (e.lifetime_trend) {
        d.note = fmt::format(
            "{} memory grows {} MiB a step {} the job's {}{} steps (steady, +{:.0f}%){}", kind,
            MiBPerStep(e.creep_bytes_per_step), e.trend.last_half ? "now, steadily over" : "over",
            e.trend.last_half ? "last " : "", Grouped(e.trend.steps), e.trend.worst_growth * 100,
            e.projected_steps_to_full
                ? fmt::format("; full in ~{} steps", Grouped(*e.projected_steps_to_full))
                : std::string());
      } else {
        d.note = fmt::format(
            "{} memory grows {} MiB per step ({:.0f}% over the window){}", kind,
            MiBPerStep(e.creep_bytes_per_step), e.worst_growth * 100,
            e.projected_steps_to_full
                ? fmt::format("; the device is full in about {} steps", *e.projected_steps_to_full)
                : std::string());
      }
      break;
    case MemoryLabel::kBalanced:
      d.note = fmt::format("peaks steady and even across ranks ({:.1f} GiB median {})",
                           e.median_peak_bytes / kGiB, kind);
      break;
  }
  return d;
}

}  // namespace rankwatch
