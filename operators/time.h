// Time as the operators see it: a monotonic instant passed in by the caller. Operators never
// read a clock themselves, so replays and tests are exact.
#pragma once

#include <chrono>

namespace rankwatch {

using Clock = std::chrono::steady_clock;
using TimePoint = Clock::time_point;
using Duration = std::chrono::nanoseconds;

}  // namespace rankwatch
