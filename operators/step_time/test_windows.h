// Test helpers for the stages of the step-time diagnosis: windows built from per-rank phase
// times in milliseconds.
#pragma once

#include <cstdint>
#include <functional>

#include "operators/step_window.h"
#include "rankwatch/v1/telemetry.pb.h"

namespace rankwatch::step_time::testing {

// One rank's phases in one step, in milliseconds; a negative value is "not reported". `gc` is
// the step's GC pause time (it sits inside the phases), `gc_count` its collections.
struct Ms {
  double dl = -1, fwd = -1, bwd = -1, opt = -1, coll = -1, fb = -1, step = -1;
  double gc = -1;
  uint32_t gc_count = 0;
};

inline v1::StepRecord Record(uint64_t step, const Ms& m) {
  auto ns = [](double ms) { return static_cast<uint64_t>(ms * 1e6 + 0.5); };
  v1::StepRecord r;
  r.set_step(step);
  if (m.dl >= 0) r.set_dataloader_ns(ns(m.dl));
  if (m.fwd >= 0) r.set_forward_ns(ns(m.fwd));
  if (m.bwd >= 0) r.set_backward_ns(ns(m.bwd));
  if (m.opt >= 0) r.set_optimizer_ns(ns(m.opt));
  if (m.coll >= 0) r.set_collective_ns(ns(m.coll));
  if (m.fb >= 0) r.set_forward_backward_ns(ns(m.fb));
  if (m.step >= 0) r.set_step_time_ns(ns(m.step));
  if (m.gc >= 0) {
    r.set_gc_ns(ns(m.gc));
    r.set_gc_count(m.gc_count);
  }
  return r;
}

// A window of `steps` steps of `ranks` ranks in which rank r reports phases(step, r); a rank
// whose phases are all unreported (Ms{}) sends nothing that step.
inline StepWindow WindowOf(uint32_t ranks, uint64_t steps,
                           const std::function<Ms(uint64_t, uint32_t)>& phases) {
  StepWindow w(ranks, {.steps = 100});
  for (uint64_t s = 0; s < steps; ++s) {
    AlignedStep a{s, ranks, false, {}};
    for (uint32_t r = 0; r < ranks; ++r) {
      const Ms m = phases(s, r);
      if (m.dl < 0 && m.fwd < 0 && m.bwd < 0 && m.opt < 0 && m.coll < 0 && m.fb < 0 && m.step < 0)
        continue;
      a.samples.push_back(ToStepSample(Record(s, m), r));
    }
    w.Add(a);
  }
  return w;
}

}  // namespace rankwatch::step_time::testing
