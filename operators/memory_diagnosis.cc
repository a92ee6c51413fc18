#include "operators/memory_diagnosis.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "operators/phase_stats.h"

namespace rankwatch {
namespace {

constexpr double kGiB = 1024.0 * 1024 * 1024;
constexpr double kMiB = 1024.0 * 1024;

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

// The spec's window policy on a worst series and a median series (for one rank: its own series
// as both, so the median condition is the worst one's, which is stricter).
struct WindowVerdict {
  int early_votes = 0, confirmed_votes = 0;
  double worst_growth = 0, median_growth = 0;
  double delta_bytes = 0;     // worst tail - worst head, overall slice
  double bytes_per_step = 0;  // the growth between the centres of the head and tail segments
  bool early = false, confirmed = false;
};

WindowVerdict JudgeWindow(const std::vector<double>& worst, const std::vector<double>& median,
                          double cap, const MemoryDiagnosisOptions& o) {
  WindowVerdict v;
  for (double f : {0.10, 0.20, 0.30}) {
    const Slice s = SliceOf(worst, median, f);
    if (s.worst_growth() >= o.early_worst && s.median_growth() >= o.early_median) ++v.early_votes;
    if (s.worst_growth() >= o.confirmed_worst && s.median_growth() >= o.confirmed_median) {
      ++v.confirmed_votes;
    }
  }
  const Slice overall = SliceOf(worst, median, 0.20);
  v.worst_growth = overall.worst_growth();
  v.median_growth = overall.median_growth();
  v.delta_bytes = overall.worst_tail - overall.worst_head;
  v.confirmed = v.confirmed_votes == 3 && v.worst_growth >= o.confirmed_overall_worst &&
                v.median_growth >= o.confirmed_overall_median &&
                v.delta_bytes >=
                    std::max({o.confirmed_delta_bytes, o.confirmed_delta_head * overall.worst_head,
                              o.confirmed_delta_capacity * cap});
  v.early = v.early_votes >= 2 && v.worst_growth >= o.early_overall_worst &&
            v.median_growth >= o.early_overall_median &&
            v.delta_bytes >= std::max({o.early_delta_bytes, o.early_delta_head * overall.worst_head,
                                       o.early_delta_capacity * cap});
  const int n = static_cast<int>(worst.size());
  if (n > overall.seg) v.bytes_per_step = v.delta_bytes / (n - overall.seg);
  return v;
}

// A series grows steadily (still at the end) and significantly (above its own noise).
bool Steady(const TrendFit& f, const MemoryDiagnosisOptions& o) {
  return f.present && f.slope > 0 && f.recent_slope >= o.trend_steady_ratio * f.slope &&
         f.recent_growth_bytes() >= o.trend_recent_noise * f.sigma &&
         f.growth_bytes() >= o.trend_noise * f.sigma;
}

// Grew above its noise and the growth floor, steadily or not (what a note must not call steady).
bool Significant(const TrendFit& f, const MemoryDiagnosisOptions& o) {
  return f.present &&
         f.growth_bytes() >= std::max(o.trend_noise * f.sigma, o.trend_min_growth_bytes);
}

// The creep a steady, significant trend's growth shares amount to (a rank: no median condition,
// median_growth = HUGE_VAL).
MemoryLabel TrendLabel(double worst_growth, double median_growth, const MemoryDiagnosisOptions& o) {
  if (worst_growth >= o.trend_confirmed_growth &&
      median_growth >= o.trend_median_ratio * o.trend_confirmed_growth) {
    return MemoryLabel::kCreep;
  }
  if (worst_growth >= o.trend_early_growth &&
      median_growth >= o.trend_median_ratio * o.trend_early_growth) {
    return MemoryLabel::kCreepEarly;
  }
  return MemoryLabel::kBalanced;
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
  if (e.steady) e.label = TrendLabel(e.worst_growth, e.median_growth, o);
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

// One rank's series (x, y), n points covering `steps` memory steps, judged as the job's
// worst-rank series without the median condition.
RankTrendEvidence JudgeRankHorizon(const double* x, const double* y, size_t n, uint64_t steps,
                                   const MemoryDiagnosisOptions& o, std::vector<double>* scratch) {
  RankTrendEvidence e;
  e.steps = steps;
  if (n < std::max<uint32_t>(o.trend_min_points, 3)) return e;
  e.fit = FitTrend(x, y, n, o.trend_recent_fraction, o.trend_max_pairs, scratch);
  e.present = e.fit.present && e.fit.span_steps >= o.trend_min_steps;
  if (!e.present) return e;
  e.growth = e.fit.level > 0 ? e.fit.growth_bytes() / e.fit.level : 0;
  e.steady = Steady(e.fit, o);
  if (e.steady && e.fit.growth_bytes() >= o.trend_min_growth_bytes) {
    e.label = TrendLabel(e.growth, HUGE_VAL, o);
  }
  return e;
}

// Reused buffers of one evaluation.
struct Scratch {
  std::vector<double> x, y, fit;
};

// Followed series `i` of `kind`: its whole series, then (no creep there) its later half.
RankTrendEvidence AssessRankTrend(const MemoryTrend& t, MemoryKind kind, size_t i,
                                  const MemoryDiagnosisOptions& o, Scratch* s) {
  t.RankPoints(kind, i, &s->x, &s->y);
  const size_t n = s->x.size();
  const uint64_t steps = t.rank_series_steps(kind, i);
  RankTrendEvidence whole = JudgeRankHorizon(s->x.data(), s->y.data(), n, steps, o, &s->fit);
  whole.rank = t.rank_of_series(kind, i);
  if (whole.label != MemoryLabel::kBalanced || !o.trend_last_half) return whole;
  const size_t drop = n / 2;
  RankTrendEvidence half = JudgeRankHorizon(
      s->x.data() + drop, s->y.data() + drop, n - drop,
      steps - std::min<uint64_t>(steps, drop * t.rank_series_stride(kind, i)), o, &s->fit);
  if (half.label == MemoryLabel::kBalanced) return whole;
  half.rank = whole.rank;
  half.last_half = true;
  return half;
}

// Creep labels first, then the fastest.
bool RankTrendBefore(const RankTrendEvidence& a, const RankTrendEvidence& b) {
  if (a.label != b.label) return a.label < b.label;  // kCreep < kCreepEarly < kBalanced
  if (a.bytes_per_step() != b.bytes_per_step()) return a.bytes_per_step() > b.bytes_per_step();
  return a.rank < b.rank;
}

// The followed ranks whose later points rose most over their earlier ones (the mean of the last
// third less the first third's: O(points)), at most rank_fits of them, judged.
std::vector<RankTrendEvidence> AssessRankTrends(const MemoryTrend& t, MemoryKind kind,
                                                const MemoryDiagnosisOptions& o, Scratch* s) {
  std::vector<std::pair<double, size_t>> rising;  // (-rise, series)
  const size_t min_points = std::max<uint32_t>(o.trend_min_points, 3);
  for (size_t i = 0; i < t.rank_series_count(kind); ++i) {
    if (t.rank_series_points(kind, i) < min_points) continue;
    t.RankPoints(kind, i, &s->x, &s->y);
    const size_t n = s->y.size(), third = n / 3;
    if (s->x.back() - s->x.front() < o.trend_min_steps) continue;
    double head = 0, tail = 0;
    for (size_t j = 0; j < third; ++j) {
      head += s->y[j];
      tail += s->y[n - 1 - j];
    }
    if (tail > head) rising.push_back({-(tail - head) / static_cast<double>(third), i});
  }
  const size_t fits = std::min<size_t>(o.rank_fits, rising.size());
  std::partial_sort(rising.begin(), rising.begin() + static_cast<std::ptrdiff_t>(fits),
                    rising.end());
  std::vector<RankTrendEvidence> out;
  for (size_t c = 0; c < fits; ++c) out.push_back(AssessRankTrend(t, kind, rising[c].second, o, s));
  std::sort(out.begin(), out.end(), RankTrendBefore);
  return out;
}

// A job-wide creep's rate: the median of the followed ranks' own slopes over the horizon of the
// job's verdict (every rank of a small world: each rank's own rate, unlike the worst-rank
// series, which mixes ranks). nullopt without a followed rank that spans the horizon.
std::optional<double> FollowedRanksRate(const MemoryTrend& t, MemoryKind kind, bool last_half,
                                        const MemoryDiagnosisOptions& o, Scratch* s) {
  std::vector<double> rates;
  const size_t min_points = std::max<uint32_t>(o.trend_min_points, 3);
  for (size_t i = 0; i < t.rank_series_count(kind); ++i) {
    if (t.rank_series_points(kind, i) < min_points) continue;
    t.RankPoints(kind, i, &s->x, &s->y);
    const size_t n = s->x.size();
    if (s->x.back() - s->x.front() < o.trend_min_steps) continue;
    if (!last_half) {
      rates.push_back(TheilSenSlope(s->x.data(), s->y.data(), n, o.trend_max_pairs, &s->fit));
      continue;
    }
    // As the job's: the recent part of the later half of the points.
    const size_t m = n - n / 2;
    const size_t recent = std::max<size_t>(
        3, static_cast<size_t>(std::lround(static_cast<double>(m) * o.trend_recent_fraction)));
    if (recent > m) continue;
    rates.push_back(TheilSenSlope(s->x.data() + (n - recent), s->y.data() + (n - recent), recent,
                                  o.trend_max_pairs, &s->fit));
  }
  if (rates.empty()) return std::nullopt;
  return MedianInPlace(rates);
}

// The window policy on each candidate rank's own peaks: the trend's followed ranks and the
// worst-peak rank. The closest to a creep: a creep label first, then the largest growth.
std::optional<RankWindowEvidence> AssessRankWindows(const MemoryWindow& w, const MemoryTrend* t,
                                                    MemoryKind kind, uint32_t worst_rank,
                                                    double cap, const MemoryDiagnosisOptions& o,
                                                    Scratch* s) {
  std::vector<uint32_t> candidates{worst_rank};
  if (t != nullptr) {
    for (size_t i = 0; i < t->rank_series_count(kind); ++i) {
      candidates.push_back(t->rank_of_series(kind, i));
    }
  }
  std::sort(candidates.begin(), candidates.end());
  candidates.erase(std::unique(candidates.begin(), candidates.end()), candidates.end());
  std::optional<RankWindowEvidence> best;
  for (uint32_t r : candidates) {
    w.RankValues(kind, r, &s->y);
    s->y.erase(std::remove_if(s->y.begin(), s->y.end(), [](double v) { return v <= 0; }),
               s->y.end());
    if (s->y.size() < o.min_steps || s->y.size() < 8) continue;
    const WindowVerdict v = JudgeWindow(s->y, s->y, cap, o);
    RankWindowEvidence e;
    e.rank = r;
    e.growth = v.worst_growth;
    e.delta_bytes = v.delta_bytes;
    e.bytes_per_step = v.bytes_per_step;
    e.early_votes = v.early_votes;
    e.confirmed_votes = v.confirmed_votes;
    e.label = v.confirmed ? MemoryLabel::kCreep
                          : (v.early ? MemoryLabel::kCreepEarly : MemoryLabel::kBalanced);
    if (!best || e.label < best->label || (e.label == best->label && e.growth > best->growth)) {
      best = e;
    }
  }
  return best;
}

// The rank creep to report, if any: the window's before the trend's at each level.
struct RankCreep {
  MemoryLabel label = MemoryLabel::kBalanced;
  uint32_t rank = 0;
  bool lifetime_trend = false;
  double bytes_per_step = 0;
  const RankTrendEvidence* trend = nullptr;
};

RankCreep RankCreepOf(const MemoryKindEvidence& e) {
  for (MemoryLabel level : {MemoryLabel::kCreep, MemoryLabel::kCreepEarly}) {
    if (e.rank_window && e.rank_window->label == level) {
      return {level, e.rank_window->rank, false, e.rank_window->bytes_per_step, nullptr};
    }
    for (const RankTrendEvidence& t : e.rank_trends) {
      if (t.label == level) return {level, t.rank, true, t.bytes_per_step(), &t};
    }
  }
  return {};
}

// Steps until the device is full from `now_bytes` at `bytes_per_step`.
std::optional<uint64_t> StepsToFull(uint64_t capacity, double now_bytes, double bytes_per_step) {
  if (capacity == 0 || bytes_per_step <= 0) return std::nullopt;
  const double room = std::max(0.0, static_cast<double>(capacity) - now_bytes);
  return static_cast<uint64_t>(std::ceil(room / bytes_per_step));
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

  const double cap = static_cast<double>(capacity);
  const WindowVerdict job = JudgeWindow(worst, median, cap, o);
  e.early_votes = job.early_votes;
  e.confirmed_votes = job.confirmed_votes;
  e.worst_growth = job.worst_growth;
  e.median_growth = job.median_growth;
  e.delta_bytes = job.delta_bytes;
  e.creep_bytes_per_step = job.bytes_per_step;

  // Per rank.
  Scratch scratch;
  const bool ranks = trend != nullptr && o.trend && o.rank_trend;
  if (ranks) {
    for (size_t i = 0; i < trend->rank_series_count(kind); ++i) {
      if (trend->rank_series_steps(kind, i) > 0) ++e.ranks_followed;
    }
    e.rank_trends = AssessRankTrends(*trend, kind, o, &scratch);
    for (RankTrendEvidence& t : e.rank_trends) {
      const double now =
          rank_peak[t.rank] > 0 ? rank_peak[t.rank] : t.fit.level + t.fit.growth_bytes();
      t.projected_steps_to_full = StepsToFull(capacity, now, t.bytes_per_step());
    }
  }
  if (o.rank_window) {
    e.rank_window = AssessRankWindows(w, trend, kind, e.worst_rank, cap, o, &scratch);
  }
  const RankCreep rank = RankCreepOf(e);
  const Severity rank_severity =
      rank.label == MemoryLabel::kCreep ? Severity::kCrit : Severity::kWarn;

  const bool imbalance =
      e.skew >= o.imbalance_warn && (capacity == 0 || e.pressure >= o.imbalance_min_pressure);
  const Severity imbalance_severity =
      e.skew >= o.imbalance_crit ? Severity::kCrit : Severity::kWarn;
  auto set = [&](MemoryLabel label, CreepScope scope, bool lifetime) {
    e.label = label;
    e.severity = label == MemoryLabel::kCreep ? Severity::kCrit : Severity::kWarn;
    e.creep_scope = scope;
    e.lifetime_trend = lifetime;
  };
  if (e.pressure >= o.pressure_warn) {
    e.label = MemoryLabel::kHighPressure;
    e.severity = e.pressure >= o.pressure_crit ? Severity::kCrit : Severity::kWarn;
  } else if (imbalance && !(rank.label != MemoryLabel::kBalanced && rank.rank == e.worst_rank &&
                            rank_severity >= imbalance_severity)) {
    // (The worst rank's own creep, as severe, explains the skew: reported as that creep.)
    e.label = MemoryLabel::kImbalance;
    e.severity = imbalance_severity;
  } else if (job.confirmed) {
    set(MemoryLabel::kCreep, CreepScope::kJob, false);
  } else if (e.trend.label == MemoryLabel::kCreep) {
    set(MemoryLabel::kCreep, CreepScope::kJob, true);
  } else if (rank.label == MemoryLabel::kCreep) {
    set(MemoryLabel::kCreep, CreepScope::kRank, rank.lifetime_trend);
  } else if (job.early) {
    set(MemoryLabel::kCreepEarly, CreepScope::kJob, false);
  } else if (e.trend.label == MemoryLabel::kCreepEarly) {
    set(MemoryLabel::kCreepEarly, CreepScope::kJob, true);
  } else if (rank.label == MemoryLabel::kCreepEarly) {
    set(MemoryLabel::kCreepEarly, CreepScope::kRank, rank.lifetime_trend);
  } else {
    e.label = MemoryLabel::kBalanced;
  }
  // The rate reported: a job-wide creep the trend found, the median of the ranks' own slopes
  // (the worst-rank series' slope without followed ranks); one rank's, that rank's own.
  double now_bytes = worst.back();
  if (e.creep_scope == CreepScope::kJob && e.lifetime_trend) {
    e.creep_bytes_per_step = e.trend.bytes_per_step();
    if (ranks) {
      if (auto r = FollowedRanksRate(*trend, kind, e.trend.last_half, o, &scratch)) {
        e.creep_bytes_per_step = *r;
      }
    }
  } else if (e.creep_scope == CreepScope::kRank) {
    e.creep_rank = rank.rank;
    e.creep_bytes_per_step = rank.bytes_per_step;
    if (rank_peak[rank.rank] > 0) now_bytes = rank_peak[rank.rank];
    e.creep_rank_skew = e.median_peak_bytes > 0 && rank_peak[rank.rank] > 0
                            ? (rank_peak[rank.rank] - e.median_peak_bytes) / e.median_peak_bytes
                            : 0.0;
  }
  e.projected_steps_to_full = StepsToFull(capacity, now_bytes, e.creep_bytes_per_step);
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

std::string StepsToFullNote(const std::optional<uint64_t>& steps, bool trend) {
  if (!steps) return std::string();
  return trend ? fmt::format("; full in ~{} steps", Grouped(*steps))
               : fmt::format("; the device is full in about {} steps", *steps);
}

// `job_steps`: the memory steps of the kind since the trend began.
std::string CreepNote(const MemoryKindEvidence& e, std::string_view kind, uint64_t job_steps) {
  const std::string full = StepsToFullNote(e.projected_steps_to_full, e.lifetime_trend);
  if (e.creep_scope == CreepScope::kRank) {
    if (!e.lifetime_trend) {
      return fmt::format(
          "rank {}'s {} memory grows {} MiB per step ({:.0f}% over the window; {:.0f}% above "
          "the median rank){}",
          e.creep_rank, kind, MiBPerStep(e.creep_bytes_per_step),
          e.rank_window ? e.rank_window->growth * 100 : 0.0, e.creep_rank_skew * 100, full);
    }
    const RankTrendEvidence* t = nullptr;
    for (const RankTrendEvidence& r : e.rank_trends) {
      if (r.rank == e.creep_rank && r.label == e.label) {
        t = &r;
        break;
      }
    }
    if (t == nullptr) return std::string();  // unreachable: the label came from one of them
    // Followed since the job's first memory step, or since the rank was chosen (large worlds).
    const bool whole = !t->last_half && t->steps >= job_steps;
    return fmt::format(
        "rank {}'s {} memory grows {} MiB a step {} {}{} steps (steady, +{:.0f}%; {:.0f}% above "
        "the median rank){}",
        e.creep_rank, kind, MiBPerStep(e.creep_bytes_per_step),
        t->last_half ? "now, steadily over" : "over", whole ? "the job's " : "the last ",
        Grouped(t->steps), t->growth * 100, e.creep_rank_skew * 100, full);
  }
  if (e.lifetime_trend) {
    return fmt::format(
        "{} memory grows {} MiB a step {} the job's {}{} steps (steady, +{:.0f}%){}", kind,
        MiBPerStep(e.creep_bytes_per_step), e.trend.last_half ? "now, steadily over" : "over",
        e.trend.last_half ? "last " : "", Grouped(e.trend.steps), e.trend.worst_growth * 100, full);
  }
  return fmt::format("{} memory grows {} MiB per step ({:.0f}% over the window){}", kind,
                     MiBPerStep(e.creep_bytes_per_step), e.worst_growth * 100, full);
}

// "Steady and even" only when the numbers are: no trend grew above its noise and the growth
// floor, and no rank's peak is skewed beyond the imbalance threshold (below the imbalance's
// pressure floor); else what grew or is skewed, and why it is no creep or imbalance.
std::string BalancedNote(const MemoryKindEvidence& e, std::string_view kind,
                         const MemoryDiagnosisOptions& o) {
  std::vector<std::string> parts;
  auto how = [&](bool steady) {
    return steady ? fmt::format("steadily, under a creep's +{:.0f}% and {:.0f} MiB",
                                o.trend_early_growth * 100, o.trend_min_growth_bytes / kMiB)
                  : std::string("not steadily (levelling off)");
  };
  const RankTrendEvidence* grown = nullptr;
  for (const RankTrendEvidence& r : e.rank_trends) {
    if (r.present && Significant(r.fit, o) && (grown == nullptr || r.growth > grown->growth)) {
      grown = &r;
    }
  }
  if (grown != nullptr) {
    parts.push_back(fmt::format("rank {}'s peak grew {:.0f} MiB (+{:.0f}%) over {} steps, {}",
                                grown->rank, grown->fit.growth_bytes() / kMiB, grown->growth * 100,
                                Grouped(grown->steps), how(grown->steady)));
  } else if (e.trend.present && Significant(e.trend.worst, o)) {
    const bool worst_steady = Steady(e.trend.worst, o);
    parts.push_back(fmt::format(
        "the worst rank's peak grew {:.0f} MiB (+{:.0f}%) over {} steps, {}",
        e.trend.worst.growth_bytes() / kMiB, e.trend.worst_growth * 100, Grouped(e.trend.steps),
        worst_steady && !e.trend.steady ? std::string("steadily, but not the median rank's")
                                        : how(worst_steady)));
  }
  if (e.skew >= o.imbalance_warn) {
    parts.push_back(fmt::format(
        "rank {} peaks {:.0f}% above the median rank, at {:.0f}% of its device (an imbalance "
        "needs {:.0f}%)",
        e.worst_rank, e.skew * 100, e.pressure * 100, o.imbalance_min_pressure * 100));
  }
  if (parts.empty()) {
    return fmt::format("peaks steady and even across ranks ({:.1f} GiB median {})",
                       e.median_peak_bytes / kGiB, kind);
  }
  std::string out = "no creep or imbalance: ";
  for (size_t i = 0; i < parts.size(); ++i) out += (i > 0 ? "; " : "") + parts[i];
  return out + fmt::format(" ({:.1f} GiB median {})", e.median_peak_bytes / kGiB, kind);
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
  d.creep_scope = e.creep_scope;
  d.creep_rank = e.creep_rank;
  d.next_step = std::string(NextStep(d.label));
  if (d.creep_scope == CreepScope::kRank) {
    d.next_step = fmt::format(
        "inspect what rank {} alone retains (tensors kept by rank-specific logging, evaluation "
        "or caches)",
        d.creep_rank);
  }
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
      // A creep of that rank, less severe than the imbalance, is said too.
      if (const RankCreep rank = RankCreepOf(e);
          rank.label != MemoryLabel::kBalanced && rank.rank == e.worst_rank) {
        d.note += fmt::format("; it grows {} MiB a step", MiBPerStep(rank.bytes_per_step));
      }
      break;
    case MemoryLabel::kCreep:
    case MemoryLabel::kCreepEarly:
      d.note = CreepNote(e, kind, trend != nullptr ? trend->steps(d.kind) : 0);
      break;
    case MemoryLabel::kBalanced: d.note = BalancedNote(e, kind, o); break;
  }
  return d;
}

}  // namespace rankwatch
