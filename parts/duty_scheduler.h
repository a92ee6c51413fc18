// DutyScheduler: the periodic duties of rankwatchd's ingest thread — the runtime's tick, the
// checkpoints, each part's own (the fleet view's second) — run from main's loop as they fall
// due, as Kafka Streams runs a task's punctuators: main's loop times nothing itself, it polls
// the consumer and calls RunDue.
//
// A duty runs at most once a pass, in the order the duties were scheduled. Its next run is due
// `period` after the clock's reading just before it ran (a slow pass delays the duties after it,
// never bunches them up), or at once when it is hurried. A period of 0 runs it every pass.
//
// Not thread-safe: owned by the ingest thread. Time comes from the clock it is given (a fake one
// in tests), read before each duty.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "operators/time.h"

namespace rankwatch {

class DutyScheduler {
 public:
  using Duty = std::function<void(TimePoint now)>;
  using Id = size_t;

  // `clock` is read before each duty; default: the steady clock.
  explicit DutyScheduler(std::function<TimePoint()> clock = &Clock::now)
      : clock_(std::move(clock)) {}

  // Schedules `duty` every `period` (0: every pass), first due at the first pass after `delay`.
  // Returns its id (for Hurry).
  Id Schedule(std::string name, Duration period, Duty duty, Duration delay = Duration(0));

  // Makes duty `id` due at once: it runs at the next pass (later in this one when it comes after
  // the duty that hurries it), and its period starts again from there.
  void Hurry(Id id);

  // Runs every duty due, in order; returns how many ran.
  size_t RunDue();

  size_t size() const { return duties_.size(); }
  const std::string& name(Id id) const { return duties_[id].name; }
  // The earliest time a duty is due (TimePoint::max() with none).
  TimePoint next_due() const;

 private:
  struct Entry {
    std::string name;
    Duration period;
    Duty duty;
    TimePoint due;
  };
  std::function<TimePoint()> clock_;
  std::vector<Entry> duties_;
};

}  // namespace rankwatch
