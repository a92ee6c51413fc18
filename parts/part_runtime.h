// PartRuntime: runs rankwatchd's parts (parts/daemon_part.h) — the list main() builds from the
// settings. It owns the parts, the context they plug into and what they plug: the duty scheduler
// main's loop runs (the runtime's own duties are scheduled there too), the tick hooks the job
// router calls, the services the servers read, the savers each checkpoint runs.
//
// Not thread-safe: built, started and stopped on the main thread; RunDue, Checkpoint and the
// hooks on the ingest thread (main's loop). Destroyed after everything that holds its hooks or
// services (the router, the servers).
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "parts/daemon_part.h"

namespace rankwatch {

class PartRuntime {
 public:
  // `clock` is the duties' (default: the steady clock).
  PartRuntime(std::vector<std::unique_ptr<DaemonPart>> parts, PartEnvironment environment,
              std::function<TimePoint()> clock = &Clock::now);
  ~PartRuntime();
  PartRuntime(const PartRuntime&) = delete;
  PartRuntime& operator=(const PartRuntime&) = delete;

  // Each part's Start, in order; the first error stops (and is returned).
  absl::Status Start();
  // Each part's Restored, in order; the first error stops.
  absl::Status Restored();
  // Every part's checkpoint savers, in the order they were registered (ingest thread).
  void Checkpoint();
  // Each part's Stop, in order, then their savers once more.
  void Stop();

  PartEnvironment& environment() { return environment_; }
  DutyScheduler& duties() { return duties_; }
  const PartServices& services() const { return services_; }
  // The tick hooks, in the order the parts registered them.
  const std::vector<TickHook*>& hooks() const { return context_.hooks(); }

 private:
  PartEnvironment environment_;
  DutyScheduler duties_;
  PartServices services_;
  PartContext context_;
  std::vector<std::unique_ptr<DaemonPart>> parts_;
};

}  // namespace rankwatch
