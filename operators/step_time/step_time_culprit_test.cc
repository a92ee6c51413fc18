#include "operators/step_time/culprit.h"

#include <gtest/gtest.h>

namespace rankwatch::step_time {
namespace {

constexpr int kDl = PhaseIndex(Phase::kDataloader);

// Stage 1 and 2 results by hand: 4 ranks; rank 1 fetches 10 ms longer, rank 2 computes 12 ms
// longer, rank 3's own time is 20 ms longer.
struct Stages {
  WindowSignals signals;
  OwnTimeSignals own_time;
  Stages() {
    signals.phase[kDl] = {0.005, 0.015, 0.005, 0.005};
    signals.evidence[kDl] = EvidenceOf(signals.phase[kDl]);
    own_time.compute = {0.045, 0.045, 0.057, 0.045};
    own_time.compute_evidence = EvidenceOf(own_time.compute);
    own_time.own = {0.050, 0.050, 0.050, 0.070};
    own_time.own_evidence = EvidenceOf(own_time.own);
  }
};

StragglerScores Hits(double input, double compute, double own) {
  StragglerScores x;
  x.burden = 0.050;
  x.onset_burden = 0.040;
  x.input.full = input;
  x.compute.full = compute;
  x.own.full = own;
  x.input_hit = input >= 0.1;
  x.compute_hit = compute >= 0.1;
  x.own_hit = own >= 0.1;
  return x;
}

TEST(ChooseCulpritTest, ComputeWinsATieWithInput) {
  const Stages st;
  const Culprit c = ChooseCulprit(Hits(0.24, 0.24, 0.4), st.signals, st.own_time);
  EXPECT_EQ(c.signal, CulpritSignal::kCompute);
  EXPECT_EQ(c.rank, 2u);
  EXPECT_FALSE(c.from_onset_window);
  EXPECT_DOUBLE_EQ(c.burden, 0.050);
  ASSERT_EQ(c.excess.size(), 4u);
  EXPECT_NEAR(c.excess[2], 0.012, 1e-12);
  EXPECT_NEAR(c.excess[0], 0.0, 1e-12);
}

TEST(ChooseCulpritTest, TheLargerOfInputAndComputeOtherwise) {
  const Stages st;
  const Culprit c = ChooseCulprit(Hits(0.2, 0.15, 0.4), st.signals, st.own_time);
  EXPECT_EQ(c.signal, CulpritSignal::kInput);
  EXPECT_EQ(c.rank, 1u);
  EXPECT_NEAR(c.excess[1], 0.010, 1e-12);
  EXPECT_EQ(ChooseCulprit(Hits(0.05, 0.15, 0.4), st.signals, st.own_time).signal,
            CulpritSignal::kCompute);
}

TEST(ChooseCulpritTest, OwnTimeWhenNeitherInputNorComputeReachesTheThreshold) {
  const Stages st;
  const Culprit c = ChooseCulprit(Hits(0.05, 0.09, 0.4), st.signals, st.own_time);
  EXPECT_EQ(c.signal, CulpritSignal::kOwn);
  EXPECT_EQ(c.rank, 3u);
  EXPECT_NEAR(c.excess[3], 0.020, 1e-12);
}

TEST(ChooseCulpritTest, TheNewestStepsWhenTheirScoreIsHigher) {
  const Stages st;
  StragglerScores x = Hits(0.2, 0, 0);
  x.input.onset = 0.3;
  x.input.onset_worst = {0, 0.012};
  x.onset.dl_excess = {0.012, 0.001, NAN, 0};
  const Culprit c = ChooseCulprit(x, st.signals, st.own_time);
  EXPECT_TRUE(c.from_onset_window);
  EXPECT_EQ(c.rank, 0u);
  EXPECT_DOUBLE_EQ(c.burden, 0.040);
  EXPECT_EQ(c.excess[1], 0.001);
  EXPECT_TRUE(std::isnan(c.excess[2]));
}

Culprit SlowRanks(uint32_t rank, std::vector<double> excess) {
  Culprit c;
  c.rank = rank;
  c.excess = std::move(excess);
  c.burden = 0.050;  // 5 ms is the 0.10 threshold
  return c;
}

const std::vector<std::string> kNodes = {"a", "a", "a", "a", "b", "b", "b", "b"};

TEST(ScopeOfTest, MostRanksOfTheCulpritsNodeNameTheNode) {
  const CulpritSet set =
      ScopeOf(SlowRanks(1, {0.006, 0.009, 0.005, 0, 0.008, 0, 0, 0}), kNodes, {});
  EXPECT_EQ(set.scope, CulpritScope::kNode);
  EXPECT_EQ(set.node, "a");
  EXPECT_EQ(set.ranks, (std::vector<uint32_t>{0, 1, 2}));  // not rank 4, on node b
}

TEST(ScopeOfTest, HalfTheNodesRanksAreEnough) {
  const CulpritSet set = ScopeOf(SlowRanks(5, {0, 0, 0, 0, 0, 0.01, 0.01, NAN}), kNodes, {});
  EXPECT_EQ(set.scope, CulpritScope::kNode);
  EXPECT_EQ(set.ranks, (std::vector<uint32_t>{5, 6}));
}

TEST(ScopeOfTest, OneRankAboveTheThresholdIsTheRank) {
  const CulpritSet set = ScopeOf(SlowRanks(1, {0.004, 0.009, 0.001, 0, 0, 0, 0, 0}), kNodes, {});
  EXPECT_EQ(set.scope, CulpritScope::kRank);
  EXPECT_EQ(set.ranks, std::vector<uint32_t>{1});
  EXPECT_EQ(set.node, "a");
}

TEST(ScopeOfTest, ANodeNeedsTwoRanksAboveTheThreshold) {
  // Half of node a's 2 ranks is the node fraction, but one rank is a rank.
  const CulpritSet set = ScopeOf(SlowRanks(0, {0.009, 0.001, 0, 0}), {"a", "a", "b", "b"}, {});
  EXPECT_EQ(set.scope, CulpritScope::kRank);
  EXPECT_EQ(set.ranks, std::vector<uint32_t>{0});
}

TEST(ScopeOfTest, AnUnknownNodeIsTheRank) {
  const Culprit c = SlowRanks(1, {0.009, 0.009, 0.009});
  const CulpritSet unnamed = ScopeOf(c, {"", "", ""}, {});
  EXPECT_EQ(unnamed.scope, CulpritScope::kRank);
  EXPECT_EQ(unnamed.ranks, std::vector<uint32_t>{1});
  EXPECT_EQ(unnamed.node, "");
  const CulpritSet unlisted = ScopeOf(c, {"a"}, {});
  EXPECT_EQ(unlisted.scope, CulpritScope::kRank);
  EXPECT_EQ(unlisted.node, "");
}

}  // namespace
}  // namespace rankwatch::step_time
