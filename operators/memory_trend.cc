#include "operators/memory_trend.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <optional>

#include "operators/phase_stats.h"

namespace rankwatch {
namespace {

uint64_t Bytes(double v) { return v <= 0 ? 0 : static_cast<uint64_t>(std::llround(v)); }

}  // namespace

namespace memory_trend_internal {

template <int W>
void Downsampled<W>::Push(const Sums& sums, size_t max_points) {
  full.push_back(sums);
  if (full.size() < max_points) return;
  // Full: merge adjacent pairs (equal strides, so the merged sums are exact means of 2 x stride
  // steps) and double the stride.
  const size_t half = full.size() / 2;
  for (size_t i = 0; i < half; ++i) {
    const Sums& a = full[2 * i];
    const Sums& b = full[2 * i + 1];
    Sums m;
    m.step = a.step + b.step;
    for (int j = 0; j < W; ++j) m.v[j] = a.v[j] + b.v[j];
    full[i] = m;
  }
  full.resize(half);
  stride *= 2;
}

template <int W>
void Downsampled<W>::Add(uint64_t step, const uint64_t (&values)[W], size_t max_points) {
  pending.step += step;
  for (int j = 0; j < W; ++j) pending.v[j] += values[j];
  ++steps;
  if (++pending_count == stride) {
    Push(pending, max_points);
    pending = {};
    pending_count = 0;
  }
}

template <int W>
void Downsampled<W>::MergeDown(size_t max_points) {
  while (full.size() >= max_points) {
    std::vector<Sums> old = std::move(full);
    const uint64_t point_stride = stride;
    full.clear();
    for (size_t i = 0; i + 1 < old.size(); i += 2) {
      Sums m;
      m.step = old[i].step + old[i + 1].step;
      for (int j = 0; j < W; ++j) m.v[j] = old[i].v[j] + old[i + 1].v[j];
      full.push_back(m);
    }
    stride *= 2;
    if (old.size() % 2 == 1) {  // the odd one out joins the point still filling
      pending.step += old.back().step;
      for (int j = 0; j < W; ++j) pending.v[j] += old.back().v[j];
      pending_count += static_cast<uint32_t>(point_stride);
    }
  }
  if (pending_count >= stride) {  // only after a merge down: the pending point is full
    Push(pending, max_points);
    pending = {};
    pending_count = 0;
  }
}

template <int W>
void Downsampled<W>::Means(int i, std::vector<double>* x, std::vector<double>* y) const {
  x->clear();
  y->clear();
  x->reserve(point_count());
  y->reserve(point_count());
  const double n = static_cast<double>(stride);
  for (const Sums& p : full) {
    x->push_back(static_cast<double>(p.step) / n);
    y->push_back(static_cast<double>(p.v[i]) / n);
  }
  if (pending_count > 0) {
    const double c = pending_count;
    x->push_back(static_cast<double>(pending.step) / c);
    y->push_back(static_cast<double>(pending.v[i]) / c);
  }
}

template struct Downsampled<1>;
template struct Downsampled<2>;

}  // namespace memory_trend_internal

MemoryTrend::MemoryTrend(MemoryTrendOptions options, uint32_t world_size)
    : max_points_(std::max<size_t>(4, options.max_points & ~size_t{1})),
      rank_max_points_(std::max<size_t>(4, options.rank_max_points & ~size_t{1})),
      rank_series_(options.rank_series),
      rank_block_steps_(std::max<uint32_t>(1, options.rank_block_steps)),
      rank_swap_bytes_(options.rank_swap_bytes),
      world_size_(world_size) {
  for (RankKind& rk : ranks_) {
    if (follows_every_rank()) {
      rk.series.resize(world_size_);
      for (uint32_t r = 0; r < world_size_; ++r) rk.series[r].rank = r;
    } else {
      rk.blocks.resize(world_size_);
    }
  }
}

void MemoryTrend::Add(const MemoryWindow::Step& step, const MemoryWindow* ranks) {
  bool any = false;
  for (int k = 0; k < kMemoryKindCount; ++k) {
    if (step.worst[k] <= 0) continue;
    any = true;
    series_[k].Add(step.step, {Bytes(step.worst[k]), Bytes(step.median[k])}, max_points_);
    if (ranks != nullptr && world_size_ > 0 && ranks->world_size() == world_size_) {
      AddRanks(k, step.step, ranks->last_values(static_cast<MemoryKind>(k)));
    }
  }
  if (any) {
    ++steps_;
    last_step_ = step.step;
  }
}

void MemoryTrend::AddRanks(int k, uint64_t step, const std::vector<double>& bytes) {
  RankKind& rk = ranks_[k];
  for (RankSeries& s : rk.series) {
    if (bytes[s.rank] > 0) s.s.Add(step, {Bytes(bytes[s.rank])}, rank_max_points_);
  }
  if (rk.blocks.empty()) return;
  for (uint32_t r = 0; r < world_size_; ++r) {
    if (bytes[r] <= 0) continue;
    rk.blocks[r].sum += Bytes(bytes[r]);
    ++rk.blocks[r].count;
  }
  if (++rk.block_steps >= rank_block_steps_) CloseBlock(k);
}

double MemoryTrend::Growth(const RankBlock& b) {
  if (b.base_mean == 0 || b.last_mean == 0) return -HUGE_VAL;
  return static_cast<double>(b.last_mean) - static_cast<double>(b.base_mean);
}

void MemoryTrend::CloseBlock(int k) {
  RankKind& rk = ranks_[k];
  rk.block_steps = 0;
  for (RankBlock& b : rk.blocks) {
    if (b.count == 0) continue;
    const uint64_t mean = (b.sum + b.count / 2) / b.count;
    (b.base_mean == 0 ? b.base_mean : b.last_mean) = std::max<uint64_t>(mean, 1);
    b.sum = 0;
    b.count = 0;
  }
  // The ranks that grew most, most first (ties: the lower rank), at most rank_series_ of them.
  std::vector<std::pair<double, uint32_t>> grown;
  for (uint32_t r = 0; r < world_size_; ++r) {
    const double g = Growth(rk.blocks[r]);
    if (g > -HUGE_VAL) grown.push_back({-g, r});
  }
  const size_t top = std::min<size_t>(rank_series_, grown.size());
  std::partial_sort(grown.begin(), grown.begin() + static_cast<std::ptrdiff_t>(top), grown.end());
  for (size_t c = 0; c < top; ++c) {
    const uint32_t rank = grown[c].second;
    const double g = -grown[c].first;
    if (std::any_of(rk.series.begin(), rk.series.end(),
                    [&](const RankSeries& s) { return s.rank == rank; })) {
      continue;
    }
    if (rk.series.size() < rank_series_) {
      rk.series.push_back({rank, {}});
      continue;
    }
    // Full: displace the followed rank that grew least (the first such slot), by a margin.
    size_t least = 0;
    for (size_t i = 1; i < rk.series.size(); ++i) {
      if (Growth(rk.blocks[rk.series[i].rank]) < Growth(rk.blocks[rk.series[least].rank])) {
        least = i;
      }
    }
    // The candidates come most-grown first: once one does not displace, none after it will.
    if (g < Growth(rk.blocks[rk.series[least].rank]) + rank_swap_bytes_) break;
    rk.series[least] = {rank, {}};
  }
}

std::optional<double> MemoryTrend::RankGrowth(MemoryKind kind, uint32_t rank) const {
  const RankKind& rk = ranks_[K(kind)];
  if (rank >= rk.blocks.size()) return std::nullopt;
  const double g = Growth(rk.blocks[rank]);
  if (g == -HUGE_VAL) return std::nullopt;
  return g;
}

size_t MemoryTrend::point_count(MemoryKind kind) const { return series_[K(kind)].point_count(); }

void MemoryTrend::Points(MemoryKind kind, std::vector<Point>* out) const {
  const JobSeries& s = series_[K(kind)];
  out->clear();
  out->reserve(s.full.size() + 1);
  const double n = static_cast<double>(s.stride);
  for (const JobSeries::Sums& p : s.full) {
    out->push_back({static_cast<double>(p.step) / n, static_cast<double>(p.v[0]) / n,
                    static_cast<double>(p.v[1]) / n});
  }
  if (s.pending_count > 0) {
    const double c = s.pending_count;
    out->push_back({static_cast<double>(s.pending.step) / c,
                    static_cast<double>(s.pending.v[0]) / c,
                    static_cast<double>(s.pending.v[1]) / c});
  }
}

void MemoryTrend::RankPoints(MemoryKind kind, size_t i, std::vector<double>* steps,
                             std::vector<double>* bytes) const {
  ranks_[K(kind)].series[i].s.Means(0, steps, bytes);
}

state::v1::MemoryTrendState MemoryTrend::ExportState() const {
  state::v1::MemoryTrendState out;
  out.set_last_step(last_step_);
  out.set_steps(steps_);
  for (const JobSeries& s : series_) {
    state::v1::MemoryTrendSeries* o = out.add_kinds();
    o->set_stride(s.stride);
    o->set_steps(s.steps);
    JobSeries::Sums prev;
    for (const JobSeries::Sums& p : s.full) {
      o->add_step_sum_delta(static_cast<int64_t>(p.step - prev.step));
      o->add_worst_sum_delta(static_cast<int64_t>(p.v[0] - prev.v[0]));
      o->add_median_sum_delta(static_cast<int64_t>(p.v[1] - prev.v[1]));
      prev = p;
    }
    o->set_pending_count(s.pending_count);
    o->set_pending_step_sum(s.pending.step);
    o->set_pending_worst_sum(s.pending.v[0]);
    o->set_pending_median_sum(s.pending.v[1]);
  }
  for (int k = 0; k < kMemoryKindCount; ++k) {
    const RankKind& rk = ranks_[k];
    for (const RankSeries& r : rk.series) {
      if (r.s.steps == 0 && follows_every_rank()) continue;  // a rank with no peak yet
      state::v1::MemoryRankSeries* o = out.add_rank_series();
      o->set_rank(r.rank);
      o->set_kind(static_cast<uint32_t>(k));
      o->set_stride(r.s.stride);
      o->set_steps(r.s.steps);
      memory_trend_internal::Downsampled<1>::Sums prev;
      for (const auto& p : r.s.full) {
        o->add_step_sum_delta(static_cast<int64_t>(p.step - prev.step));
        o->add_bytes_sum_delta(static_cast<int64_t>(p.v[0] - prev.v[0]));
        prev = p;
      }
      o->set_pending_count(r.s.pending_count);
      o->set_pending_step_sum(r.s.pending.step);
      o->set_pending_bytes_sum(r.s.pending.v[0]);
    }
  }
  if (!follows_every_rank()) {
    for (const RankKind& rk : ranks_) {
      state::v1::MemoryRankSummary* o = out.add_rank_summaries();
      o->set_block_steps(rk.block_steps);
      for (const RankBlock& b : rk.blocks) {
        o->add_base_mean(b.base_mean);
        o->add_last_mean(b.last_mean);
        o->add_block_sum(b.sum);
        o->add_block_count(b.count);
      }
    }
  }
  return out;
}

absl::StatusOr<MemoryTrend> MemoryTrend::FromState(const state::v1::MemoryTrendState& state,
                                                   MemoryTrendOptions options,
                                                   uint32_t world_size) {
  MemoryTrend t(options, world_size);
  if (state.kinds_size() != 0 && state.kinds_size() != kMemoryKindCount) {
    return absl::DataLossError("stored memory trend has " + std::to_string(state.kinds_size()) +
                               " kinds");
  }
  auto valid_stride = [](uint64_t stride, uint32_t pending_count) {
    return stride != 0 && (stride & (stride - 1)) == 0 && pending_count < stride;
  };
  t.steps_ = state.steps();
  t.last_step_ = state.last_step();
  for (int k = 0; k < state.kinds_size(); ++k) {
    const state::v1::MemoryTrendSeries& in = state.kinds(k);
    const int n = in.step_sum_delta_size();
    if (!valid_stride(in.stride(), in.pending_count()) || in.worst_sum_delta_size() != n ||
        in.median_sum_delta_size() != n) {
      return absl::DataLossError("stored memory trend is inconsistent");
    }
    JobSeries& s = t.series_[k];
    s.stride = in.stride();
    s.steps = in.steps();
    JobSeries::Sums prev;
    for (int i = 0; i < n; ++i) {
      prev.step += static_cast<uint64_t>(in.step_sum_delta(i));
      prev.v[0] += static_cast<uint64_t>(in.worst_sum_delta(i));
      prev.v[1] += static_cast<uint64_t>(in.median_sum_delta(i));
      s.full.push_back(prev);
    }
    s.pending = {in.pending_step_sum(), {in.pending_worst_sum(), in.pending_median_sum()}};
    s.pending_count = in.pending_count();
    // Written with a larger bound than this daemon's: merge down (pairs of full points).
    s.MergeDown(t.max_points_);
  }
  for (const state::v1::MemoryRankSeries& in : state.rank_series()) {
    const int n = in.step_sum_delta_size();
    if (in.kind() >= kMemoryKindCount || in.rank() >= world_size ||
        !valid_stride(in.stride(), in.pending_count()) || in.bytes_sum_delta_size() != n) {
      return absl::DataLossError("stored memory trend of a rank is inconsistent");
    }
    RankKind& rk = t.ranks_[in.kind()];
    RankSeries* r = nullptr;
    if (t.follows_every_rank()) {
      r = &rk.series[in.rank()];
      if (r->s.steps != 0) return absl::DataLossError("stored memory trend repeats a rank");
    } else {
      if (std::any_of(rk.series.begin(), rk.series.end(),
                      [&](const RankSeries& s) { return s.rank == in.rank(); })) {
        return absl::DataLossError("stored memory trend repeats a rank");
      }
      if (rk.series.size() >= t.rank_series_) continue;  // followed more ranks than this daemon
      r = &rk.series.emplace_back();
      r->rank = in.rank();
    }
    r->s.stride = in.stride();
    r->s.steps = in.steps();
    memory_trend_internal::Downsampled<1>::Sums prev;
    for (int i = 0; i < n; ++i) {
      prev.step += static_cast<uint64_t>(in.step_sum_delta(i));
      prev.v[0] += static_cast<uint64_t>(in.bytes_sum_delta(i));
      r->s.full.push_back(prev);
    }
    r->s.pending = {in.pending_step_sum(), {in.pending_bytes_sum()}};
    r->s.pending_count = in.pending_count();
    r->s.MergeDown(t.rank_max_points_);
  }
  // The summary, when this daemon keeps one and the state has it (a state written with every
  // rank followed, or before summaries existed, starts it empty).
  if (!t.follows_every_rank() && state.rank_summaries_size() == kMemoryKindCount) {
    for (int k = 0; k < kMemoryKindCount; ++k) {
      const state::v1::MemoryRankSummary& in = state.rank_summaries(k);
      const int n = static_cast<int>(world_size);
      if (in.base_mean_size() != n || in.last_mean_size() != n || in.block_sum_size() != n ||
          in.block_count_size() != n) {
        return absl::DataLossError("stored memory trend's rank summary is inconsistent");
      }
      RankKind& rk = t.ranks_[k];
      rk.block_steps = std::min(in.block_steps(), t.rank_block_steps_ - 1);
      for (int r = 0; r < n; ++r) {
        rk.blocks[r] = {in.base_mean(r), in.last_mean(r), in.block_sum(r), in.block_count(r)};
      }
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
  const size_t n = points.size();
  std::vector<double> x(n), y(n);
  for (size_t i = 0; i < n; ++i) {
    x[i] = points[i].step;
    y[i] = series == TrendSeries::kWorst ? points[i].worst : points[i].median;
  }
  return FitTrend(x.data(), y.data(), n, recent_fraction, max_pairs, scratch);
}

TrendFit FitTrend(const double* x, const double* y, size_t n, double recent_fraction,
                  size_t max_pairs, std::vector<double>* scratch) {
  TrendFit f;
  const size_t recent = std::max<size_t>(
      3, static_cast<size_t>(std::lround(static_cast<double>(n) * recent_fraction)));
  f.points = static_cast<uint32_t>(n);
  if (n < 3 || recent > n) return f;
  f.present = true;
  f.first_step = x[0];
  f.last_step = x[n - 1];
  f.span_steps = f.last_step - f.first_step;
  f.slope = TheilSenSlope(x, y, n, max_pairs, scratch);
  // Intercept at the first point: the median of the residuals' offsets; then their spread.
  std::vector<double>& r = *scratch;
  r.resize(n);
  for (size_t i = 0; i < n; ++i) r[i] = y[i] - f.slope * (x[i] - f.first_step);
  f.level = MedianInPlace(r);
  for (size_t i = 0; i < n; ++i) r[i] = std::fabs(y[i] - f.level - f.slope * (x[i] - f.first_step));
  f.sigma = 1.4826 * MedianInPlace(r);
  const size_t from = n - recent;
  f.recent_slope = TheilSenSlope(x + from, y + from, recent, max_pairs, scratch);
  f.recent_span_steps = f.last_step - x[from];
  return f;
}

}  // namespace rankwatch
