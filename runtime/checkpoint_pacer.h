// CheckpointPacer: when a checkpoint is due before its interval. Changes wait in memory for the
// next checkpoint: reading a backlog at a million records a second, a second of them took ~280
// MiB of heap. While the daemon reads a backlog — the consumer woke its fetcher (its queue full)
// within the last `backlog_for` — a checkpoint is also due once `input_bytes` of telemetry were
// read since the last one. A daemon keeping up checkpoints on the interval only.
//
// Not thread-safe: the ingest thread's. Time comes in as arguments.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>

#include "operators/time.h"

namespace rankwatch {

class CheckpointPacer {
 public:
  explicit CheckpointPacer(size_t input_bytes, Duration backlog_for = std::chrono::seconds(2))
      : input_bytes_(input_bytes), backlog_for_(backlog_for) {}

  // `bytes` of telemetry were read.
  void Read(size_t bytes) { input_ += bytes; }
  // Whether a checkpoint is due at `now`, the consumer having woken its fetcher `fetch_wakeups`
  // times so far. Call it every pass (it notes when the count moves).
  bool Due(uint64_t fetch_wakeups, TimePoint now) {
    if (fetch_wakeups != wakeups_seen_) {
      wakeups_seen_ = fetch_wakeups;
      last_wakeup_ = now;
    }
    const bool backlog = wakeups_seen_ > 0 && now - last_wakeup_ < backlog_for_;
    return backlog && input_ >= input_bytes_;
  }
  // A checkpoint was taken: the input counts from 0 again.
  void Checkpointed() { input_ = 0; }

 private:
  const size_t input_bytes_;
  const Duration backlog_for_;
  size_t input_ = 0;
  uint64_t wakeups_seen_ = 0;
  TimePoint last_wakeup_{};
};

}  // namespace rankwatch
