#include "evidence/capture_ranks.h"

#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <vector>

namespace rankwatch {
namespace {

// A 5-rank job whose rank 4 is the culprit; ranks 0-3 compute 100, 120, 110 and 130 ms a step
// (forward + backward) over 10 steps.
JobSnapshot FiveRanks() {
  JobSnapshot s;
  s.training_job = "job";
  s.world_size = 5;
  s.step.culprit_ranks = {4};
  auto totals = std::make_shared<std::vector<StepWindow::RankTotals>>(5);
  const int64_t compute_ms[] = {100, 120, 110, 130, 200};
  for (uint32_t r = 0; r < 5; ++r) {
    StepWindow::RankTotals& t = (*totals)[r];
    t.sum_ns[static_cast<int>(Phase::kForward)] = 10 * compute_ms[r] / 2 * 1'000'000;
    t.count[static_cast<int>(Phase::kForward)] = 10;
    t.sum_ns[static_cast<int>(Phase::kBackward)] = 10 * compute_ms[r] / 2 * 1'000'000;
    t.count[static_cast<int>(Phase::kBackward)] = 10;
    t.sum_ns[static_cast<int>(Phase::kStep)] = int64_t{10} * 300 * 1'000'000;
    t.count[static_cast<int>(Phase::kStep)] = 10;
  }
  s.rank_totals = std::move(totals);
  return s;
}

TEST(CaptureRanksTest, TheCulpritIsComparedWithTheMedianRankByCompute) {
  const JobSnapshot s = FiveRanks();
  const auto pair = CulpritAndReference(s);
  ASSERT_TRUE(pair.has_value());
  EXPECT_EQ(pair->first, 4u);
  EXPECT_EQ(pair->second, 1u);  // 100, 110, [120], 130 ms: rank 1
  EXPECT_NEAR(RankMeanSeconds(s, 1, Phase::kForward), 0.060, 1e-9);
  EXPECT_TRUE(std::isnan(RankMeanSeconds(s, 1, Phase::kOptimizer)));
  EXPECT_TRUE(std::isnan(RankMeanSeconds(s, 9, Phase::kStep)));

  v1::RequestCaptureRequest request;  // no ranks: the culprit and a typical rank
  auto chosen = ChooseCaptureRanks(request, s);
  ASSERT_TRUE(chosen.ok()) << chosen.status();
  EXPECT_EQ(chosen->ranks, (std::vector<uint32_t>{4, 1}));
  EXPECT_EQ(chosen->culprit, 4);
  EXPECT_EQ(chosen->reference, 1);
}

TEST(CaptureRanksTest, WithoutFiguresAnyOtherRankIsTheReference) {
  JobSnapshot s;
  s.world_size = 3;
  s.step.culprit_ranks = {0};
  EXPECT_EQ(CulpritAndReference(s), std::make_pair(0u, 1u));
  s.world_size = 1;
  EXPECT_FALSE(CulpritAndReference(s).has_value());
}

TEST(CaptureRanksTest, NamedRanksAreTakenAsAskedAndNoCulpritIsAFailedPrecondition) {
  JobSnapshot s = FiveRanks();
  v1::RequestCaptureRequest request;
  request.add_ranks(2);
  request.add_ranks(0);
  auto alone = ChooseCaptureRanks(request, s);
  ASSERT_TRUE(alone.ok());
  EXPECT_EQ(alone->ranks, (std::vector<uint32_t>{2, 0}));
  EXPECT_EQ(alone->culprit, -1);
  EXPECT_EQ(alone->reference, -1);

  request.set_reference_rank(3);
  auto compared = ChooseCaptureRanks(request, s);
  ASSERT_TRUE(compared.ok());
  EXPECT_EQ(compared->ranks, (std::vector<uint32_t>{2, 0, 3}));
  EXPECT_EQ(compared->culprit, 2);
  EXPECT_EQ(compared->reference, 3);

  s.step.culprit_ranks.clear();
  auto none = ChooseCaptureRanks(v1::RequestCaptureRequest(), s);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(none.status().message(),
            "training job 'job' names no culprit rank now: say which ranks to capture");
  EXPECT_TRUE(ChooseCaptureRanks(request, s).ok());  // named ranks need no culprit
}

}  // namespace
}  // namespace rankwatch
