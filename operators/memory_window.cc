#include "operators/memory_window.h"

#include <algorithm>

#include "operators/phase_stats.h"

namespace rankwatch {

MemoryWindow::MemoryWindow(uint32_t world_size, MemoryWindowOptions options)
    : world_size_(world_size), options_(options) {}

void MemoryWindow::Add(const AlignedStep& aligned) {
  Step step{aligned.step, {}, {0, 0}, {0, 0}, 0};
  std::vector<double> values[kMemoryKindCount];
  for (const StepSample& s : aligned.samples) {
    if (s.rank >= world_size_ || (s.peak_allocated_bytes == 0 && s.peak_reserved_bytes == 0)) {
      continue;
    }
    Entry e{s.rank, {s.peak_allocated_bytes, s.peak_reserved_bytes}};
    for (int k = 0; k < kMemoryKindCount; ++k) {
      if (e.bytes[k] == 0) continue;
      values[k].push_back(static_cast<double>(e.bytes[k]));
      step.worst[k] = std::max(step.worst[k], static_cast<double>(e.bytes[k]));
    }
    step.capacity = std::max(step.capacity, s.device_capacity_bytes);
    step.entries.push_back(e);
  }
  if (step.entries.empty()) return;
  for (int k = 0; k < kMemoryKindCount; ++k) {
    if (!values[k].empty()) step.median[k] = MedianInPlace(values[k]);
  }
  steps_.push_back(std::move(step));
  if (steps_.size() > options_.steps) steps_.pop_front();
}

uint64_t MemoryWindow::capacity() const {
  uint64_t c = 0;
  for (const Step& s : steps_) c = std::max(c, s.capacity);
  return c;
}

}  // namespace rankwatch
