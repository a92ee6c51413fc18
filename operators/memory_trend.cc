#include "operators/memory_trend.h"

#include <algorithm>
#include <cassert>
#include <cmath>

#include "operators/phase_stats.h"

namespace rankwatch {
namespace {

uint64_t Bytes(double v) { return v <= 0 ? 0 : static_cast<uint64_t>(std::llround(v)); }

}  // namespace

MemoryTrend::MemoryTrend(MemoryTrendOptions options)
    : max_points_(std::max<size_t>(4, options.max_points & ~size_t{1})) {}

void MemoryTrend::Push(Series& s, const Sums& sums, size_t max_points) {
  s.full.push_back(sums);
  if (s.full.size() < max_points) return;
  // Full: merge adjacent pairs (equal strides, so the merged sums are exact means of 2 x stride
  // steps) and double the stride.
  const size_t half = s.full.size() / 2;
  for (size_t i = 0; i < half; ++i) {
    const Sums& a = s.full[2 * i];
    const Sums& b = s.full[2 * i + 1];
    s.full[i] = {a.step + b.step, a.worst + b.worst, a.median + b.median};
  }
  s.full.resize(half);
  s.stride *= 2;
}

void MemoryTrend::Add(const MemoryWindow::Step& step) {
  bool any = false;
  for (int k = 0; k < kMemoryKindCount; ++k) {
    if (step.worst[k] <= 0) continue;
    any = true;
    Series& s = series_[k];
    s.pending.step += step.step;
    s.pending.worst += Bytes(step.worst[k]);
    s.pending.median += Bytes(step.median[k]);
    ++s.steps;
    if (++s.pending_count == s.stride) {
      Push(s, s.pending, max_points_);
      s.pending = {};
      s.pending_count = 0;
    }
  }
  if (any) {
    ++steps_;
    last_step_ = step.step;
  }
}

size_t MemoryTrend::point_count(MemoryKind kind) const {
  const Series& s = series_[static_cast<int>(kind)];
  return s.full.size() + (s.pending_count > 0 ? 1 : 0);
}

void MemoryTrend::Points(MemoryKind kind, std::vector<Point>* out) const {
  const Series& s = series_[static_cast<int>(kind)];
  out->clear();
  out->reserve(s.full.size() + 1);
  const double n = static_cast<double>(s.stride);
  for (const Sums& p : s.full) {
    out->push_back({static_cast<double>(p.step) / n, static_cast<double>(p.worst) / n,
                    static_cast<double>(p.median) / n});
  }
  if (s.pending_count > 0) {
    const double c = s.pending_count;
    out->push_back({static_cast<double>(s.pending.step) / c,
                    static_cast<double>(s.pending.worst) / c,
                    static_cast<double>(s.pending.median) / c});
  }
}

state::v1::MemoryTrendState MemoryTrend::ExportState() const {
  state::v1::MemoryTrendState out;
  out.set_last_step(last_step_);
  out.set_steps(steps_);
  for (const Series& s : series_) {
    state::v1::MemoryTrendSeries* o = out.add_kinds();
    o->set_stride(s.stride);
    o->set_steps(s.steps);
    Sums prev;
    for (const Sums& p : s.full) {
      o->add_step_sum_delta(static_cast<int64_t>(p.step - prev.step));
      o->add_worst_sum_delta(static_cast<int64_t>(p.worst - prev.worst));
      o->add_median_sum_delta(static_cast<int64_t>(p.median - prev.median));
      prev = p;
    }
    o->set_pending_count(s.pending_count);
    o->set_pending_step_sum(s.pending.step);
    o->set_pending_worst_sum(s.pending.worst);
    o->set_pending_median_sum(s.pending.median);
  }
  return out;
}

absl::StatusOr<MemoryTrend> MemoryTrend::FromState(const state::v1::MemoryTrendState& state,
                                                   MemoryTrendOptions options) {
  MemoryTrend t(options);
  if (state.kinds_size() != 0 && state.kinds_size() != kMemoryKindCount) {
    return absl::DataLossError("stored memory trend has " + std::to_string(state.kinds_size()) +
                               " kinds");
  }
  t.steps_ = state.steps();
  t.last_step_ = state.last_step();
  for (int k = 0; k < state.kinds_size(); ++k) {
    const state::v1::MemoryTrendSeries& in = state.kinds(k);
    const int n = in.step_sum_delta_size();
    const uint64_t stride = in.stride();
    if (stride == 0 || (stride & (stride - 1)) != 0 || in.worst_sum_delta_size() != n ||
        in.median_sum_delta_size() != n || in.pending_count() >= stride) {
      return absl::DataLossError("stored memory trend is inconsistent");
    }
    Series& s = t.series_[k];
    s.stride = stride;
    s.steps = in.steps();
    Sums prev;
    for (int i = 0; i < n; ++i) {
      prev = {prev.step + static_cast<uint64_t>(in.step_sum_delta(i)),
              prev.worst + static_cast<uint64_t>(in.worst_sum_delta(i)),
              prev.median + static_cast<uint64_t>(in.median_sum_delta(i))};
      s.full.push_back(prev);
    }
    // Written with a larger bound than this daemon's: merge down (pairs of full points).
    while (s.full.size() >= t.max_points_) {
      std::vector<Sums> full = std::move(s.full);
      const uint64_t point_stride = s.stride;
      s.full.clear();
      for (size_t i = 0; i + 1 < full.size(); i += 2) {
        s.full.push_back({full[i].step + full[i + 1].step, full[i].worst + full[i + 1].worst,
                          full[i].median + full[i + 1].median});
      }
      s.stride *= 2;
      if (full.size() % 2 == 1) {  // the odd one out joins the point still filling
        s.pending.step += full.back().step;
        s.pending.worst += full.back().worst;
        s.pending.median += full.back().median;
        s.pending_count += static_cast<uint32_t>(point_stride);
      }
    }
    s.pending.step += in.pending_step_sum();
    s.pending.worst += in.pending_worst_sum();
    s.pending.median += in.pending_median_sum();
    s.pending_count += in.pending_count();
    if (s.pending_count >= s.stride) {  // only after a merge down: the pending point is full
      Push(s, s.pending, t.max_points_);
      s.pending = {};
      s.pending_count = 0;
    }
  }
  return t;
}

double TheilSenSlope(const double* x, const double* y, size_t n, size_t max_pairs,
                     std::vector<double>* scratch) {
  if (n < 2) return 0;
  std::vector<double>& slopes = *scratch;
  slopes.clear();
  const uint64_t pairs = uint64_t{n} * (n - 1) / 2;
  max_pairs = std::max<size_t>(max_pairs, 1);
  const uint64_t every = (pairs + max_pairs - 1) / max_pairs;  // >= 1
  slopes.reserve(std::min<uint64_t>(pairs, max_pairs));
  // Every `every`-th pair in (i, j) order, i < j: walk the rows, carrying the step over rows.
  size_t i = 0, j = 1;
  while (i + 1 < n) {
    slopes.push_back((y[j] - y[i]) / (x[j] - x[i]));
    j += every;
    while (j >= n && i + 1 < n) {
      ++i;
      j = j - n + i + 1;
    }
  }
  return MedianInPlace(slopes);
}

TrendFit FitTrend(const std::vector<MemoryTrend::Point>& points, TrendSeries series,
                  double recent_fraction, size_t max_pairs, std::vector<double>* scratch) {
  TrendFit f;
  const size_t n = points.size();
  const size_t recent = std::max<size_t>(
      3, static_cast<size_t>(std::lround(static_cast<double>(n) * recent_fraction)));
  f.points = static_cast<uint32_t>(n);
  if (n < 3 || recent > n) return f;
  f.present = true;
  std::vector<double> x(n), y(n);
  for (size_t i = 0; i < n; ++i) {
    x[i] = points[i].step;
    y[i] = series == TrendSeries::kWorst ? points[i].worst : points[i].median;
  }
  f.first_step = x.front();
  f.last_step = x.back();
  f.span_steps = f.last_step - f.first_step;
  f.slope = TheilSenSlope(x.data(), y.data(), n, max_pairs, scratch);
  // Intercept at the first point: the median of the residuals' offsets; then their spread.
  std::vector<double>& r = *scratch;
  r.resize(n);
  for (size_t i = 0; i < n; ++i) r[i] = y[i] - f.slope * (x[i] - f.first_step);
  f.level = MedianInPlace(r);
  for (size_t i = 0; i < n; ++i) r[i] = std::fabs(y[i] - f.level - f.slope * (x[i] - f.first_step));
  f.sigma = 1.4826 * MedianInPlace(r);
  const size_t from = n - recent;
  f.recent_slope = TheilSenSlope(x.data() + from, y.data() + from, recent, max_pairs, scratch);
  f.recent_span_steps = f.last_step - x[from];
  return f;
}

}  // namespace rankwatch
