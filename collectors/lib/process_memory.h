// ProcessPeakMemory: the peak resident set size of this process per interval (a training
// step), the memory peak a collector reports when there is no device allocator to ask.
// Reads VmHWM from /proc/self/status and then resets it (writing "5" to
// /proc/self/clear_refs, Linux >= 4.0), so each call returns the peak since the previous
// call. Where the reset is not permitted, the peak is the process's lifetime peak
// (monotonic, still enough to show a creep).
//
// Not thread-safe: one owner (the training thread).
#pragma once

#include <cstdint>

namespace rankwatch {

class ProcessPeakMemory {
 public:
  ProcessPeakMemory();
  ~ProcessPeakMemory();
  ProcessPeakMemory(const ProcessPeakMemory&) = delete;
  ProcessPeakMemory& operator=(const ProcessPeakMemory&) = delete;

  // Peak RSS in bytes since the previous call (since start for the first); 0 when unreadable.
  uint64_t TakePeakBytes();
  // True when peaks are per interval (the reset works), false when they are lifetime peaks.
  bool resets() const { return resets_; }

 private:
  int status_fd_ = -1;
  int clear_refs_fd_ = -1;
  bool resets_ = false;
};

}  // namespace rankwatch
