#include "common/log_throttle.h"

#include <gtest/gtest.h>

namespace rankwatch {
namespace {

using std::chrono::seconds;

TEST(LogThrottleTest, ReportsTheFirstEventThenOncePerIntervalWithTheCountHeldBack) {
  LogThrottle throttle(seconds(60));
  const LogThrottle::TimePoint t0{seconds(1000)};
  EXPECT_EQ(throttle.Admit(t0), 1u);
  EXPECT_EQ(throttle.Admit(t0 + seconds(1)), std::nullopt);
  EXPECT_EQ(throttle.Admit(t0 + seconds(59)), std::nullopt);
  // The interval is counted from the last report: the two held back and this one.
  EXPECT_EQ(throttle.Admit(t0 + seconds(60)), 3u);
  EXPECT_EQ(throttle.Admit(t0 + seconds(61)), std::nullopt);
  EXPECT_EQ(throttle.Admit(t0 + seconds(300)), 2u);
}

TEST(LogThrottleTest, AnEventAtTheClocksEpochIsReportedToo) {
  // The old handler took a zero time point for "never reported".
  LogThrottle throttle(seconds(60));
  EXPECT_EQ(throttle.Admit(LogThrottle::TimePoint{}), 1u);
  EXPECT_EQ(throttle.Admit(LogThrottle::TimePoint{} + seconds(1)), std::nullopt);
}

TEST(LogThrottleTest, CountsSeveralEventsOrNoneAtATime) {
  LogThrottle throttle;  // one minute
  const LogThrottle::TimePoint t0{seconds(1000)};
  // The first call reports, even one that counts nothing: a report of other news is due.
  EXPECT_EQ(throttle.Admit(t0, 0), 0u);
  EXPECT_EQ(throttle.Admit(t0 + seconds(1), 3), std::nullopt);
  EXPECT_EQ(throttle.Admit(t0 + seconds(2), 0), std::nullopt);
  EXPECT_EQ(throttle.Admit(t0 + seconds(59), 2), std::nullopt);
  EXPECT_EQ(throttle.Admit(t0 + seconds(60), 0), 5u);
  EXPECT_EQ(throttle.Admit(t0 + seconds(120)), 1u);
}

}  // namespace
}  // namespace rankwatch
