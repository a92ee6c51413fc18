// TimedStep: one closed training step of one rank as the collector timed it, the plain-data
// unit the training thread hands to the sender thread through a BoundedRing. Converts to the
// wire's v1::StepRecord (docs/spec/step-diagnosis.md section 1). Not the daemon's StepSample
// (operators/step_sample.h): phases here are numbered as the C API numbers them.
//
// A step timed on the device (Collector::ExpectDeviceTimes, SetDeviceTimes) carries its clock
// (v1::StepClock): with device times, the phases timed on the device carry them and their host
// times go into the record's host_phases; with the device's times missing, host times only.
//
// Plain value type; not shared.
#pragma once

#include <cstdint>

#include "rankwatch/v1/telemetry.pb.h"

namespace rankwatch {

// The phases of a step a collector times. Values are the C API's RW_PHASE_* numbers.
enum class StepPhase : uint8_t {
  kDataloader = 0,
  kForward = 1,
  kBackward = 2,
  kOptimizer = 3,
  kCollective = 4,
  kForwardBackward = 5,
};
inline constexpr int kStepPhaseCount = 6;

// The device's time of each phase timed on it (Collector::SetDeviceTimes). The dataloader is
// host work: a device time of it is ignored.
struct DevicePhases {
  uint64_t phase_ns[kStepPhaseCount] = {};
  uint32_t phase_mask = 0;  // bit i set: phase i was timed on the device
};

struct TimedStep {
  uint64_t step = 0;
  uint64_t step_time_ns = 0;
  int64_t end_unix_ns = 0;
  uint64_t phase_ns[kStepPhaseCount] = {};
  uint32_t phase_mask = 0;            // bit i set: phase i was timed during the step (else absent)
  uint64_t peak_allocated_bytes = 0;  // 0 = not reported
  uint64_t peak_reserved_bytes = 0;
  uint64_t device_capacity_bytes = 0;
  uint64_t collectives_entered = 0;  // cumulative, default process group; 0 = not reported
  // Monotonic start and end (Collector::NowNs): where the step's ops count from.
  uint64_t begin_ns = 0;
  uint64_t end_ns = 0;
  // The step's ops (StepOp.generation == generation) and how many were kept (within the
  // collector's max_ops_per_step); they travel separately and are written by AppendStepOps.
  uint64_t generation = 0;
  uint32_t ops = 0;
  // Garbage-collection pauses of the step; sent when watched or when there was one.
  uint64_t gc_ns = 0;
  uint32_t gc_count = 0;
  bool gc_watched = false;
  // How its phases and ops were timed: a v1::StepClock value (STEP_CLOCK_HOST: the record
  // carries no clock; STEP_CLOCK_DEVICE: with DevicePhases and device op times).
  uint8_t clock = 0;

  // Fills `out` (cleared first) but for the ops; phases never timed stay absent, as the
  // schema asks. With clock STEP_CLOCK_DEVICE and `device`, each phase in device->phase_mask
  // but the dataloader carries its device time, and its host time (phase_ns, 0 when the host
  // did not time it) goes into host_phases, even when equal: host_phases says which phases are
  // device time. Any other clock than STEP_CLOCK_HOST is written into the record.
  void ToProto(v1::StepRecord* out, const DevicePhases* device = nullptr) const;
};

}  // namespace rankwatch
