// MemoryTrend: one job's memory peaks over its whole life, bounded (docs/spec/step-diagnosis.md
// section 4, "beyond, second wave"): per memory kind (allocated, reserved), per aligned step
// with memory, the worst-rank and the median-rank peak (MemoryWindow::Step), kept as at most
// `max_points` points. Each point is the mean of `stride` consecutive memory steps; when the
// buffer is full, adjacent pairs merge (means of two equal-sized points) and the stride doubles,
// so every full point covers the same number of steps. The newest point may still be filling.
//
// FitTrend fits a robust line to those points (Theil–Sen: the median of the pairwise slopes,
// over a deterministic subsample of at most `max_pairs` pairs), and the same over the recent
// part of the points, with the spread of the residuals: what the memory diagnosis needs to tell
// a steady leak from growth that levels off and from noise (operators/memory_diagnosis.h).
//
// State is exact integer sums (bytes, step numbers), so a trend exported to a checkpoint and
// restored gives the same fit. Not thread-safe: owned by the job's JobPipeline.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "operators/memory_window.h"
#include "rankwatch/state/v1/job_state.pb.h"

namespace rankwatch {

struct MemoryTrendOptions {
  size_t max_points = 512;  // points kept per kind (even, >= 4); default 512
};

class MemoryTrend {
 public:
  // One point: means over the point's memory steps.
  struct Point {
    double step;    // mean step number
    double worst;   // mean worst-rank peak, bytes
    double median;  // mean median-rank peak, bytes
  };

  explicit MemoryTrend(MemoryTrendOptions options = {});

  // Adds one aligned step's memory (its kinds with no peak are left out of that kind's series).
  // Steps must come in ascending step order.
  void Add(const MemoryWindow::Step& step);

  // The points of `kind`, oldest first, the one still filling last. Replaces `out`'s contents.
  void Points(MemoryKind kind, std::vector<Point>* out) const;
  size_t point_count(MemoryKind kind) const;
  uint64_t stride(MemoryKind kind) const { return series_[static_cast<int>(kind)].stride; }
  // Memory steps added to `kind` since the trend began.
  uint64_t steps(MemoryKind kind) const { return series_[static_cast<int>(kind)].steps; }
  // Memory steps added (either kind), and the newest one's step number (when steps() > 0).
  uint64_t steps() const { return steps_; }
  uint64_t last_step() const { return last_step_; }

  state::v1::MemoryTrendState ExportState() const;
  // A damaged state is DataLoss. A state with more points than `options` allows is merged down.
  static absl::StatusOr<MemoryTrend> FromState(const state::v1::MemoryTrendState& state,
                                               MemoryTrendOptions options);

 private:
  struct Sums {
    uint64_t step = 0, worst = 0, median = 0;
  };
  struct Series {
    uint64_t stride = 1;
    uint64_t steps = 0;
    std::vector<Sums> full;  // each the sums of `stride` steps
    Sums pending;            // the point still filling
    uint32_t pending_count = 0;
  };
  static void Push(Series& s, const Sums& sums, size_t max_points);

  size_t max_points_;
  Series series_[kMemoryKindCount];
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

// Theil–Sen slope of (x[i], y[i]), i < n (x strictly increasing), over at most `max_pairs`
// pairs as above; 0 when n < 2. Exposed for the tests and the benchmark.
double TheilSenSlope(const double* x, const double* y, size_t n, size_t max_pairs,
                     std::vector<double>* scratch);

}  // namespace rankwatch
