// MemoryWindow: the device-memory peaks of one job's last K aligned steps that carried memory
// (docs/spec/step-diagnosis.md section 4): per step, the worst and median over ranks, and per rank
// the peak over the window, for allocated and reserved memory.
//
// Each rank's values live in a ring of K slots, and its window peak is kept up to date as
// steps enter and leave (a rank's ring is rescanned only when its peak leaves the window), so
// reading the peaks costs O(ranks), not O(ranks x K). The newest step's value of every rank
// stays readable (last_values) for the lifetime trend's per-rank series, and one rank's values
// over the window (RankValues) for the per-rank window policy (operators/memory_diagnosis.h).
//
// Not thread-safe: owned by the job's worker thread.
#pragma once

#include <cstdint>
#include <deque>
#include <vector>

#include "operators/step_aligner.h"

namespace rankwatch {

enum class MemoryKind : uint8_t { kAllocated = 0, kReserved = 1 };
inline constexpr int kMemoryKindCount = 2;

struct MemoryWindowOptions {
  size_t steps = 100;  // memory K; default 100
};

class MemoryWindow {
 public:
  struct Step {
    uint64_t step;
    uint32_t ranks;                   // ranks that reported memory
    double worst[kMemoryKindCount];   // max over ranks
    double median[kMemoryKindCount];  // median over the ranks that reported
    uint64_t capacity;                // largest device capacity reported, 0 = unknown
  };

  MemoryWindow(uint32_t world_size, MemoryWindowOptions options);

  // Appends the memory of an aligned step and returns it (valid until the next Add); steps in
  // which no rank reported memory are skipped (they do not count as memory points): nullptr.
  const Step* Add(const AlignedStep& step);

  const std::deque<Step>& steps() const { return steps_; }
  uint32_t world_size() const { return world_size_; }
  // Each rank's peak over the window (0 = no memory reported in the window).
  const std::vector<double>& rank_peaks(MemoryKind kind) const {
    return peak_[static_cast<int>(kind)];
  }
  // Largest capacity reported in the window, 0 when unknown.
  uint64_t capacity() const;
  // Each rank's peak in the newest step added (0 = no peak of `kind` in it).
  const std::vector<double>& last_values(MemoryKind kind) const {
    return incoming_[static_cast<int>(kind)];
  }
  // `rank`'s peaks of `kind` over the window, oldest first, one per step of steps() (0 where
  // it reported none). Replaces `out`'s contents; O(K).
  void RankValues(MemoryKind kind, uint32_t rank, std::vector<double>* out) const;

 private:
  const uint32_t world_size_;
  const size_t slots_;
  size_t next_slot_ = 0;
  std::deque<Step> steps_;
  std::vector<double> ring_[kMemoryKindCount];  // rank-major: rank * slots_ + slot
  std::vector<double> peak_[kMemoryKindCount];
  std::vector<double> incoming_[kMemoryKindCount];  // the newest step's value per rank
};

}  // namespace rankwatch
