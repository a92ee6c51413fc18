#include "parts/duty_scheduler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace rankwatch {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

// A clock the test moves by hand.
struct FakeClock {
  TimePoint now{};
  std::function<TimePoint()> Reader() {
    return [this] { return now; };
  }
};

TEST(DutySchedulerTest, RunsEachDutyWhenItFallsDue) {
  FakeClock clock;
  DutyScheduler duties(clock.Reader());
  std::vector<std::string> ran;
  duties.Schedule("tick", milliseconds(20), [&](TimePoint) { ran.push_back("tick"); });
  duties.Schedule("second", seconds(1), [&](TimePoint) { ran.push_back("second"); });
  // Both are due at once, in the order they were scheduled.
  EXPECT_EQ(duties.RunDue(), 2u);
  EXPECT_EQ(ran, (std::vector<std::string>{"tick", "second"}));
  ran.clear();
  // Nothing is due before its period has passed.
  clock.now += milliseconds(19);
  EXPECT_EQ(duties.RunDue(), 0u);
  clock.now += milliseconds(1);
  EXPECT_EQ(duties.RunDue(), 1u);
  EXPECT_EQ(ran, std::vector<std::string>{"tick"});
  ran.clear();
  // Over a second, the tick runs once a pass however late the pass (no burst of missed
  // ticks), and the second once.
  for (int i = 0; i < 49; ++i) {
    clock.now += milliseconds(20);
    duties.RunDue();
  }
  EXPECT_EQ(std::count(ran.begin(), ran.end(), "tick"), 49);
  EXPECT_EQ(std::count(ran.begin(), ran.end(), "second"), 1);
  ran.clear();
  clock.now += seconds(5);  // a pass five seconds late
  EXPECT_EQ(duties.RunDue(), 2u);
  EXPECT_EQ(duties.RunDue(), 0u);
}

TEST(DutySchedulerTest, DutiesSeeTheClockReadJustBeforeThem) {
  FakeClock clock;
  DutyScheduler duties(clock.Reader());
  TimePoint after_saw{};
  bool slow = true;
  duties.Schedule("slow once", seconds(1), [&](TimePoint) {
    if (std::exchange(slow, false)) clock.now += milliseconds(300);
  });
  duties.Schedule("after", seconds(1), [&](TimePoint now) { after_saw = now; });
  duties.RunDue();
  EXPECT_EQ(after_saw, TimePoint{} + milliseconds(300));
  // Each period counts from the clock read before its own run: "after" is due at 1.3 s.
  clock.now = TimePoint{} + milliseconds(1000);
  EXPECT_EQ(duties.RunDue(), 1u);
  clock.now = TimePoint{} + milliseconds(1300);
  EXPECT_EQ(duties.RunDue(), 1u);
  EXPECT_EQ(after_saw, TimePoint{} + milliseconds(1300));
}

TEST(DutySchedulerTest, DelayAndPeriodZero) {
  FakeClock clock;
  DutyScheduler duties(clock.Reader());
  int checkpoints = 0, passes = 0;
  duties.Schedule(
      "checkpoint", seconds(1), [&](TimePoint) { ++checkpoints; }, seconds(1));
  duties.Schedule("every pass", Duration(0), [&](TimePoint) { ++passes; });
  EXPECT_EQ(duties.next_due(), TimePoint{});
  duties.RunDue();
  duties.RunDue();
  EXPECT_EQ(passes, 2);
  EXPECT_EQ(checkpoints, 0);
  EXPECT_EQ(duties.next_due(), TimePoint{});  // the every-pass duty is always due
  clock.now += seconds(1);
  duties.RunDue();
  EXPECT_EQ(checkpoints, 1);
}

TEST(DutySchedulerTest, HurryRunsADutyAtTheNextPass) {
  FakeClock clock;
  DutyScheduler duties(clock.Reader());
  int checkpoints = 0;
  bool backlog = false;
  DutyScheduler::Id checkpoint = 0;
  // A duty before the one it hurries: the hurried one runs in the same pass.
  duties.Schedule("pace", Duration(0), [&](TimePoint) {
    if (backlog) duties.Hurry(checkpoint);
  });
  checkpoint = duties.Schedule(
      "checkpoint", seconds(1), [&](TimePoint) { ++checkpoints; }, seconds(1));
  EXPECT_EQ(duties.name(checkpoint), "checkpoint");
  clock.now += milliseconds(100);
  duties.RunDue();
  EXPECT_EQ(checkpoints, 0);
  backlog = true;
  duties.RunDue();
  EXPECT_EQ(checkpoints, 1);
  backlog = false;
  // Its period starts again from the hurried run.
  clock.now += milliseconds(999);
  duties.RunDue();
  EXPECT_EQ(checkpoints, 1);
  clock.now += milliseconds(1);
  duties.RunDue();
  EXPECT_EQ(checkpoints, 2);
}

}  // namespace
}  // namespace rankwatch
