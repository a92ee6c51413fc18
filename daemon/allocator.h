// The daemon's heap: the allocator's counts as metrics, and the upkeep that returns freed memory
// to the system. rankwatchd allocates with jemalloc where it is built with it (daemon/
// CMakeLists.txt, RANKWATCH_JEMALLOC): its settings (allocator.cc, `malloc_conf`) give it a
// background thread of its own that returns freed pages. Built without it, glibc's malloc keeps
// what a burst freed in its arenas, and StartHeapTrimmer returns it.
//
// HeapMetrics: not thread-safe; Sample() is called by one thread (the checkpoint writer's).
#pragma once

#include <chrono>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "metrics/prometheus_registry.h"

namespace rankwatch {

// Whether this build allocates with jemalloc.
bool HeapIsJemalloc();

// jemalloc's own counts, where rankwatchd is built with it: bytes the daemon has allocated;
// bytes in the pages that hold them (active: the excess over allocated is fragmentation);
// jemalloc's own metadata; and bytes in pages it keeps resident (active, metadata, and freed
// pages not yet returned). Without jemalloc the family is not registered.
class HeapMetrics {
 public:
  // Registers rankwatch_heap_bytes{kind} in `registry`, which must outlive this.
  explicit HeapMetrics(PrometheusRegistry* registry);

  // Reads the allocator's counts into the series (no-op without jemalloc).
  void Sample();

 private:
  std::vector<std::pair<std::string, MetricCell*>> cells_;  // jemalloc's stat, its series
};

// Without jemalloc: a thread that every `interval` returns the heap's free pages to the system
// (malloc_trim), off the ingest thread, so that the RSS does not stay at a burst's peak (a
// backlog after a broker outage, a churned job table); it stops when the returned thread is
// destroyed. With jemalloc, which does this itself, an empty (not joinable) std::jthread.
std::jthread StartHeapTrimmer(std::chrono::milliseconds interval = std::chrono::seconds(15));

}  // namespace rankwatch
