#include "operators/memory_window.h"

#include <algorithm>
#include <cassert>

#include "operators/phase_stats.h"

namespace rankwatch {

MemoryWindow::MemoryWindow(uint32_t world_size, MemoryWindowOptions options)
    : world_size_(world_size), slots_(options.steps) {
  assert(slots_ > 0);
  // The rings (world size x window steps) are allocated with the first memory sample: a job
  // that reports none, or a hostile id that never becomes a job, costs no window.
  for (int k = 0; k < kMemoryKindCount; ++k) {
    peak_[k].assign(world_size, 0);
    incoming_[k].assign(world_size, 0);
  }
}

const MemoryWindow::Step* MemoryWindow::Add(const AlignedStep& aligned) {
  Step step{aligned.step, 0, {0, 0}, {0, 0}, 0};
  std::vector<double> values[kMemoryKindCount];
  for (auto& v : incoming_) std::fill(v.begin(), v.end(), 0.0);
  for (const StepSample& s : aligned.samples) {
    if (s.rank >= world_size_ || (s.peak_allocated_bytes == 0 && s.peak_reserved_bytes == 0)) {
      continue;
    }
    const double bytes[kMemoryKindCount] = {static_cast<double>(s.peak_allocated_bytes),
                                            static_cast<double>(s.peak_reserved_bytes)};
    for (int k = 0; k < kMemoryKindCount; ++k) {
      incoming_[k][s.rank] = bytes[k];
      if (bytes[k] <= 0) continue;
      values[k].push_back(bytes[k]);
      step.worst[k] = std::max(step.worst[k], bytes[k]);
    }
    step.capacity = std::max(step.capacity, s.device_capacity_bytes);
    ++step.ranks;
  }
  if (step.ranks == 0) return nullptr;
  for (int k = 0; k < kMemoryKindCount; ++k) {
    if (!values[k].empty()) step.median[k] = MedianInPlace(values[k]);
  }

  // Overwrite the oldest slot of every rank (ranks absent from this step get 0) and keep
  // each rank's peak current.
  if (ring_[0].empty()) {
    for (auto& ring : ring_) ring.assign(size_t{world_size_} * slots_, 0);
  }
  const size_t slot = next_slot_;
  next_slot_ = (next_slot_ + 1) % slots_;
  for (int k = 0; k < kMemoryKindCount; ++k) {
    for (uint32_t r = 0; r < world_size_; ++r) {
      double* ring = ring_[k].data() + size_t{r} * slots_;
      const double old = ring[slot];
      const double now = incoming_[k][r];
      ring[slot] = now;
      double& peak = peak_[k][r];
      if (now >= peak) {
        peak = now;
      } else if (old == peak) {  // the peak left the window: rescan this rank
        peak = *std::max_element(ring, ring + slots_);
      }
    }
  }
  steps_.push_back(step);
  if (steps_.size() > slots_) steps_.pop_front();
  return &steps_.back();
}

void MemoryWindow::RankValues(MemoryKind kind, uint32_t rank, std::vector<double>* out) const {
  out->clear();
  if (rank >= world_size_ || ring_[0].empty()) return;
  const double* ring = ring_[static_cast<int>(kind)].data() + size_t{rank} * slots_;
  // The oldest step's slot: 0 until the ring is full, then the one written next.
  const size_t first = steps_.size() < slots_ ? 0 : next_slot_;
  out->reserve(steps_.size());
  for (size_t i = 0; i < steps_.size(); ++i) out->push_back(ring[(first + i) % slots_]);
}

uint64_t MemoryWindow::capacity() const {
  uint64_t c = 0;
  for (const Step& s : steps_) c = std::max(c, s.capacity);
  return c;
}

}  // namespace rankwatch
