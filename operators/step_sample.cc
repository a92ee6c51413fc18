#include "operators/step_sample.h"

#include <algorithm>

namespace rankwatch {

std::string_view PhaseName(Phase phase) {
  switch (phase) {
    case Phase::kDataloader: return "dataloader";
    case Phase::kForward: return "forward";
    case Phase::kBackward: return "backward";
    case Phase::kOptimizer: return "optimizer";
    case Phase::kForwardBackward: return "forward_backward";
    case Phase::kCollective: return "collective";
    case Phase::kWait: return "wait";
    case Phase::kStep: return "step";
  }
  return "unknown";
}

StepSample ToStepSample(const v1::StepRecord& r, uint32_t rank) {
  StepSample s;
  s.step = r.step();
  s.rank = rank;
  int64_t local = 0;
  auto take = [&](bool has, uint64_t value, Phase phase, bool local_burden) {
    if (!has) return;
    s.Set(phase, static_cast<int64_t>(value));
    if (local_burden) local += static_cast<int64_t>(value);
  };
  take(r.has_dataloader_ns(), r.dataloader_ns(), Phase::kDataloader, true);
  take(r.has_forward_ns(), r.forward_ns(), Phase::kForward, true);
  take(r.has_backward_ns(), r.backward_ns(), Phase::kBackward, true);
  take(r.has_optimizer_ns(), r.optimizer_ns(), Phase::kOptimizer, true);
  take(r.has_forward_backward_ns(), r.forward_backward_ns(), Phase::kForwardBackward, true);
  take(r.has_collective_ns(), r.collective_ns(), Phase::kCollective, false);
  if (r.step_time_ns() > 0) {
    const auto step_time = static_cast<int64_t>(r.step_time_ns());
    s.Set(Phase::kStep, step_time);
    s.Set(Phase::kWait, std::max<int64_t>(0, step_time - local));
  }
  if (r.has_gc_ns()) {
    s.gc_ns = static_cast<int64_t>(r.gc_ns());
    s.gc_count = r.gc_count();
    s.present |= kGcBit;
  }
  switch (r.clock()) {
    case v1::STEP_CLOCK_DEVICE: s.present |= kDeviceClockBit; break;
    case v1::STEP_CLOCK_DEVICE_MISSING: s.present |= kDeviceMissingBit; break;
    default: break;
  }
  s.peak_allocated_bytes = r.peak_allocated_bytes();
  s.peak_reserved_bytes = r.peak_reserved_bytes();
  s.device_capacity_bytes = r.device_capacity_bytes();
  s.end_unix_ns = r.end_unix_ns();
  return s;
}

}  // namespace rankwatch
