// LogThrottle: lets one report of a repeating event through per interval and counts the events it
// held back, so that a source that can repeat without bound (protobuf's complaints about a
// hostile producer's batches, rejected telemetry, a full job table) cannot flood the log. The
// caller logs when Admit says so, with the count it returns. The one throttle of log lines:
// nothing else times its own.
//
// Thread-safe: Admit may be called from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <optional>

#include "absl/base/thread_annotations.h"

namespace rankwatch {

class LogThrottle {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;

  // At most one report per `interval` (default: one minute); the first Admit always reports.
  explicit LogThrottle(std::chrono::steady_clock::duration interval = std::chrono::minutes(1))
      : interval_(interval) {}

  // Counts `events` events at `now` (0: none, only asking whether a report is due). When it is to
  // be logged: the events since the last report, these included. Else nullopt: they are counted
  // toward the next report.
  std::optional<uint64_t> Admit(TimePoint now, uint64_t events = 1);

 private:
  const std::chrono::steady_clock::duration interval_;
  std::mutex mu_;
  std::optional<TimePoint> reported_ ABSL_GUARDED_BY(mu_);  // the last report
  uint64_t since_ ABSL_GUARDED_BY(mu_) = 0;                 // events since it
};

}  // namespace rankwatch
