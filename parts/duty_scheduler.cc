#include "parts/duty_scheduler.h"

#include <algorithm>
#include <utility>

namespace rankwatch {

DutyScheduler::Id DutyScheduler::Schedule(std::string name, Duration period, Duty duty,
                                          Duration delay) {
  duties_.push_back({std::move(name), period, std::move(duty), clock_() + delay});
  return duties_.size() - 1;
}

void DutyScheduler::Hurry(Id id) { duties_[id].due = TimePoint::min(); }

size_t DutyScheduler::RunDue() {
  size_t ran = 0;
  for (Entry& d : duties_) {
    const TimePoint now = clock_();
    if (now < d.due) continue;
    d.due = now + d.period;
    d.duty(now);
    ++ran;
  }
  return ran;
}

TimePoint DutyScheduler::next_due() const {
  TimePoint next = TimePoint::max();
  for (const Entry& d : duties_) next = std::min(next, d.due);
  return next;
}

}  // namespace rankwatch
