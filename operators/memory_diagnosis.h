// Step-memory diagnosis (docs/spec/step-diagnosis.md section 4): high pressure, imbalance across
// ranks, and memory creep (early, then confirmed) from the per-step device-memory peaks of a
// job, live — with the creep rate and the steps left until the device is full.
//
// Pure: a function of the MemoryWindow and the options.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

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
  double creep_bytes_per_step = 0;
  std::optional<uint64_t> projected_steps_to_full;
  MemoryLabel label = MemoryLabel::kNoData;
  Severity severity = Severity::kInfo;
};

struct MemoryDiagnosis {
  MemoryLabel label = MemoryLabel::kNoData;
  Severity severity = Severity::kInfo;
  MemoryKind kind = MemoryKind::kAllocated;  // the kind the label comes from (the worse one)
  uint32_t window_steps = 0;
  uint64_t first_step = 0, last_step = 0;
  uint64_t capacity_bytes = 0;
  MemoryKindEvidence kinds[kMemoryKindCount];
  std::string note;
  std::string next_step;
};

MemoryDiagnosis DiagnoseMemory(const MemoryWindow& window, const MemoryDiagnosisOptions& options);

}  // namespace rankwatch
