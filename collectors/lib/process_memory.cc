#include "collectors/lib/process_memory.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

namespace rankwatch {
namespace {

std::optional<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

// Digits only, no overflow; nullopt otherwise.
std::optional<uint64_t> ParseUnsigned(std::string_view s) {
  if (s.empty() || s.size() > 20) return std::nullopt;
  uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    const uint64_t next = v * 10 + static_cast<uint64_t>(c - '0');
    if (next / 10 != v) return std::nullopt;
    v = next;
  }
  return v;
}

// getrusage's peak, KiB: max(the exec floor, the high-water mark). 0 when unreadable.
uint64_t RusagePeakKib() {
  struct rusage u;
  if (getrusage(RUSAGE_SELF, &u) != 0 || u.ru_maxrss <= 0) return 0;
  return static_cast<uint64_t>(u.ru_maxrss);
}

}  // namespace

uint64_t ParseMemTotalBytes(std::string_view meminfo) {
  for (size_t at = 0; at < meminfo.size();) {
    size_t end = meminfo.find('\n', at);
    if (end == std::string_view::npos) end = meminfo.size();
    std::string_view line = meminfo.substr(at, end - at);
    at = end + 1;
    if (line.substr(0, 9) != "MemTotal:") continue;
    line = Trim(line.substr(9));
    const size_t space = line.find(' ');
    const std::optional<uint64_t> v = ParseUnsigned(line.substr(0, space));
    if (!v) return 0;
    const std::string_view unit = space == std::string_view::npos ? "" : Trim(line.substr(space));
    return unit == "kB" ? *v * 1024 : *v;
  }
  return 0;
}

std::optional<uint64_t> ParseCgroupMemoryLimit(std::string_view contents) {
  return ParseUnsigned(Trim(contents));  // "max" and anything else: no limit
}

ProcessCgroups ParseProcSelfCgroup(std::string_view contents) {
  ProcessCgroups c;
  for (size_t at = 0; at < contents.size();) {
    size_t end = contents.find('\n', at);
    if (end == std::string_view::npos) end = contents.size();
    const std::string_view line = contents.substr(at, end - at);
    at = end + 1;
    // hierarchy-ID:controller-list:cgroup-path (the path may itself hold ':')
    const size_t a = line.find(':');
    const size_t b = a == std::string_view::npos ? a : line.find(':', a + 1);
    if (b == std::string_view::npos) continue;
    const std::string_view id = line.substr(0, a), controllers = line.substr(a + 1, b - a - 1);
    const std::string path(line.substr(b + 1));
    if (id == "0" && controllers.empty()) {
      c.v2 = path;
      continue;
    }
    for (size_t from = 0; from <= controllers.size();) {
      size_t comma = controllers.find(',', from);
      if (comma == std::string_view::npos) comma = controllers.size();
      if (controllers.substr(from, comma - from) == "memory") c.v1_memory = path;
      from = comma + 1;
    }
  }
  return c;
}

std::vector<std::string> CgroupMemoryLimitFiles(const ProcessCgroups& cgroups,
                                                const std::string& cgroup_root) {
  std::vector<std::string> files;
  // The path and each ancestor, deepest first, ending at the mount's root ("").
  auto walk = [&](const std::string& path, const std::string& mount, const char* file) {
    std::string p = path;
    while (!p.empty() && p.back() == '/') p.pop_back();
    while (true) {
      files.push_back(mount + p + "/" + file);
      if (p.empty()) break;
      const size_t slash = p.rfind('/');
      p = slash == std::string::npos ? "" : p.substr(0, slash);
    }
  };
  if (!cgroups.v2.empty()) {
    walk(cgroups.v2, cgroup_root, "memory.max");
    walk(cgroups.v2, cgroup_root + "/unified", "memory.max");
  }
  if (!cgroups.v1_memory.empty()) {
    walk(cgroups.v1_memory, cgroup_root + "/memory", "memory.limit_in_bytes");
  }
  return files;
}

uint64_t ProcessMemoryCapacityBytes(const std::string& root) {
  std::string base = root;
  if (base.empty() || base.back() != '/') base += '/';
  const uint64_t total = ParseMemTotalBytes(ReadFile(base + "proc/meminfo").value_or(""));
  uint64_t limit = UINT64_MAX;
  const ProcessCgroups cgroups =
      ParseProcSelfCgroup(ReadFile(base + "proc/self/cgroup").value_or(""));
  for (const std::string& file : CgroupMemoryLimitFiles(cgroups, base + "sys/fs/cgroup")) {
    const std::optional<std::string> contents = ReadFile(file);
    if (!contents) continue;
    if (const std::optional<uint64_t> v = ParseCgroupMemoryLimit(*contents); v && *v > 0) {
      limit = std::min(limit, *v);
    }
  }
  if (limit == UINT64_MAX) return total;  // no limit set (cgroup v1's "none" is ~2^63: capped)
  return total > 0 ? std::min(limit, total) : limit;
}

ProcessPeakMemory::ProcessPeakMemory() {
  capacity_bytes_ = ProcessMemoryCapacityBytes();
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
