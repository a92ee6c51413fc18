// WallNowUnixNs: the wall clock (the system clock, CLOCK_REALTIME) in nanoseconds since the Unix
// epoch — the one place both programs and the collector library read it. It stamps what leaves
// the process (batches, control requests, alerts) and gives "now" where time enters: main
// loops, query and RPC handlers, commands. Operators never read it: they are handed the time.
//
// Thread-safe.
#pragma once

#include <chrono>
#include <cstdint>

namespace rankwatch {

inline int64_t WallNowUnixNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace rankwatch
