#include "collectors/lib/process_memory.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

namespace rankwatch {
namespace {

constexpr size_t kBytes = 64u << 20;

// These tests measure when freed memory leaves the resident set. AddressSanitizer keeps freed
// blocks in its quarantine (256 MiB by default) to catch uses after free, so under ASan a
// freed 64 MiB block stays resident and the process's peaks are not what the code sees in a
// normal build: the residency assertions are skipped there (the code still runs).
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kFreedMemoryStaysResident = true;
#else
constexpr bool kFreedMemoryStaysResident = false;
#endif
// ThreadSanitizer backs every byte the test touches with shadow memory of its own, resident
// too, so the process's peaks are not the test's; and its memset interceptor updates that
// shadow byte by byte (touching 512 MiB took minutes). These tests are single-threaded: under
// TSan only the capacity tests below run.
#if defined(__SANITIZE_THREAD__)
constexpr bool kShadowMemory = true;
#else
constexpr bool kShadowMemory = false;
#endif

void TouchAndFree(size_t bytes) {
  auto block = std::make_unique<char[]>(bytes);
  std::memset(block.get(), 1, bytes);  // touch every page
  asm volatile("" : : "r"(block.get()) : "memory");
}

TEST(ProcessPeakMemoryTest, SeesATemporaryAllocationAndForgetsItAfterReset) {
  if (kShadowMemory) GTEST_SKIP() << "TSan's shadow memory is resident too";
  ProcessPeakMemory peak;
  const uint64_t before = peak.TakePeakBytes();
  ASSERT_GT(before, 0u);
  TouchAndFree(kBytes);
  const uint64_t during = peak.TakePeakBytes();
  EXPECT_GE(during, before + kBytes * 9 / 10);
  if (!peak.resets()) GTEST_SKIP() << "clear_refs not permitted here: lifetime peaks only";
  if (kFreedMemoryStaysResident) GTEST_SKIP() << "ASan's quarantine keeps freed memory resident";
  EXPECT_LT(peak.TakePeakBytes(), during - kBytes / 2);
}

TEST(ProcessPeakMemoryTest, EveryCallSeesItsOwnPeakMostlyFromGetrusage) {
  if (kShadowMemory) GTEST_SKIP() << "TSan's shadow memory is resident too";
  ProcessPeakMemory peak;
  if (!peak.resets()) GTEST_SKIP() << "clear_refs not permitted here: lifetime peaks only";
  peak.TakePeakBytes();
  const uint64_t status_reads_before = peak.status_reads();
  constexpr int kRounds = 32;
  for (int i = 0; i < kRounds; ++i) {
    const uint64_t quiet = peak.TakePeakBytes();
    TouchAndFree(kBytes);
    const uint64_t busy = peak.TakePeakBytes();
    EXPECT_GE(busy, quiet + kBytes * 9 / 10) << "round " << i;
  }
  // Every busy call reads above the resident size at its reset: getrusage, not the file.
  EXPECT_LE(peak.status_reads() - status_reads_before, static_cast<uint64_t>(kRounds));
}

constexpr size_t kParentBytes = 512u << 20;

// Child side of the next test: run as this binary with RANKWATCH_PEAK_CHILD=1. One step
// peaks above its parent's size (above the exec floor), the quiet steps after it do not;
// prints the first peak, the largest quiet peak, the number of calls and of status reads.
TEST(ProcessPeakMemoryChild, PrintPeaks) {
  if (std::getenv("RANKWATCH_PEAK_CHILD") == nullptr) GTEST_SKIP() << "child side only";
  ProcessPeakMemory peak;
  TouchAndFree(kParentBytes + kBytes);
  const uint64_t first = peak.TakePeakBytes();
  uint64_t quiet = 0;
  constexpr int kCalls = 48;
  for (int i = 1; i < kCalls; ++i) quiet = std::max(quiet, peak.TakePeakBytes());
  std::printf("RANKWATCH_PEAK %llu %llu %d %llu\n", static_cast<unsigned long long>(first),
              static_cast<unsigned long long>(quiet), kCalls,
              static_cast<unsigned long long>(peak.status_reads()));
}

// exec folds the pre-exec image's peak into getrusage's ru_maxrss: a process started by a
// big one must still report its own peaks, above that floor and below it.
TEST(ProcessPeakMemoryTest, AChildOfABigParentReportsItsOwnPeaks) {
  if (kShadowMemory) GTEST_SKIP() << "TSan's shadow memory is resident too";
  auto block = std::make_unique<char[]>(kParentBytes);
  std::memset(block.get(), 1, kParentBytes);
  int out[2];
  ASSERT_EQ(pipe(out), 0);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    dup2(out[1], STDOUT_FILENO);
    setenv("RANKWATCH_PEAK_CHILD", "1", 1);
    execl("/proc/self/exe", "process_memory_test", "--gtest_filter=ProcessPeakMemoryChild.*",
          static_cast<char*>(nullptr));
    _exit(127);
  }
  close(out[1]);
  std::string text;
  char buf[4096];
  for (ssize_t n; (n = read(out[0], buf, sizeof(buf))) > 0;) text.append(buf, n);
  close(out[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  asm volatile("" : : "r"(block.get()) : "memory");
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << text;
  const size_t at = text.find("RANKWATCH_PEAK ");
  ASSERT_NE(at, std::string::npos) << text;
  unsigned long long first = 0, quiet = 0, status_reads = 0;
  int calls = 0;
  ASSERT_EQ(std::sscanf(text.c_str() + at, "RANKWATCH_PEAK %llu %llu %d %llu", &first, &quiet,
                        &calls, &status_reads),
            4);
  if (first == 0) GTEST_SKIP() << "no peaks readable in the child";
  EXPECT_GE(first, kParentBytes + kBytes * 9 / 10);
  EXPECT_GT(quiet, 0u);
  EXPECT_LT(quiet, kParentBytes / 4) << "a quiet step reported its parent's peak";
  // The big step read above the floor (getrusage); under it every quiet call read the file.
  // (Under ASan the quarantine holds the freed step resident, and one more call reads the file.)
  if (!kFreedMemoryStaysResident) {
    EXPECT_EQ(status_reads, static_cast<unsigned long long>(calls - 1));
  }
}

TEST(ProcessMemoryCapacityTest, ParsesMemTotal) {
  EXPECT_EQ(ParseMemTotalBytes("MemTotal:       24683620 kB\nMemFree:         1000 kB\n"),
            24683620ull * 1024);
  EXPECT_EQ(ParseMemTotalBytes("MemFree: 5 kB\nMemTotal: 16 kB"), 16ull * 1024);
  EXPECT_EQ(ParseMemTotalBytes("MemFree: 5 kB\n"), 0u);
  EXPECT_EQ(ParseMemTotalBytes("MemTotal: lots kB\n"), 0u);
}

TEST(ProcessMemoryCapacityTest, ParsesCgroupLimits) {
  EXPECT_EQ(ParseCgroupMemoryLimit("8589934592\n"), 8589934592ull);
  EXPECT_EQ(ParseCgroupMemoryLimit("max\n"), std::nullopt);  // v2: no limit
  EXPECT_EQ(ParseCgroupMemoryLimit("9223372036854771712\n"), 9223372036854771712ull);  // v1 none
  EXPECT_EQ(ParseCgroupMemoryLimit(""), std::nullopt);
  EXPECT_EQ(ParseCgroupMemoryLimit("99999999999999999999999"), std::nullopt);  // overflows
}

TEST(ProcessMemoryCapacityTest, ParsesProcSelfCgroup) {
  // cgroup v2 only.
  ProcessCgroups c = ParseProcSelfCgroup("0::/kubepods.slice/pod-1/cri-abc\n");
  EXPECT_EQ(c.v2, "/kubepods.slice/pod-1/cri-abc");
  EXPECT_EQ(c.v1_memory, "");
  // A hybrid host (this build machine's kind): v1 controllers and an empty v2 hierarchy.
  c = ParseProcSelfCgroup(
      "9:name=systemd:/\n8:pids:/\n4:memory:/process_api/2292dd\n3:cpuset:/\n0::/\n");
  EXPECT_EQ(c.v2, "/");
  EXPECT_EQ(c.v1_memory, "/process_api/2292dd");
  c = ParseProcSelfCgroup("5:cpu,memory:/a:b\n");  // joint controllers; ':' in the path
  EXPECT_EQ(c.v1_memory, "/a:b");
}

TEST(ProcessMemoryCapacityTest, LimitFilesWalkUpToTheMountRoot) {
  const std::vector<std::string> files = CgroupMemoryLimitFiles({"/a/b", "/x"}, "/sys/fs/cgroup");
  const std::vector<std::string> expected = {"/sys/fs/cgroup/a/b/memory.max",
                                             "/sys/fs/cgroup/a/memory.max",
                                             "/sys/fs/cgroup/memory.max",
                                             "/sys/fs/cgroup/unified/a/b/memory.max",
                                             "/sys/fs/cgroup/unified/a/memory.max",
                                             "/sys/fs/cgroup/unified/memory.max",
                                             "/sys/fs/cgroup/memory/x/memory.limit_in_bytes",
                                             "/sys/fs/cgroup/memory/memory.limit_in_bytes"};
  EXPECT_EQ(files, expected);
}

// A fixture root: proc/meminfo, proc/self/cgroup and the given cgroup files.
class CapacityFixture {
 public:
  explicit CapacityFixture(const std::string& name)
      : root_(std::filesystem::temp_directory_path() /
              ("rw-capacity-" + name + "-" + std::to_string(getpid()))) {
    std::filesystem::remove_all(root_);
  }
  ~CapacityFixture() { std::filesystem::remove_all(root_); }
  CapacityFixture& File(const std::string& path, const std::string& contents) {
    const std::filesystem::path p = root_ / path;
    std::filesystem::create_directories(p.parent_path());
    std::ofstream(p) << contents;
    return *this;
  }
  uint64_t Capacity() const { return ProcessMemoryCapacityBytes(root_.string()); }

 private:
  std::filesystem::path root_;
};

TEST(ProcessMemoryCapacityTest, CgroupV2LimitElseMemTotal) {
  CapacityFixture f("v2");
  f.File("proc/meminfo", "MemTotal: 16777216 kB\n")  // 16 GiB
      .File("proc/self/cgroup", "0::/job/rank0\n")
      .File("sys/fs/cgroup/job/rank0/memory.max", "max\n");
  EXPECT_EQ(f.Capacity(), 16ull << 30);                    // "max" all the way up: MemTotal
  f.File("sys/fs/cgroup/job/memory.max", "4294967296\n");  // the parent's 4 GiB binds
  EXPECT_EQ(f.Capacity(), 4ull << 30);
  f.File("sys/fs/cgroup/job/rank0/memory.max", "2147483648\n");
  EXPECT_EQ(f.Capacity(), 2ull << 30);
}

TEST(ProcessMemoryCapacityTest, ContainerSeesItsLimitAtTheMountRoot) {
  // In a container without a cgroup namespace, /proc/self/cgroup names the host's path, which
  // does not exist under the container's mount; its own limit sits at the mount's root.
  CapacityFixture f("container");
  f.File("proc/meminfo", "MemTotal: 16777216 kB\n")
      .File("proc/self/cgroup", "0::/kubepods/pod-1/cri-abc\n")
      .File("sys/fs/cgroup/memory.max", "1073741824\n");
  EXPECT_EQ(f.Capacity(), 1ull << 30);
}

TEST(ProcessMemoryCapacityTest, CgroupV1LimitCappedAtMemTotal) {
  CapacityFixture f("v1");
  f.File("proc/meminfo", "MemTotal: 24683620 kB\n")
      .File("proc/self/cgroup", "4:memory:/process_api/2292dd\n0::/\n")
      .File("sys/fs/cgroup/memory/process_api/2292dd/memory.limit_in_bytes",
            "9223372036854771712\n")  // v1's "no limit"
      .File("sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n");
  EXPECT_EQ(f.Capacity(), 24683620ull * 1024);
  f.File("sys/fs/cgroup/memory/process_api/2292dd/memory.limit_in_bytes", "3221225472\n");
  EXPECT_EQ(f.Capacity(), 3ull << 30);
}

TEST(ProcessMemoryCapacityTest, NothingReadableIsZero) {
  CapacityFixture f("empty");
  f.File("proc/self/cgroup", "0::/\n");
  EXPECT_EQ(f.Capacity(), 0u);
}

TEST(ProcessMemoryCapacityTest, ThisProcessHasACapacity) {
  const uint64_t c = ProcessMemoryCapacityBytes();
  EXPECT_GT(c, 64ull << 20);
  EXPECT_EQ(ProcessPeakMemory().capacity_bytes(), c);
}

}  // namespace
}  // namespace rankwatch
