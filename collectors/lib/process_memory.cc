#include "collectors/lib/process_memory.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace rankwatch {
namespace {

// getrusage's peak, KiB: max(the exec floor, the high-water mark). 0 when unreadable.
uint64_t RusagePeakKib() {
  struct rusage u;
  if (getrusage(RUSAGE_SELF, &u) != 0 || u.ru_maxrss <= 0) return 0;
  return static_cast<uint64_t>(u.ru_maxrss);
}

}  // namespace

ProcessPeakMemory::ProcessPeakMemory() {
  status_fd_ = open("/proc/self/status", O_RDONLY | O_CLOEXEC);
  clear_refs_fd_ = open("/proc/self/clear_refs", O_WRONLY | O_CLOEXEC);
  resets_ = clear_refs_fd_ >= 0 && pwrite(clear_refs_fd_, "5", 1, 0) == 1;
  NoteReset();
}

ProcessPeakMemory::~ProcessPeakMemory() {
  if (status_fd_ >= 0) close(status_fd_);
  if (clear_refs_fd_ >= 0) close(clear_refs_fd_);
}

uint64_t ProcessPeakMemory::StatusPeakKib() const {
  if (status_fd_ < 0) return 0;
  char buf[4096];
  const ssize_t n = pread(status_fd_, buf, sizeof(buf) - 1, 0);
  if (n <= 0) return 0;
  buf[n] = '\0';
  const char* line = std::strstr(buf, "VmHWM:");
  if (line == nullptr) return 0;
  return std::strtoull(line + 6, nullptr, 10);
}

void ProcessPeakMemory::NoteReset() {
  // Just after the reset the high-water mark is the resident size, so this reads
  // max(floor, resident size): above the floor whenever it is above any earlier such reading.
  after_reset_kib_ = resets_ ? RusagePeakKib() : 0;
  if (after_reset_kib_ != 0) floor_ceiling_kib_ = std::min(floor_ceiling_kib_, after_reset_kib_);
}

uint64_t ProcessPeakMemory::TakePeakBytes() {
  uint64_t kib = 0;
  if (after_reset_kib_ != 0) {
    // max(floor, peak), with peak >= the resident size at the reset. Above the reading just
    // after the reset, or equal to it while that reading stood above the floor: it is the peak.
    const uint64_t rusage_kib = RusagePeakKib();
    if (rusage_kib > after_reset_kib_ ||
        (rusage_kib == after_reset_kib_ && rusage_kib > floor_ceiling_kib_)) {
      kib = rusage_kib;
    }
  }
  if (kib == 0) {
    kib = StatusPeakKib();
    ++status_reads_;
  }
  if (resets_) resets_ = pwrite(clear_refs_fd_, "5", 1, 0) == 1;
  NoteReset();
  return kib * 1024;
}

}  // namespace rankwatch
