#include "daemon/allocator.h"

#include <gtest/gtest.h>

#include <chrono>
#include <memory>

namespace rankwatch {
namespace {

TEST(AllocatorTest, HeapMetricsAreJemallocsCountsWhereItIsTheAllocator) {
  PrometheusRegistry registry;
  HeapMetrics heap(&registry);
  auto held = std::make_unique<char[]>(8 << 20);  // 8 MiB in use while sampled
  held[0] = 1;
  heap.Sample();
  const std::string text = registry.Render();
  if (!HeapIsJemalloc()) {
    EXPECT_EQ(text.find("rankwatch_heap_bytes"), std::string::npos) << text;
    return;
  }
  auto value = [&text](const std::string& kind) {
    const std::string series = "rankwatch_heap_bytes{kind=\"" + kind + "\"} ";
    const size_t at = text.find(series);
    return at == std::string::npos ? -1.0 : std::stod(text.substr(at + series.size()));
  };
  for (const char* kind : {"allocated", "active", "metadata", "resident"}) {
    EXPECT_GT(value(kind), 0) << kind << "\n" << text;
  }
  EXPECT_GE(value("allocated"), 8 << 20);
  EXPECT_GE(value("active"), value("allocated"));
}

TEST(AllocatorTest, TheTrimmerStopsAtOnceWhenDestroyed) {
  const auto start = std::chrono::steady_clock::now();
  {
    std::jthread trimmer = StartHeapTrimmer(std::chrono::hours(1));
    EXPECT_EQ(trimmer.joinable(), !HeapIsJemalloc());
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

}  // namespace
}  // namespace rankwatch
