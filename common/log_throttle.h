// LogThrottle: lets one report of a repeating event through per interval and counts the events it
// held back, so that a source that can repeat without bound (protobuf's complaints about a
// hostile producer's batches) cannot flood the log. The caller logs when Admit says so, with the
// count it returns.
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

  // At most one report per `interval`; the first event is always reported.
  explicit LogThrottle(std::chrono::steady_clock::duration interval) : interval_(interval) {}

  // Counts one event at `now`. When it is to be logged: the events since the last report, this
  // one included (>= 1). Else nullopt: the event is counted toward the next report.
  std::optional<uint64_t> Admit(TimePoint now);

 private:
  const std::chrono::steady_clock::duration interval_;
  std::mutex mu_;
  std::optional<TimePoint> reported_ ABSL_GUARDED_BY(mu_);  // the last report
  uint64_t since_ ABSL_GUARDED_BY(mu_) = 0;                 // events since it
};

}  // namespace rankwatch
