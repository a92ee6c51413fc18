#include "collectors/lib/process_memory.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

namespace rankwatch {

ProcessPeakMemory::ProcessPeakMemory() {
  status_fd_ = open("/proc/self/status", O_RDONLY | O_CLOEXEC);
  clear_refs_fd_ = open("/proc/self/clear_refs", O_WRONLY | O_CLOEXEC);
  resets_ = clear_refs_fd_ >= 0 && pwrite(clear_refs_fd_, "5", 1, 0) == 1;
}

ProcessPeakMemory::~ProcessPeakMemory() {
  if (status_fd_ >= 0) close(status_fd_);
  if (clear_refs_fd_ >= 0) close(clear_refs_fd_);
}

uint64_t ProcessPeakMemory::TakePeakBytes() {
  if (status_fd_ < 0) return 0;
  char buf[4096];
  const ssize_t n = pread(status_fd_, buf, sizeof(buf) - 1, 0);
  if (n <= 0) return 0;
  buf[n] = '\0';
  const char* line = std::strstr(buf, "VmHWM:");
  if (line == nullptr) return 0;
  const uint64_t kib = std::strtoull(line + 6, nullptr, 10);
  if (resets_) resets_ = pwrite(clear_refs_fd_, "5", 1, 0) == 1;
  return kib * 1024;
}

}  // namespace rankwatch
