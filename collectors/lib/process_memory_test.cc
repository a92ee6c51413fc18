#include "collectors/lib/process_memory.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

namespace rankwatch {
namespace {

constexpr size_t kBytes = 64u << 20;

void TouchAndFree(size_t bytes) {
  auto block = std::make_unique<char[]>(bytes);
  std::memset(block.get(), 1, bytes);  // touch every page
  asm volatile("" : : "r"(block.get()) : "memory");
}

TEST(ProcessPeakMemoryTest, SeesATemporaryAllocationAndForgetsItAfterReset) {
  ProcessPeakMemory peak;
  const uint64_t before = peak.TakePeakBytes();
  ASSERT_GT(before, 0u);
  TouchAndFree(kBytes);
  const uint64_t during = peak.TakePeakBytes();
  EXPECT_GE(during, before + kBytes * 9 / 10);
  if (!peak.resets()) GTEST_SKIP() << "clear_refs not permitted here: lifetime peaks only";
  EXPECT_LT(peak.TakePeakBytes(), during - kBytes / 2);
}

TEST(ProcessPeakMemoryTest, EveryCallSeesItsOwnPeakMostlyFromGetrusage) {
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
  EXPECT_EQ(status_reads, static_cast<unsigned long long>(calls - 1));
}

}  // namespace
}  // namespace rankwatch
