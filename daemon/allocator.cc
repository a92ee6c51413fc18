#include "daemon/allocator.h"

#include <malloc.h>

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <stop_token>

#ifdef RANKWATCH_JEMALLOC
#include <jemalloc/jemalloc.h>
// jemalloc's settings, read when it starts: a background thread of its own returns freed pages
// to the system, so the daemon's threads never do that work and an idle daemon gives back what a
// burst left. It returns them after 1 s unused instead of jemalloc's default 10 s: at 200,000
// records/s the soak's RSS was 196 MiB with 1 s against 240 MiB with 10 s, for ingest pauses a
// quarter longer (page faults when freed pages are taken again; benchmarks/README.md, the
// allocator A/B). MALLOC_CONF in the environment overrides this.
extern "C" {
const char* malloc_conf = "background_thread:true,dirty_decay_ms:1000";
}
#endif

namespace rankwatch {

bool HeapIsJemalloc() {
#ifdef RANKWATCH_JEMALLOC
  return true;
#else
  return false;
#endif
}

HeapMetrics::HeapMetrics([[maybe_unused]] PrometheusRegistry* registry) {
#ifdef RANKWATCH_JEMALLOC
  MetricFamily* heap = registry->Gauge(
      "rankwatch_heap_bytes",
      "The allocator's counts (builds with jemalloc): allocated (in use by the daemon), active "
      "(in the pages that hold it), metadata (jemalloc's own), resident (in pages it holds). "
      "Sampled after each checkpoint.",
      {"kind"});
  for (const char* kind : {"allocated", "active", "metadata", "resident"}) {
    cells_.push_back({std::string("stats.") + kind, heap->WithLabels({kind})});
  }
#endif
}

void HeapMetrics::Sample() {
#ifdef RANKWATCH_JEMALLOC
  uint64_t epoch = 1;
  size_t size = sizeof(epoch);
  mallctl("epoch", &epoch, &size, &epoch, size);  // refreshes the counts read below
  for (const auto& [name, cell] : cells_) {
    size_t value = 0;
    size = sizeof(value);
    if (mallctl(name.c_str(), &value, &size, nullptr, 0) == 0) {
      cell->Set(static_cast<double>(value));
    }
  }
#endif
}

std::jthread StartHeapTrimmer(std::chrono::milliseconds interval) {
  if (HeapIsJemalloc()) return std::jthread();
  return std::jthread([interval](std::stop_token stop) {
    std::mutex mu;
    std::condition_variable_any wake;
    std::unique_lock<std::mutex> lock(mu);
    while (true) {
      wake.wait_for(lock, stop, interval, [] { return false; });
      if (stop.stop_requested()) return;
      malloc_trim(0);
    }
  });
}

}  // namespace rankwatch
