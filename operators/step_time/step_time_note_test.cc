#include "operators/step_time/note.h"

#include <gtest/gtest.h>

#include "operators/step_time/test_windows.h"

namespace rankwatch::step_time {
namespace {

using testing::Ms;
using testing::WindowOf;

TEST(RankListTest, ListsEightRanksThenCountsTheRest) {
  EXPECT_EQ(RankList({}), "");
  EXPECT_EQ(RankList({3, 5, 7}), "3,5,7");
  EXPECT_EQ(RankList({0, 1, 2, 3, 4, 5, 6, 7, 8, 9}), "0,1,2,3,4,5,6,7 and 2 more");
}

TEST(MissingTextTest, NamesEachPhaseWithItsCountAndTheRanksThatDoNotReportIt) {
  MissingSignal forward{.phase = Phase::kForward, .reporting = 0, .ranks = 4};
  MissingSignal optimizer{.phase = Phase::kOptimizer, .reporting = 2, .ranks = 20};
  optimizer.missing_ranks = {3, 4};
  EXPECT_EQ(MissingText({forward, optimizer}),
            "forward (0/4 ranks report it); optimizer (2/20 ranks report it; not ranks 3,4,...)");
}

// The stages up to the attribution of a slow-host rank: 4 DDP ranks with collective times,
// every step 75 ms; rank 2 spends 20 ms outside the phases, the others wait for it 20 ms longer
// in the allreduce.
struct SlowHost {
  StepWindow window = WindowOf(4, 20, [](uint64_t, uint32_t r) {
    const bool slow = r == 2;
    return Ms{.dl = 5,
              .fwd = 20,
              .bwd = slow ? 25.0 : 45.0,
              .opt = 5,
              .coll = slow ? 5.0 : 25.0,
              .step = 75};
  });
  WindowSignals signals = MeasureWindow(window);
  OwnTimeSignals own_time = ModelOwnTime(window, signals, {}, false);
  Culprit culprit{.signal = CulpritSignal::kOwn, .rank = 2};
  Attribution attribution = Attribute(culprit, {}, signals, own_time);
};

TEST(StragglerNoteTest, TimeOutsideThePhasesWithTheOthersWait) {
  const SlowHost h;
  EXPECT_EQ(StragglerNote(h.culprit, {.scope = CulpritScope::kRank, .ranks = {2}, .node = "n0"},
                          h.attribution, h.signals, h.own_time),
            "rank 2 on n0 spends 20.0 ms more per step outside the measured phases (not in "
            "dataloader, forward, backward or optimizer: host code between them, a custom "
            "autograd op after the model's output, or CPU contention); the other ranks wait "
            "20.0 ms a step longer than it in collectives");
}

TEST(StragglerNoteTest, APhaseAgainstTheMedianRankForANode) {
  const SlowHost h;
  Culprit c{.signal = CulpritSignal::kCompute, .rank = 0};
  Attribution a;
  a.cause = StragglerCause::kCompute;
  a.phase = {Phase::kForward, 0.010, 0.020};
  EXPECT_EQ(StragglerNote(c, {.scope = CulpritScope::kNode, .ranks = {0, 1}, .node = "n0"}, a,
                          h.signals, h.own_time),
            "node n0 (ranks 0,1) spends 50% more time in forward than the median rank (10.0 ms "
            "more per step)");
}

TEST(StragglerNoteTest, APhaseTheMedianRankSpendsNoTimeIn) {
  const SlowHost h;
  Culprit c{.signal = CulpritSignal::kInput, .rank = 2};
  Attribution a;
  a.cause = StragglerCause::kInput;
  a.phase = {Phase::kDataloader, 0.004, 0};
  EXPECT_EQ(
      StragglerNote(c, {.scope = CulpritScope::kRank, .ranks = {2}}, a, h.signals, h.own_time),
      "rank 2 spends 4.0 ms more per step in dataloader than the median rank, which spends "
      "none; the other ranks wait 20.0 ms a step longer than it in collectives");
}

TEST(StragglerNoteTest, GcPausesWithTheirCountOrWithout) {
  // Rank 2 pauses 60 ms in 2 collections every other step; ranks 0 and 1 5 ms in 1 every step,
  // rank 3 never. `counted`: whether the collector counts the collections.
  auto window = [](bool counted) {
    return WindowOf(4, 20, [counted](uint64_t s, uint32_t r) {
      Ms m{.dl = 5, .fwd = 20, .bwd = 45, .opt = 5, .coll = 25, .step = 75};
      m.gc = r == 2 ? (s % 2 == 0 ? 60 : 0) : r == 3 ? 0 : 5;
      const uint32_t n = r == 2 ? (s % 2 == 0 ? 2 : 0) : r == 3 ? 0 : 1;
      m.gc_count = counted ? n : 0;
      return m;
    });
  };
  const Culprit c{.signal = CulpritSignal::kOwn, .rank = 2};
  const CulpritSet set{.scope = CulpritScope::kRank, .ranks = {2}};
  Attribution a;
  a.cause = StragglerCause::kGc;
  a.parts.gc = 0.025;
  const StepWindow counted = window(true);
  const WindowSignals s = MeasureWindow(counted);
  EXPECT_EQ(StragglerNote(c, set, a, s, ModelOwnTime(counted, s, {}, false)),
            "rank 2 pauses 30.0 ms a step in garbage collection, 25.0 ms more than the median "
            "rank (1.0 collections a step of 30.0 ms each; the median rank 1.0)");
  const StepWindow uncounted = window(false);
  const WindowSignals u = MeasureWindow(uncounted);
  EXPECT_EQ(StragglerNote(c, set, a, u, ModelOwnTime(uncounted, u, {}, false)),
            "rank 2 pauses 30.0 ms a step in garbage collection, 25.0 ms more than the median "
            "rank");
}

TEST(StragglerNoteTest, AnUnattributedExcessSaysWhy) {
  SlowHost h;
  Attribution a;
  a.cause = StragglerCause::kNone;
  a.parts.own = 0.015;
  h.own_time.blocked.kind = BlockedModel::Kind::kSharded;
  const CulpritSet set{.scope = CulpritScope::kRank, .ranks = {2}};
  EXPECT_EQ(StragglerNote(h.culprit, set, a, h.signals, h.own_time),
            "rank 2's own time (step time less time blocked on other ranks) is 15.0 ms a step "
            "above the median rank's; where the excess sits is unknown (the job is sharded and "
            "reports no collective times)");
  h.own_time.blocked.kind = BlockedModel::Kind::kLeastBackward;
  h.signals.missing = {MissingSignal{.phase = Phase::kForward, .reporting = 0, .ranks = 4}};
  EXPECT_NE(StragglerNote(h.culprit, set, a, h.signals, h.own_time)
                .find("unknown (missing forward (0/4 ranks report it))"),
            std::string::npos);
}

}  // namespace
}  // namespace rankwatch::step_time
