// ProcessPeakMemory: the peak resident set size of this process per interval (a training
// step), the memory peak a collector reports when there is no device allocator to ask.
// Each call returns the peak since the previous call, then resets the kernel's high-water
// mark (writing "5" to /proc/self/clear_refs, Linux >= 4.0). Where the reset is not
// permitted, the peak is the process's lifetime peak (monotonic, still enough to show a
// creep).
//
// Where the peak is read: VmHWM in /proc/self/status is exact but costs 3-16 us (the kernel
// formats the whole file; the upper figure measured inside a PyTorch training step).
// getrusage's ru_maxrss costs under 1 us and is the same high-water mark, except that it
// never reads below a floor: exec folds the pre-exec image's peak into it (a process started
// by fork and exec from a parent holding 400 MB reports >= 400 MB for life). So getrusage is
// also read just after each reset, when the high-water mark equals the resident size, giving
// max(floor, resident size). The next call's getrusage is the peak when it reads above that,
// or equal to it while it stood above the floor (the floor is at most the smallest such
// reading); otherwise the floor may hide the peak and VmHWM is read. Exact either way.
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
  // Calls that had to read /proc/self/status (the rest took getrusage's reading).
  uint64_t status_reads() const { return status_reads_; }

 private:
  uint64_t StatusPeakKib() const;  // VmHWM; 0 when unreadable
  void NoteReset();

  int status_fd_ = -1;
  int clear_refs_fd_ = -1;
  bool resets_ = false;
  uint64_t after_reset_kib_ = 0;             // getrusage just after the last reset; 0: none
  uint64_t floor_ceiling_kib_ = UINT64_MAX;  // the floor is at most this
  uint64_t status_reads_ = 0;
};

}  // namespace rankwatch
