// MemoryWindow: the device-memory peaks of one job's last K aligned steps that carried memory
// (spec/step-diagnosis.md section 4): each rank's peaks per step, and per step the worst and
// median over ranks, for allocated and reserved memory.
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
  struct Entry {
    uint32_t rank;
    uint64_t bytes[kMemoryKindCount];  // 0 = not reported
  };
  struct Step {
    uint64_t step;
    std::vector<Entry> entries;
    double worst[kMemoryKindCount];   // max over ranks
    double median[kMemoryKindCount];  // median over the ranks that reported
    uint64_t capacity;                // largest device capacity reported, 0 = unknown
  };

  MemoryWindow(uint32_t world_size, MemoryWindowOptions options);

  // Appends the memory of an aligned step; steps in which no rank reported memory are
  // skipped (they do not count as memory points).
  void Add(const AlignedStep& step);

  const std::deque<Step>& steps() const { return steps_; }
  uint32_t world_size() const { return world_size_; }
  // Largest capacity reported in the window, 0 when unknown.
  uint64_t capacity() const;

 private:
  const uint32_t world_size_;
  const MemoryWindowOptions options_;
  std::deque<Step> steps_;
};

}  // namespace rankwatch
