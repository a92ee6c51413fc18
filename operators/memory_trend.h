// MemoryTrend: one job's memory peaks over its whole life, bounded (docs/spec/step-diagnosis.md
// section 4, "beyond, second wave"; docs/diagnoses.md, "Lifetime trend" and "Memory per rank").
//
// The job series: per memory kind (allocated, reserved), per aligned step with memory, the
// worst-rank and the median-rank peak (MemoryWindow::Step), kept as at most `max_points` points.
// Each point is the mean of `stride` consecutive memory steps; when the buffer is full, adjacent
// pairs merge (means of two equal-sized points) and the stride doubles, so every full point
// covers the same number of steps. The newest point may still be filling.
//
// Per-rank series: the same scheme (at most `rank_max_points` points each) for the peak of one
// rank, so that a leak on one rank is judged on that rank's own peaks, not on the worst-rank
// series, which mixes ranks (the worst rank changes from step to step when ranks are close).
// Bounded at `rank_series` ranks per kind (32):
// - a world of at most `rank_series` ranks: every rank, from its first step;
// - a larger world: the `rank_series` ranks whose memory grew most. Every rank keeps a summary
//   of three numbers: the mean peak of its first block of `rank_block_steps` (16) memory
//   steps, of its latest complete block, and the sums of the block still filling. At the end of
//   each block the ranks are ranked by growth (latest block mean - first block mean); a rank
//   outside the followed ones replaces the followed rank that grew least when it grew at least
//   `rank_swap_bytes` more (so noise does not churn the series), and its series starts then.
//   Memory: 32 B a rank a kind for the summary (1 MiB at 16,384 ranks, against the memory
//   window's 26 MiB of rings), and at most 2 x 32 series of 128 points (16 B each): bounded
//   whatever the world size; per step O(ranks) for the summary (as the window), the selection
//   O(ranks) once a block.
//
// FitTrend fits a robust line to those points (Theil–Sen: the median of the pairwise slopes,
// over a deterministic subsample of at most `max_pairs` pairs), and the same over the recent
// part of the points, with the spread of the residuals: what the memory diagnosis needs to tell
// a steady leak from growth that levels off and from noise (operators/memory_diagnosis.h).
//
// State is exact integer sums (bytes, step numbers), so a trend exported to a checkpoint and
// restored gives the same fit and follows the same ranks. Not thread-safe: owned by the job's
// JobPipeline.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "operators/memory_window.h"
#include "rankwatch/state/v1/job_state.pb.h"

namespace rankwatch {

struct MemoryTrendOptions {
  size_t max_points = 512;  // points kept per job series (even, >= 4); default 512
  // Per-rank series (docs/diagnoses.md, "Memory per rank").
  uint32_t rank_series = 32;       // ranks followed per kind: every rank of a world this small
  size_t rank_max_points = 128;    // points kept per rank series (even, >= 4)
  uint32_t rank_block_steps = 16;  // larger worlds: memory steps per block of the summary
  double rank_swap_bytes = 8.0 * 1024 * 1024;  // growth by which a rank displaces a followed one
};

namespace memory_trend_internal {

// A series of W values per point kept as exact sums of `stride` memory steps per full point (the
// scheme above). Not part of the interface: MemoryTrend's storage.
template <int W>
struct Downsampled {
  struct Sums {
    uint64_t step = 0;
    uint64_t v[W] = {};
  };
  uint64_t stride = 1;
  uint64_t steps = 0;
  std::vector<Sums> full;  // each the sums of `stride` steps
  Sums pending;            // the point still filling
  uint32_t pending_count = 0;

  void Add(uint64_t step, const uint64_t (&values)[W], size_t max_points);
  // Appends a full point; when `max_points` are full, merges adjacent pairs (the stride doubles).
  void Push(const Sums& sums, size_t max_points);
  // After a restore: merges down to fewer than `max_points` full points (state written with a
  // larger bound), the odd point out joining the one still filling.
  void MergeDown(size_t max_points);
  size_t point_count() const { return full.size() + (pending_count > 0 ? 1 : 0); }
  // Mean step and mean of value `i` of each point, oldest first, the one filling last.
  void Means(int i, std::vector<double>* steps, std::vector<double>* values) const;
};

}  // namespace memory_trend_internal

class MemoryTrend {
 public:
  // One point of the job series: means over the point's memory steps.
  struct Point {
    double step;    // mean step number
    double worst;   // mean worst-rank peak, bytes
    double median;  // mean median-rank peak, bytes
  };

  // `world_size` 0: no per-rank series (the job series only).
  explicit MemoryTrend(MemoryTrendOptions options = {}, uint32_t world_size = 0);

  // Adds one aligned step's memory (its kinds with no peak are left out of that kind's series).
  // With `ranks` (the MemoryWindow that `step` came from, just after its Add), each rank's peak
  // in it (MemoryWindow::last_values) feeds the per-rank series and summary. Steps must come in
  // ascending step order.
  void Add(const MemoryWindow::Step& step, const MemoryWindow* ranks = nullptr);

  // The points of `kind`, oldest first, the one still filling last. Replaces `out`'s contents.
  void Points(MemoryKind kind, std::vector<Point>* out) const;
  size_t point_count(MemoryKind kind) const;
  uint64_t stride(MemoryKind kind) const { return series_[static_cast<int>(kind)].stride; }
  // Memory steps added to `kind` since the trend began.
  uint64_t steps(MemoryKind kind) const { return series_[static_cast<int>(kind)].steps; }
  // Memory steps added (either kind), and the newest one's step number (when steps() > 0).
  uint64_t steps() const { return steps_; }
  uint64_t last_step() const { return last_step_; }

  // Per-rank series of `kind`: every rank in rank order when follows_every_rank(), else the
  // ranks chosen so far, in the order of their slots.
  uint32_t world_size() const { return world_size_; }
  bool follows_every_rank() const { return world_size_ <= rank_series_; }
  size_t rank_series_count(MemoryKind kind) const { return ranks_[K(kind)].series.size(); }
  uint32_t rank_of_series(MemoryKind kind, size_t i) const {
    return ranks_[K(kind)].series[i].rank;
  }
  // Memory steps the series holds (since its rank was first followed) and its points.
  uint64_t rank_series_steps(MemoryKind kind, size_t i) const {
    return ranks_[K(kind)].series[i].s.steps;
  }
  size_t rank_series_points(MemoryKind kind, size_t i) const {
    return ranks_[K(kind)].series[i].s.point_count();
  }
  uint64_t rank_series_stride(MemoryKind kind, size_t i) const {
    return ranks_[K(kind)].series[i].s.stride;
  }
  // The series' points as mean steps and mean peaks (bytes), oldest first. Replaces both.
  void RankPoints(MemoryKind kind, size_t i, std::vector<double>* steps,
                  std::vector<double>* bytes) const;
  // Larger worlds: `rank`'s growth by the summary (its latest complete block's mean peak less
  // its first block's, bytes); nullopt before it has two blocks, or when every rank is followed.
  std::optional<double> RankGrowth(MemoryKind kind, uint32_t rank) const;

  state::v1::MemoryTrendState ExportState() const;
  // A damaged state is DataLoss. A state with more points than `options` allows is merged down;
  // one with more rank series than `options` follows keeps the first ones.
  static absl::StatusOr<MemoryTrend> FromState(const state::v1::MemoryTrendState& state,
                                               MemoryTrendOptions options, uint32_t world_size = 0);

 private:
  using JobSeries = memory_trend_internal::Downsampled<2>;  // worst, median
  struct RankSeries {
    uint32_t rank = 0;
    memory_trend_internal::Downsampled<1> s;
  };
  // One rank's summary of one kind (larger worlds). Means are rounded bytes, 0 = none yet.
  struct RankBlock {
    uint64_t base_mean = 0;  // its first block with a peak
    uint64_t last_mean = 0;  // its latest complete block with a peak, after the first
    uint64_t sum = 0;        // the block still filling
    uint32_t count = 0;
  };
  struct RankKind {
    std::vector<RankSeries> series;
    std::vector<RankBlock> blocks;  // by rank; empty when every rank is followed
    uint32_t block_steps = 0;       // memory steps in the block still filling
  };
  static int K(MemoryKind kind) { return static_cast<int>(kind); }
  void AddRanks(int k, uint64_t step, const std::vector<double>& bytes);
  // End of a block: the blocks' means, then the ranks to follow.
  void CloseBlock(int k);
  static double Growth(const RankBlock& b);

  size_t max_points_;
  size_t rank_max_points_;
  uint32_t rank_series_;
  uint32_t rank_block_steps_;
  double rank_swap_bytes_;
  uint32_t world_size_;
  JobSeries series_[kMemoryKindCount];
  RankKind ranks_[kMemoryKindCount];
  uint64_t steps_ = 0;
  uint64_t last_step_ = 0;
};

// A robust straight-line fit of one series of trend points (worst or median).
struct TrendFit {
  bool present = false;  // enough points to fit (at least 3 overall and 3 recent)
  uint32_t points = 0;
  double first_step = 0, last_step = 0;  // x range of the points (mean steps)
  double span_steps = 0;                 // last_step - first_step
  double slope = 0;                      // Theil–Sen, bytes per step
  double level = 0;                      // the fit at first_step, bytes
  double sigma = 0;                      // residual spread: 1.4826 x median |residual|, bytes
  double recent_slope = 0;               // Theil–Sen over the recent points only
  double recent_span_steps = 0;
  double growth_bytes() const { return slope * span_steps; }
  double recent_growth_bytes() const { return recent_slope * recent_span_steps; }
};

enum class TrendSeries : uint8_t { kWorst, kMedian };

// Fits `series` of `points`: overall, and over the last `recent_fraction` of the points (at least
// 3). Each Theil–Sen slope uses all pairs when there are at most `max_pairs`, else every k-th
// pair in (i, j) order, k = ceil(pairs / max_pairs). `scratch` is reused across calls.
TrendFit FitTrend(const std::vector<MemoryTrend::Point>& points, TrendSeries series,
                  double recent_fraction, size_t max_pairs, std::vector<double>* scratch);
// The same for points (x[i], y[i]), i < n, x increasing (a rank's series).
TrendFit FitTrend(const double* x, const double* y, size_t n, double recent_fraction,
                  size_t max_pairs, std::vector<double>* scratch);

// Theil–Sen slope of (x[i], y[i]), i < n (x strictly increasing), over at most `max_pairs`
// pairs as above; 0 when n < 2. Exposed for the tests and the benchmark.
double TheilSenSlope(const double* x, const double* y, size_t n, size_t max_pairs,
                     std::vector<double>* scratch);

}  // namespace rankwatch
