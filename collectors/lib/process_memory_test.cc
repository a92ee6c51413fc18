#include "collectors/lib/process_memory.h"

#include <gtest/gtest.h>

#include <cstring>
#include <memory>

namespace rankwatch {
namespace {

TEST(ProcessPeakMemoryTest, SeesATemporaryAllocationAndForgetsItAfterReset) {
  ProcessPeakMemory peak;
  const uint64_t before = peak.TakePeakBytes();
  ASSERT_GT(before, 0u);
  constexpr size_t kBytes = 64u << 20;
  {
    auto block = std::make_unique<char[]>(kBytes);
    std::memset(block.get(), 1, kBytes);  // touch every page
    asm volatile("" : : "r"(block.get()) : "memory");
  }
  const uint64_t during = peak.TakePeakBytes();
  EXPECT_GE(during, before + kBytes * 9 / 10);
  if (!peak.resets()) GTEST_SKIP() << "clear_refs not permitted here: lifetime peaks only";
  EXPECT_LT(peak.TakePeakBytes(), during - kBytes / 2);
}

}  // namespace
}  // namespace rankwatch
