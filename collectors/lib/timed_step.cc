#include "collectors/lib/timed_step.h"

namespace rankwatch {

void TimedStep::ToProto(v1::StepRecord* out, const DevicePhases* device) const {
  out->Clear();
  out->set_step(step);
  out->set_step_time_ns(step_time_ns);
  out->set_end_unix_ns(end_unix_ns);
  auto timed = [this](StepPhase p) { return (phase_mask >> static_cast<int>(p)) & 1u; };
  auto ns = [this](StepPhase p) { return phase_ns[static_cast<int>(p)]; };
  if (timed(StepPhase::kDataloader)) out->set_dataloader_ns(ns(StepPhase::kDataloader));
  if (timed(StepPhase::kForward)) out->set_forward_ns(ns(StepPhase::kForward));
  if (timed(StepPhase::kBackward)) out->set_backward_ns(ns(StepPhase::kBackward));
  if (timed(StepPhase::kOptimizer)) out->set_optimizer_ns(ns(StepPhase::kOptimizer));
  if (timed(StepPhase::kCollective)) out->set_collective_ns(ns(StepPhase::kCollective));
  if (timed(StepPhase::kForwardBackward)) {
    out->set_forward_backward_ns(ns(StepPhase::kForwardBackward));
  }
  if (clock != v1::STEP_CLOCK_HOST) out->set_clock(static_cast<v1::StepClock>(clock));
  if (clock == v1::STEP_CLOCK_DEVICE && device != nullptr) {
    auto on_device = [device](StepPhase p) {
      return (device->phase_mask >> static_cast<int>(p)) & 1u;
    };
    auto device_ns = [device](StepPhase p) { return device->phase_ns[static_cast<int>(p)]; };
    // The dataloader is host work: never device time.
    if (on_device(StepPhase::kForward)) {
      out->set_forward_ns(device_ns(StepPhase::kForward));
      out->mutable_host_phases()->set_forward_ns(ns(StepPhase::kForward));
    }
    if (on_device(StepPhase::kBackward)) {
      out->set_backward_ns(device_ns(StepPhase::kBackward));
      out->mutable_host_phases()->set_backward_ns(ns(StepPhase::kBackward));
    }
    if (on_device(StepPhase::kOptimizer)) {
      out->set_optimizer_ns(device_ns(StepPhase::kOptimizer));
      out->mutable_host_phases()->set_optimizer_ns(ns(StepPhase::kOptimizer));
    }
    if (on_device(StepPhase::kCollective)) {
      out->set_collective_ns(device_ns(StepPhase::kCollective));
      out->mutable_host_phases()->set_collective_ns(ns(StepPhase::kCollective));
    }
    if (on_device(StepPhase::kForwardBackward)) {
      out->set_forward_backward_ns(device_ns(StepPhase::kForwardBackward));
      out->mutable_host_phases()->set_forward_backward_ns(ns(StepPhase::kForwardBackward));
    }
  }
  if (peak_allocated_bytes > 0) out->set_peak_allocated_bytes(peak_allocated_bytes);
  if (peak_reserved_bytes > 0) out->set_peak_reserved_bytes(peak_reserved_bytes);
  if (device_capacity_bytes > 0) out->set_device_capacity_bytes(device_capacity_bytes);
  if (collectives_entered > 0) out->set_collectives_entered(collectives_entered);
  if (gc_watched || gc_count > 0) {
    out->set_gc_ns(gc_ns);
    out->set_gc_count(gc_count);
  }
}

}  // namespace rankwatch
