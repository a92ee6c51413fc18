// Step-memory diagnosis (docs/spec/step-diagnosis.md section 4): high pressure, imbalance across
// ranks, and memory creep (early, then confirmed) from the per-step device-memory peaks of a
// job, live — with the creep rate and the steps left until the device is full. Creep is found
// by the window policy of the spec (growth across the last K steps), or by the job's lifetime
// trend (operators/memory_trend.h): a steady, significant robust slope over the job's whole
// life, which finds leaks too slow for any window to cross the spec's floors.
//
// Both look at the job (its worst-rank and median-rank series: every rank grows) and at each
// rank the trend follows (every rank of a world of up to 32, else the 32 that grew most): the
// window policy on the rank's own peaks, and the lifetime trend on its own series, without the
// median rank. A creep says whose it is (MemoryKindEvidence::creep_scope, creep_rank) and
// reports that rank's own rate; a job-wide one the median of the followed ranks' own slopes.
//
// Pure: a function of the MemoryWindow, the MemoryTrend and the options.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "operators/memory_trend.h"
#include "operators/memory_window.h"
#include "operators/step_time_diagnosis.h"

namespace rankwatch {

enum class MemoryLabel : uint8_t {
  kNoData,
  kHighPressure,
  kImbalance,
  kCreep,
  kCreepEarly,
  kBalanced,
};
inline constexpr int kMemoryLabelCount = 6;
// Metric label value: "no_data", "high_pressure", "imbalance", "memory_creep",
// "memory_creep_early", "balanced".
std::string_view MemoryLabelName(MemoryLabel label);
std::string_view MemoryKindName(MemoryKind kind);  // "allocated", "reserved"

// Thresholds of the spec, each with its default.
struct MemoryDiagnosisOptions {
  uint32_t min_steps = 48;  // fewer steps with memory -> no_data
  double pressure_warn = 0.92;
  double pressure_crit = 0.97;
  double imbalance_warn = 0.12;
  double imbalance_crit = 0.20;
  // Imbalance only when the worst rank's peak is at least this share of the capacity, when the
  // capacity is known (TraceML 0.3.5): a skew of small peaks is harmless.
  double imbalance_min_pressure = 0.30;
  // Creep votes per slice: (worst growth, median growth) for early and confirmed.
  double early_worst = 0.02, early_median = 0.01;
  double confirmed_worst = 0.04, confirmed_median = 0.02;
  // Overall (f = 0.20 slice) growth and delta needed.
  double early_overall_worst = 0.06, early_overall_median = 0.03;
  double early_delta_bytes = 256.0 * 1024 * 1024, early_delta_head = 0.03,
         early_delta_capacity = 0.01;
  double confirmed_overall_worst = 0.10, confirmed_overall_median = 0.05;
  double confirmed_delta_bytes = 512.0 * 1024 * 1024, confirmed_delta_head = 0.05,
         confirmed_delta_capacity = 0.015;

  // Lifetime trend (docs/diagnoses.md, "Lifetime trend"). Fitted on the worst-rank series of
  // each kind; the median-rank series must pass the same test with its growth thresholds
  // scaled by trend_median_ratio.
  bool trend = true;               // use the lifetime trend
  uint32_t trend_min_steps = 200;  // the points must span at least this many steps
  uint32_t trend_min_points = 32;  // and number at least this many
  size_t trend_max_pairs = 1024;   // Theil–Sen pairs per fit (beyond: a deterministic subsample)
  double trend_recent_fraction = 1.0 / 3;  // the recent part: the last third of the points
  // Steady: still growing at the end. The recent slope >= trend_steady_ratio x the overall
  // slope, and the recent growth (recent slope x recent span) >= trend_recent_noise x sigma.
  double trend_steady_ratio = 0.5;
  double trend_recent_noise = 2.0;
  // Significant: growth over the horizon (slope x span) >= trend_noise x sigma (the residuals'
  // robust spread), >= trend_min_growth_bytes, and >= a share of the level at the start:
  double trend_noise = 4.0;
  double trend_min_growth_bytes = 32.0 * 1024 * 1024;
  double trend_early_growth = 0.10;      // memory_creep_early
  double trend_confirmed_growth = 0.25;  // memory_creep
  double trend_median_ratio = 0.5;       // the median rank's growth shares: the above x this
  // When the whole life shows no creep, judge the later half of the points the same way (a
  // leak that began late in a long job).
  bool trend_last_half = true;

  // Memory per rank (docs/diagnoses.md, "Memory per rank"). Each rank the trend follows is
  // judged on its own series like the job's worst-rank one (steady, significant, >= 32 MiB,
  // >= 10 % / 25 % of its own level), with no condition on the median rank.
  bool rank_trend = true;
  // Followed ranks fitted per kind and evaluation: those whose later points rose most over
  // their earlier ones (a cheap O(points) pre-ranking), which bounds the cost at any world size.
  uint32_t rank_fits = 8;
  // The window policy (the votes, growth and delta floors of the worst-rank series, no median
  // condition) on each followed rank's own peaks, and the worst-peak rank's.
  bool rank_window = true;
};

// One rank's lifetime trend of one kind: its own series (MemoryTrend's per-rank series).
struct RankTrendEvidence {
  uint32_t rank = 0;
  bool present = false;    // enough points over enough steps to judge
  bool last_half = false;  // judged on the later half of its points (as the job's trend)
  uint64_t steps = 0;      // memory steps of the horizon (since the rank was followed)
  TrendFit fit;
  double growth = 0;    // fit.growth_bytes() / fit.level
  bool steady = false;  // grows steadily and above its noise (growth thresholds aside)
  MemoryLabel label = MemoryLabel::kBalanced;  // kCreep, kCreepEarly or kBalanced
  std::optional<uint64_t> projected_steps_to_full;
  double bytes_per_step() const { return last_half ? fit.recent_slope : fit.slope; }
};

// The window policy on one rank's own peaks across the window.
struct RankWindowEvidence {
  uint32_t rank = 0;
  double growth = 0;       // overall (f = 0.20) growth of the rank's series
  double delta_bytes = 0;  // tail - head, overall slice
  double bytes_per_step = 0;
  int early_votes = 0, confirmed_votes = 0;
  MemoryLabel label = MemoryLabel::kBalanced;  // kCreep, kCreepEarly or kBalanced
};

// Whose memory creeps.
enum class CreepScope : uint8_t {
  kNone,  // no creep label
  kJob,   // every rank alike: the job's worst-rank and median-rank series both grow
  kRank,  // one rank: creep_rank
};

// The lifetime trend of one kind of memory.
struct MemoryTrendEvidence {
  bool present = false;  // enough points over enough steps to judge
  // The horizon judged: the job's whole life, or (when only that found a creep) its later half.
  bool last_half = false;
  uint64_t steps = 0;   // memory steps the horizon covers
  TrendFit worst;       // fit of the worst-rank series
  TrendFit median;      // fit of the median-rank series (only when the worst one grows steadily)
  bool steady = false;  // both series grow steadily and significantly (growth thresholds aside)
  double worst_growth = 0;                     // worst.growth_bytes() / worst.level
  double median_growth = 0;                    // median.growth_bytes() / median.level
  MemoryLabel label = MemoryLabel::kBalanced;  // kCreep, kCreepEarly or kBalanced
  // The growth rate it reports, bytes per step: the worst rank's slope over the whole life; on
  // the later half, the slope of its recent third (the half may still hold flat points).
  double bytes_per_step() const { return last_half ? worst.recent_slope : worst.slope; }
};

// Statistics of one kind of memory (allocated or reserved) over the window.
struct MemoryKindEvidence {
  bool present = false;
  double median_peak_bytes = 0;  // median over ranks of each rank's window peak
  double worst_peak_bytes = 0;
  uint32_t worst_rank = 0;
  double skew = 0;
  double pressure = 0;      // worst peak / capacity, 0 when the capacity is unknown
  double worst_growth = 0;  // overall (f = 0.20) growth of the worst and median series
  double median_growth = 0;
  double delta_bytes = 0;  // worst tail - worst head, overall slice
  int early_votes = 0, confirmed_votes = 0;
  double creep_bytes_per_step = 0;  // the window's rate, or the trend's when it found the creep
  std::optional<uint64_t> projected_steps_to_full;
  MemoryTrendEvidence trend;
  bool lifetime_trend = false;  // the creep label came from the lifetime trend, not the window
  MemoryLabel label = MemoryLabel::kNoData;
  Severity severity = Severity::kInfo;
  CreepScope creep_scope = CreepScope::kNone;
  uint32_t creep_rank = 0;     // with CreepScope::kRank
  double creep_rank_skew = 0;  // (its window peak - the median rank's) / the median rank's
  // Per rank: the ranks the trend follows, and the fitted ones' trends (at most rank_fits):
  // creep labels first, then the fastest.
  uint32_t ranks_followed = 0;
  std::vector<RankTrendEvidence> rank_trends;
  // The window policy on the ranks' own peaks: the rank that came closest to a creep (a creep
  // label first, then the largest growth); absent without ranks of min_steps peaks.
  std::optional<RankWindowEvidence> rank_window;
};

struct MemoryDiagnosis {
  MemoryLabel label = MemoryLabel::kNoData;
  Severity severity = Severity::kInfo;
  MemoryKind kind = MemoryKind::kAllocated;  // the kind the label comes from (the worse one)
  uint32_t window_steps = 0;
  uint64_t first_step = 0, last_step = 0;
  uint64_t capacity_bytes = 0;
  MemoryKindEvidence kinds[kMemoryKindCount];
  bool lifetime_trend = false;                 // the label came from the lifetime trend (of `kind`)
  CreepScope creep_scope = CreepScope::kNone;  // of `kind`, with a creep label
  uint32_t creep_rank = 0;
  std::string note;
  std::string next_step;
};

// `trend` may be null (no lifetime trend: the window policy alone).
MemoryDiagnosis DiagnoseMemory(const MemoryWindow& window, const MemoryTrend* trend,
                               const MemoryDiagnosisOptions& options);
inline MemoryDiagnosis DiagnoseMemory(const MemoryWindow& window,
                                      const MemoryDiagnosisOptions& options) {
  return DiagnoseMemory(window, nullptr, options);
}

}  // namespace rankwatch
