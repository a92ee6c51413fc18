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
// StepSample::present bits of the record's clock (StepRecord.clock), above kGcBit: kDeviceClockBit
// <=> STEP_CLOCK_DEVICE (the phases the collector timed on the device carry device time);
// kDeviceMissingBit <=> STEP_CLOCK_DEVICE_MISSING (device timing was on, but the step's events were
// too late: every time is a host time). Neither: a host-clock record (STEP_CLOCK_HOST), as are
// records stored before the clock was carried. They change no phase arithmetic: a record's
// phase fields are its best durations whichever clock measured them.
inline constexpr uint32_t kDeviceClockBit = 1u << (kPhaseCount + 1);
inline constexpr uint32_t kDeviceMissingBit = 1u << (kPhaseCount + 2);

// Metric label value of a phase ("dataloader", "forward_backward", ...).
std::string_view PhaseName(Phase phase);

struct StepSample {
  uint64_t step = 0;
  uint32_t rank = 0;
  // bit i set <=> phase i was reported (or derived); kGcBit: GC; kDeviceClockBit,
  // kDeviceMissingBit: the record's clock
  uint32_t present = 0;
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
  bool DeviceTimed() const { return present & kDeviceClockBit; }
  bool DeviceTimesMissing() const { return present & kDeviceMissingBit; }
  int64_t Get(Phase p) const { return ns[static_cast<int>(p)]; }
  void Set(Phase p, int64_t value) {
    ns[static_cast<int>(p)] = value;
    present |= 1u << static_cast<int>(p);
  }
};

// Converts a validated wire record of `rank`. Derives `wait` when the step time is known. GC
// counts as reported when gc_ns is (gc_count alone is not a time). The record's clock becomes
// kDeviceClockBit or kDeviceMissingBit (a clock value this daemon does not know: host).
StepSample ToStepSample(const v1::StepRecord& record, uint32_t rank);

}  // namespace rankwatch
