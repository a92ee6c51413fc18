// Helpers for operator tests: build step samples and records tersely.
#pragma once

#include "operators/step_sample.h"

namespace rankwatch::testing {

// A sample of `rank` at `step` whose phases are given in milliseconds.
inline StepSample Sample(uint32_t rank, uint64_t step, double dataloader_ms = 10,
                         double forward_ms = 30, double backward_ms = 50, double optimizer_ms = 8,
                         double wait_ms = 2) {
  v1::StepRecord r;
  r.set_step(step);
  r.set_dataloader_ns(static_cast<uint64_t>(dataloader_ms * 1e6));
  r.set_forward_ns(static_cast<uint64_t>(forward_ms * 1e6));
  r.set_backward_ns(static_cast<uint64_t>(backward_ms * 1e6));
  r.set_optimizer_ns(static_cast<uint64_t>(optimizer_ms * 1e6));
  r.set_step_time_ns(static_cast<uint64_t>(
      (dataloader_ms + forward_ms + backward_ms + optimizer_ms + wait_ms) * 1e6));
  return ToStepSample(r, rank);
}

}  // namespace rankwatch::testing
