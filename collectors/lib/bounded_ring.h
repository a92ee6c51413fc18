// BoundedRing<T>: a fixed-capacity multi-producer multi-consumer queue (Dmitry Vyukov's
// bounded MPMC design: one sequence number per cell, no locks, no allocation after
// construction). `PushDropOldest` never waits: when the ring is full it discards the oldest
// element and counts it, which is what a collector on a training thread needs.
//
// Thread-safe: any number of producers and consumers. T must be trivially copyable.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <type_traits>

namespace rankwatch {

template <typename T>
class BoundedRing {
  static_assert(std::is_trivially_copyable_v<T>, "BoundedRing holds plain data only");

 public:
  // `capacity` is rounded up to a power of two (at least 2).
  explicit BoundedRing(size_t capacity) {
    size_t c = 2;
    while (c < capacity) c <<= 1;
    mask_ = c - 1;
    cells_ = std::make_unique<Cell[]>(c);
    for (size_t i = 0; i < c; ++i) cells_[i].seq.store(i, std::memory_order_relaxed);
  }
  BoundedRing(const BoundedRing&) = delete;
  BoundedRing& operator=(const BoundedRing&) = delete;

  size_t capacity() const { return mask_ + 1; }

  // Appends `value`; false when the ring is full (nothing changes then).
  bool TryPush(const T& value) {
    size_t pos = tail_.load(std::memory_order_relaxed);
    while (true) {
      Cell& cell = cells_[pos & mask_];
      const size_t seq = cell.seq.load(std::memory_order_acquire);
      const intptr_t diff = static_cast<intptr_t>(seq) - static_cast<intptr_t>(pos);
      if (diff == 0) {
        if (tail_.compare_exchange_weak(pos, pos + 1, std::memory_order_relaxed)) {
          cell.value = value;
          cell.seq.store(pos + 1, std::memory_order_release);
          return true;
        }
      } else if (diff < 0) {
        return false;
      } else {
        pos = tail_.load(std::memory_order_relaxed);
      }
    }
  }

  // Removes the oldest element into `*out`; false when the ring is empty.
  bool TryPop(T* out) {
    size_t pos = head_.load(std::memory_order_relaxed);
    while (true) {
      Cell& cell = cells_[pos & mask_];
      const size_t seq = cell.seq.load(std::memory_order_acquire);
      const intptr_t diff = static_cast<intptr_t>(seq) - static_cast<intptr_t>(pos + 1);
      if (diff == 0) {
        if (head_.compare_exchange_weak(pos, pos + 1, std::memory_order_relaxed)) {
          *out = cell.value;
          cell.seq.store(pos + mask_ + 1, std::memory_order_release);
          return true;
        }
      } else if (diff < 0) {
        return false;
      } else {
        pos = head_.load(std::memory_order_relaxed);
      }
    }
  }

  // Appends `value`, discarding the oldest elements while the ring is full. Never blocks.
  // Returns how many elements were discarded (also added to dropped()).
  uint64_t PushDropOldest(const T& value) {
    uint64_t dropped = 0;
    while (!TryPush(value)) {
      T discarded;
      if (TryPop(&discarded)) ++dropped;
    }
    if (dropped > 0) dropped_.fetch_add(dropped, std::memory_order_relaxed);
    return dropped;
  }

  // Elements discarded by PushDropOldest since construction.
  uint64_t dropped() const { return dropped_.load(std::memory_order_relaxed); }

  // Approximate number of elements queued (exact when no operation is in flight).
  size_t size() const {
    const size_t t = tail_.load(std::memory_order_acquire);
    const size_t h = head_.load(std::memory_order_acquire);
    return t >= h ? t - h : 0;
  }

 private:
  struct Cell {
    std::atomic<size_t> seq{0};
    T value{};
  };
  std::unique_ptr<Cell[]> cells_;
  size_t mask_ = 0;
  alignas(64) std::atomic<size_t> tail_{0};
  alignas(64) std::atomic<size_t> head_{0};
  alignas(64) std::atomic<uint64_t> dropped_{0};
};

}  // namespace rankwatch
