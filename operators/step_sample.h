// StepSample: one rank's step record in the compact form the step operators work on.
//
// Plain value type; converted once from the wire `StepRecord`, so that alignment and windows
// never touch protobuf objects.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

#include "rankwatch/v1/telemetry.pb.h"

namespace rankwatch {

// The phases of a step, in the order of docs/spec/step-diagnosis.md section 1. `kWait` is derived:
// max(0, step_time - (dataloader + forward + backward + optimizer + forward_backward)).
enum class Phase : uint8_t {
  kDataloader = 0,
  kForward,
  kBackward,
  kOptimizer,
  kForwardBackward,
  kCollective,
  kWait,
  kStep,
};
inline constexpr int kPhaseCount = 8;
// StepSample::present bit of GC pauses: set <=> gc_ns and gc_count were reported. Above the
// phase bits; code that walks the phase bits never sees it.
inline constexpr uint32_t kGcBit = 1u << kPhaseCount;

// Metric label value of a phase ("dataloader", "forward_backward", ...).
std::string_view PhaseName(Phase phase);

struct StepSample {
  uint64_t step = 0;
  uint32_t rank = 0;
  uint32_t present = 0;  // bit i set <=> phase i was reported (or derived); kGcBit: GC
  std::array<int64_t, kPhaseCount> ns{};
  // Garbage-collection pauses in the step (they sit inside the phases or between them): their
  // total time and how many; 0 when not reported (HasGc).
  int64_t gc_ns = 0;
  uint32_t gc_count = 0;
  uint64_t peak_allocated_bytes = 0;  // 0 when not reported
  uint64_t peak_reserved_bytes = 0;
  uint64_t device_capacity_bytes = 0;
  int64_t end_unix_ns = 0;

  bool Has(Phase p) const { return present & (1u << static_cast<int>(p)); }
  bool HasGc() const { return present & kGcBit; }
  int64_t Get(Phase p) const { return ns[static_cast<int>(p)]; }
  void Set(Phase p, int64_t value) {
    ns[static_cast<int>(p)] = value;
    present |= 1u << static_cast<int>(p);
  }
};

// Converts a validated wire record of `rank`. Derives `wait` when the step time is known. GC
// counts as reported when gc_ns is (gc_count alone is not a time).
StepSample ToStepSample(const v1::StepRecord& record, uint32_t rank);

}  // namespace rankwatch
