#include "runtime/checkpoint_pacer.h"

#include <gtest/gtest.h>

namespace rankwatch {
namespace {

using std::chrono::milliseconds;

TEST(CheckpointPacerTest, EarlyOnlyWhileReadingABacklog) {
  CheckpointPacer pacer(1000);
  TimePoint now{};
  // Keeping up (the fetcher never woken): however much is read, the interval decides.
  pacer.Read(5000);
  EXPECT_FALSE(pacer.Due(0, now));
  // A backlog: the fetcher woke; due once the input reaches the budget.
  now += milliseconds(100);
  EXPECT_TRUE(pacer.Due(1, now));
  pacer.Checkpointed();
  pacer.Read(999);
  EXPECT_FALSE(pacer.Due(1, now + milliseconds(10)));
  pacer.Read(1);
  EXPECT_TRUE(pacer.Due(1, now + milliseconds(20)));
  // Two seconds after the last wake-up the backlog is over.
  EXPECT_FALSE(pacer.Due(1, now + milliseconds(2000)));
  EXPECT_TRUE(pacer.Due(2, now + milliseconds(2001)));
}

}  // namespace
}  // namespace rankwatch
