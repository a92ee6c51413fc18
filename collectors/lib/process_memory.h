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
// The capacity a CPU rank reports beside its peaks (ProcessMemoryCapacityBytes): the memory the
// process may use, so that rankwatchd can judge pressure and time to full on CPU ranks too.
//
// Not thread-safe: one owner (the training thread). The capacity functions are thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace rankwatch {

// The memory this process may use, bytes: the smallest cgroup memory limit on the path from its
// cgroup up to the root of the cgroup mount (cgroup v2 `memory.max`, where "max" means no limit;
// cgroup v1 `memory.limit_in_bytes`), capped at the host's MemTotal; MemTotal when no limit is
// set; 0 when neither can be read. Reads files under `root` ("/" in production; a fixture tree
// in the tests): proc/self/cgroup, proc/meminfo and sys/fs/cgroup/... (v2 at sys/fs/cgroup or,
// on hybrid hosts, sys/fs/cgroup/unified; v1 at sys/fs/cgroup/memory).
uint64_t ProcessMemoryCapacityBytes(const std::string& root = "/");

// The parsers behind it, exposed for the tests.
// MemTotal of /proc/meminfo in bytes; 0 when absent.
uint64_t ParseMemTotalBytes(std::string_view meminfo);
// A cgroup limit file's value in bytes; nullopt for "max" (no limit) or anything unreadable.
std::optional<uint64_t> ParseCgroupMemoryLimit(std::string_view contents);
// The cgroup paths of /proc/self/cgroup: the v2 path (the "0::" line) and the v1 memory
// controller's (a line whose controller list holds "memory"); empty when absent.
struct ProcessCgroups {
  std::string v2;
  std::string v1_memory;
};
ProcessCgroups ParseProcSelfCgroup(std::string_view contents);
// The limit files to read for `cgroups` under the cgroup mount `cgroup_root` (e.g.
// "/sys/fs/cgroup"): the process's cgroup and each ancestor up to the mount's root, for v2 (and
// its hybrid mount "unified") and v1. A container whose cgroup is the mount's root sees its own
// limit at the top; one that sees the host's path finds it where it exists.
std::vector<std::string> CgroupMemoryLimitFiles(const ProcessCgroups& cgroups,
                                                const std::string& cgroup_root);

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
  // The process's memory capacity (ProcessMemoryCapacityBytes), read once at construction.
  uint64_t capacity_bytes() const { return capacity_bytes_; }

 private:
  uint64_t StatusPeakKib() const;  // VmHWM; 0 when unreadable
  void NoteReset();

  int status_fd_ = -1;
  int clear_refs_fd_ = -1;
  bool resets_ = false;
  uint64_t after_reset_kib_ = 0;             // getrusage just after the last reset; 0: none
  uint64_t floor_ceiling_kib_ = UINT64_MAX;  // the floor is at most this
  uint64_t status_reads_ = 0;
  uint64_t capacity_bytes_ = 0;
};

}  // namespace rankwatch
