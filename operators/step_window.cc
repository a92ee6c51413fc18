#include "operators/step_window.h"

#include <cassert>

namespace rankwatch {

StepWindow::StepWindow(uint32_t world_size, StepWindowOptions options)
    : world_size_(world_size), options_(options), totals_(world_size) {
  assert(options_.steps > 0);
}

void StepWindow::Apply(const Entry& e, int sign) {
  RankTotals& t = totals_[e.rank];
  for (int p = 0; p < kPhaseCount; ++p) {
    if (e.present & (1u << p)) {
      t.sum_ns[p] += sign * e.ns[p];
      t.count[p] += sign;
    }
  }
  if (e.HasGc()) {
    t.gc_sum_ns += sign * e.gc_ns;
    t.gc_collections += static_cast<uint64_t>(sign) * e.gc_count;
    t.gc_steps += sign;
  }
  const auto one = static_cast<uint64_t>(sign);  // +1, or -1 modulo 2^64
  if (e.present & kDeviceClockBit) {
    clock_steps_.device += one;
  } else {
    clock_steps_.host += one;
    if (e.present & kDeviceMissingBit) clock_steps_.device_missing += one;
  }
}

void StepWindow::Add(const AlignedStep& aligned) {
  Step step{aligned.step, 0, {}, {}};
  step.entries.reserve(aligned.samples.size());
  for (const StepSample& s : aligned.samples) {
    if (s.rank >= world_size_) continue;
    step.entries.push_back(Entry{s.rank, s.present, s.ns, s.gc_ns, s.gc_count});
    Apply(step.entries.back(), +1);
  }
  step.ranks_present = static_cast<uint32_t>(step.entries.size());
  steps_.push_back(std::move(step));
  if (steps_.size() > options_.steps) {
    for (const Entry& e : steps_.front().entries) Apply(e, -1);
    steps_.pop_front();
  }
}

}  // namespace rankwatch
