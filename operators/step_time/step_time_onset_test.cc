// A straggler's onset held across evaluations (operators/step_time/onset.h).
#include "operators/step_time/onset.h"

#include <gtest/gtest.h>

#include <vector>

namespace rankwatch::step_time {
namespace {

// Steps first..first+n-1 with value `low` before `change` and `high` from it on.
void Series(uint64_t first, uint64_t n, uint64_t change, double low, double high,
            std::vector<uint64_t>* steps, std::vector<double>* values) {
  steps->clear();
  values->clear();
  for (uint64_t s = first; s < first + n; ++s) {
    steps->push_back(s);
    values->push_back((s >= change ? high : low) + 0.001 * static_cast<double>(s % 3));
  }
}

TEST(StepChangeOnsetTest, FindsTheStepWhereTheValuesSteppedUp) {
  std::vector<uint64_t> steps;
  std::vector<double> values;
  Series(100, 64, 140, 0.0, 0.3, &steps, &values);
  EXPECT_EQ(StepChangeOnset(steps, values), (Onset{140, true}));
  // A level through the whole window: since its first step, or earlier.
  Series(100, 64, 0, 0.0, 0.3, &steps, &values);
  EXPECT_EQ(StepChangeOnset(steps, values), (Onset{100, false}));
  // A fall is no onset.
  Series(100, 64, 140, 0.3, 0.0, &steps, &values);
  EXPECT_EQ(StepChangeOnset(steps, values), (Onset{100, false}));
  // Too short to tell.
  Series(100, 6, 103, 0.0, 0.3, &steps, &values);
  EXPECT_EQ(StepChangeOnset(steps, values), (Onset{100, false}));
  EXPECT_EQ(StepChangeOnset({}, {}), (Onset{}));
}

TEST(OnsetHoldTest, KeepsTheOnsetOnceItLeftTheWindow) {
  OnsetHold hold;
  // Windows of 64 steps sliding one step at a time over a straggler that began at step 40.
  EXPECT_EQ(hold.Apply("rank:3", {40, true}, 0, 63), (Onset{40, true}));
  EXPECT_EQ(hold.Apply("rank:3", {40, true}, 1, 64), (Onset{40, true}));
  // The onset is at the window's edge, then outside: the window says "since its first step".
  EXPECT_EQ(hold.Apply("rank:3", {39, false}, 39, 102), (Onset{40, true}));
  EXPECT_EQ(hold.Apply("rank:3", {41, false}, 41, 104), (Onset{40, true}));
  // A backlog caught up in one evaluation: steps went by unseen, nothing said it ended.
  EXPECT_EQ(hold.Apply("rank:3", {500, false}, 500, 563), (Onset{40, true}));
  // An evaluation named nobody, and the next that names it does not reach back: a new episode.
  hold.Absent();
  EXPECT_EQ(hold.Apply("rank:3", {700, false}, 700, 763), (Onset{700, false}));
}

TEST(OnsetHoldTest, AnOnsetTheWindowShowsReplacesTheHeldOne) {
  OnsetHold hold;
  hold.Apply("rank:3", {40, true}, 0, 63);
  hold.Apply("rank:3", {60, false}, 60, 123);
  EXPECT_EQ(hold.Apply("rank:3", {150, true}, 100, 163), (Onset{150, true}));
}

TEST(OnsetHoldTest, AnotherCulpritStartsAgain) {
  OnsetHold hold;
  hold.Apply("rank:3", {40, true}, 0, 63);
  hold.Apply("rank:3", {60, false}, 60, 123);
  EXPECT_EQ(hold.Apply("rank:5", {71, false}, 71, 134), (Onset{71, false}));
  // A whole-window onset is held at the first window's first step ("or earlier").
  EXPECT_EQ(hold.Apply("rank:5", {80, false}, 80, 143), (Onset{71, false}));
}

TEST(OnsetHoldTest, AnEvaluationWithoutTheCulpritDoesNotEndItsEpisodeWhileWindowsOverlap) {
  OnsetHold hold;
  hold.Apply("rank:3", {40, true}, 0, 63);
  // An evaluation in between named nobody (noise); the next one overlaps the last that named it.
  hold.Absent();
  EXPECT_EQ(hold.Apply("rank:3", {50, false}, 50, 113), (Onset{40, true}));
}

TEST(OnsetHoldTest, SurvivesExportAndImport) {
  OnsetHold hold;
  hold.Apply("whatif:slow_worker", {40, true}, 0, 63);
  hold.Absent();
  state::v1::OnsetState stored;
  hold.Export(&stored);
  OnsetHold restored;
  restored.Import(stored);
  EXPECT_EQ(restored.Apply("whatif:slow_worker", {60, false}, 60, 123), (Onset{40, true}));
  EXPECT_EQ(hold.Apply("whatif:slow_worker", {60, false}, 60, 123), (Onset{40, true}));
  // The absence survives too.
  OnsetHold again;
  again.Import(stored);
  EXPECT_EQ(again.Apply("whatif:slow_worker", {90, false}, 90, 153), (Onset{90, false}));
}

}  // namespace
}  // namespace rankwatch::step_time
