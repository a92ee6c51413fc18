// The what-if inside a JobPipeline: the simulator's --parallel jobs (collectors/simulator/) as
// batches of each rank, with its layout, through JobPipeline::AddBatch, as the daemon feeds them;
// the snapshot's what-if verdict and the step diagnosis that follows it.
#include "operators/whatif/step_assembler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "collectors/simulator/fleet_model.h"
#include "operators/alert_tracker.h"
#include "operators/job_pipeline.h"

namespace rankwatch {
namespace {

constexpr uint32_t kDp = 2, kPp = 4, kTp = 2;

// Publishes `steps` steps of a DP 2 x PP 4 x TP 2 job with `fault` into a JobPipeline.
// `drop_ops_of`: ranks whose ops are cut from every record.
JobSnapshot RunJob(const std::string& fault, uint64_t steps = 40,
                   const std::vector<uint32_t>& drop_ops_of = {}) {
  FleetOptions o;
  o.parallel = PipelineSpec{.dp = kDp, .pp = kPp, .tp = kTp, .microbatches = 8};
  o.ranks = o.parallel->world_size();
  if (!fault.empty()) o.faults.push_back(*ParseFaultSpec(fault));
  EXPECT_TRUE(CheckFleetOptions(o).ok());
  FleetModel model(o);
  JobPipeline pipeline("job", o.ranks, {});
  std::vector<v1::StepRecord> records;
  std::vector<bool> reported;
  const TimePoint now{};
  for (uint64_t step = 0; step < steps; ++step) {
    model.Step(step, &records, &reported);
    for (uint32_t r = 0; r < o.ranks; ++r) {
      v1::Batch b;
      b.mutable_source()->set_training_job("job");
      b.mutable_source()->set_rank(r);
      b.mutable_source()->set_world_size(o.ranks);
      b.mutable_source()->set_node(model.NodeName(r));
      *b.mutable_source()->mutable_layout() = model.LayoutOf(r);
      *b.add_steps() = records[r];
      if (std::find(drop_ops_of.begin(), drop_ops_of.end(), r) != drop_ops_of.end()) {
        b.mutable_steps(0)->clear_ops();
      }
      pipeline.AddBatch(b, now);
    }
  }
  return pipeline.Snapshot(now);
}

// Megatron's order: rank = (stage x dp + data rank) x tp + tensor rank.
std::vector<uint32_t> RanksOf(uint32_t dp, uint32_t stage) {
  const uint32_t first = (stage * kDp + dp) * kTp;
  return {first, first + 1};
}

TEST(StepAssemblerTest, AStageImbalanceIsTheJobsStragglerVerdict) {
  const JobSnapshot s = RunJob("stage-imbalance:stage=3,factor=1.3");
  ASSERT_NE(s.whatif, nullptr);
  const whatif::WhatIfSnapshot& w = *s.whatif;
  EXPECT_EQ(w.layout, (whatif::Layout{.dp = kDp, .pp = kPp, .tp = kTp, .vpp = 1}));
  EXPECT_EQ(w.analysed_steps, 40u);
  EXPECT_EQ(w.skipped_steps, 0u) << w.last_error;
  EXPECT_EQ(w.verdict.verdict, whatif::Verdict::kStageImbalance) << w.verdict.note;
  EXPECT_EQ(w.verdict.stage, 3);
  EXPECT_GT(w.verdict.move_fraction, 0.05);
  std::vector<uint32_t> stage3 = RanksOf(0, 3);
  for (uint32_t r : RanksOf(1, 3)) stage3.push_back(r);
  std::sort(stage3.begin(), stage3.end());
  EXPECT_EQ(w.verdict.ranks, stage3);
  EXPECT_EQ(w.worker_ranks[3 * kDp + 1], RanksOf(1, 3));
  // The step diagnosis says what the what-if says, and one straggler alert names the stage.
  EXPECT_EQ(s.step.label, StepLabel::kStraggler);
  EXPECT_EQ(s.step.culprit_ranks, stage3);
  EXPECT_EQ(s.step.note.rfind("pipeline job, what-if stage_imbalance: ", 0), 0u) << s.step.note;
}

TEST(StepAssemblerTest, ASlowWorkerIsNamedByItsCoordinatesAndRanks) {
  const JobSnapshot s = RunJob("slow-worker:dp=1,pp=2,factor=1.3");
  ASSERT_NE(s.whatif, nullptr);
  const whatif::WhatIfVerdict& v = s.whatif->verdict;
  EXPECT_EQ(v.verdict, whatif::Verdict::kSlowWorker) << v.note;
  EXPECT_EQ(v.data_rank, 1);
  EXPECT_EQ(v.stage, 2);
  EXPECT_EQ(v.ranks, RanksOf(1, 2));
  EXPECT_GT(v.lost_rank_seconds, 0);
}

TEST(StepAssemblerTest, GcPausesOfATensorRankOtherThanZeroCount) {
  // Rank 11 is tensor rank 1 of worker (data rank 1, stage 2): only its record holds the pause.
  const JobSnapshot s = RunJob("gc:rank=11,every=4,ms=40");
  ASSERT_NE(s.whatif, nullptr);
  const whatif::WhatIfVerdict& v = s.whatif->verdict;
  EXPECT_EQ(v.verdict, whatif::Verdict::kGcPauses) << v.note;
  EXPECT_EQ(v.data_rank, 1);
  EXPECT_EQ(v.stage, 2);
}

TEST(StepAssemblerTest, ABalancedJobHasNoStraggler) {
  const JobSnapshot s = RunJob("");
  ASSERT_NE(s.whatif, nullptr);
  EXPECT_EQ(s.whatif->verdict.verdict, whatif::Verdict::kBalanced) << s.whatif->verdict.note;
  EXPECT_NE(s.step.label, StepLabel::kStraggler) << s.step.note;
  EXPECT_NE(s.step.label, StepLabel::kComputeStraggler) << s.step.note;
}

TEST(StepAssemblerTest, StepsWithoutEveryWorkersOpsAreSkippedWithTheReason) {
  // Rank 4 is tensor rank 0 of worker (data rank 0, stage 1): its tensor rank 1 still sends the
  // worker's ops, and represents it.
  const JobSnapshot one = RunJob("", 20, {4});
  ASSERT_NE(one.whatif, nullptr);
  EXPECT_EQ(one.whatif->analysed_steps, 20u) << one.whatif->last_error;
  EXPECT_EQ(one.whatif->skipped_steps, 0u);
  // Neither of its tensor ranks: no step can be analysed, and the reason says why.
  const JobSnapshot both = RunJob("", 20, {4, 5});
  ASSERT_NE(both.whatif, nullptr);
  EXPECT_EQ(both.whatif->analysed_steps, 0u);
  EXPECT_EQ(both.whatif->skipped_steps, 20u);
  EXPECT_EQ(both.whatif->last_error, "step 19: 1 of 8 workers sent no ops");
  EXPECT_EQ(both.whatif->verdict.verdict, whatif::Verdict::kNone);
}

TEST(StepAssemblerTest, AFlatJobHasNoWhatIf) {
  JobPipeline pipeline("flat", 2, {});
  for (uint32_t r = 0; r < 2; ++r) {
    v1::Batch b;
    b.mutable_source()->set_training_job("flat");
    b.mutable_source()->set_rank(r);
    b.mutable_source()->set_world_size(2);
    b.mutable_source()->mutable_layout()->set_data_rank(r);
    b.mutable_source()->mutable_layout()->set_data_size(2);
    v1::StepRecord* rec = b.add_steps();
    rec->set_step(0);
    rec->set_step_time_ns(1'000'000);
    rec->add_ops()->set_type(v1::OP_OPTIMIZER);
    pipeline.AddBatch(b, TimePoint{});
  }
  EXPECT_EQ(pipeline.Snapshot(TimePoint{}).whatif, nullptr);
}

}  // namespace
}  // namespace rankwatch
