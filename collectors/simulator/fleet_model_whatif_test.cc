// The --parallel fleet's steps through the what-if Analyzer (operators/whatif/whatif.h): the
// analyzer's dependency model replays the simulator's steps — 1F1B, and torch's interleaved,
// zero-bubble and V schedules — (its actual step matches the measured one), a balanced job has
// S close to 1, and each fault lands in its decomposition.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "collectors/simulator/fleet_model.h"
#include "operators/whatif/whatif.h"

namespace rankwatch {
namespace {

constexpr uint64_t kSteps = 64;  // one full window
constexpr double kReplay = 0.015;

// A worker's ops as the daemon sees them: its tensor rank 0's ops, plus the GC pauses of its
// other tensor ranks (the worker waits for them in lockstep), on the first rank's clock.
whatif::StepOps ToStepOps(const PipelineSpec& p, uint64_t step,
                          const std::vector<v1::StepRecord>& records) {
  whatif::StepOps out;
  out.step = step;
  out.workers.resize(p.workers());
  const int64_t origin = records[0].ops_origin_unix_ns();
  for (uint32_t r = 0; r < records.size(); ++r) {
    std::vector<whatif::Op>& ops = out.workers[p.WorkerOf(r)];
    const double shift_us = static_cast<double>(records[r].ops_origin_unix_ns() - origin) / 1e3;
    for (const v1::OpRecord& o : records[r].ops()) {
      if (p.TensorRankOf(r) != 0 && o.type() != v1::OP_GC) continue;
      ops.push_back({static_cast<whatif::OpKind>(o.type()), static_cast<uint16_t>(o.microbatch()),
                     static_cast<uint16_t>(o.model_chunk()),
                     shift_us + static_cast<double>(o.start_offset_us()),
                     static_cast<double>(o.duration_us())});
    }
  }
  for (auto& ops : out.workers) {
    std::stable_sort(ops.begin(), ops.end(), [](const whatif::Op& a, const whatif::Op& b) {
      return a.start_us < b.start_us;
    });
  }
  return out;
}

whatif::WindowResult Analyze(const std::string& fault,
                             PipelineSpec spec = {.dp = 4, .pp = 4, .tp = 2, .microbatches = 8}) {
  FleetOptions o;
  o.parallel = spec;
  o.ranks = o.parallel->world_size();
  if (!fault.empty()) o.faults.push_back(*ParseFaultSpec(fault));
  EXPECT_TRUE(CheckFleetOptions(o).ok());
  FleetModel model(o);
  whatif::Analyzer analyzer({.dp = spec.dp, .pp = spec.pp, .tp = spec.tp, .vpp = spec.vpp}, {});
  std::vector<v1::StepRecord> records;
  std::vector<bool> reported;
  for (uint64_t step = 0; step < kSteps; ++step) {
    model.Step(step, &records, &reported);
    const absl::Status s = analyzer.AddStep(ToStepOps(*o.parallel, step, records));
    EXPECT_TRUE(s.ok()) << s;
  }
  return analyzer.Window();
}

size_t ArgMax(const std::vector<double>& v) {
  return static_cast<size_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

double Spread(const std::vector<double>& v) {
  const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
  return *hi - *lo;
}

TEST(FleetModelWhatIfTest, TheAnalyzerReplaysTheStepsAndABalancedJobIsNotSlowedDown) {
  const whatif::WindowResult r = Analyze("");
  ASSERT_EQ(r.steps, kSteps);
  // The analyzer's dependency model simulates the same schedule: its step with the measured
  // durations is the measured step, within 1.5 % — tensor rank 0's computes end a fraction of
  // a percent before its worker's (lockstep noise), and the study's model lets a send overlap
  // the next compute where the simulator's send waits for its receive.
  EXPECT_NEAR(r.actual_us / r.measured_us, 1.0, kReplay);
  // 2% noise per op: a little lost to the slowest of each sync, below the study's 1.03.
  EXPECT_GE(r.slowdown, 1.0);
  EXPECT_LT(r.slowdown, 1.03);
  EXPECT_TRUE(r.decomposition.by_stage.empty());
}

TEST(FleetModelWhatIfTest, SlowWorkerIsItsDataRankItsStageAndTheTopWorker) {
  const whatif::WindowResult r = Analyze("slow-worker:dp=1,pp=2,factor=1.3");
  EXPECT_NEAR(r.actual_us / r.measured_us, 1.0, kReplay);
  EXPECT_GT(r.slowdown, 1.1);
  ASSERT_EQ(r.decomposition.by_dp_rank.size(), 4u);
  ASSERT_EQ(r.decomposition.by_stage.size(), 4u);
  EXPECT_EQ(ArgMax(r.decomposition.by_dp_rank), 1u);
  EXPECT_EQ(ArgMax(r.decomposition.by_stage), 2u);
  ASSERT_FALSE(r.decomposition.by_worker.empty());
  EXPECT_EQ(r.decomposition.by_worker.front().first, 2u * 4 + 1);  // stage * dp + data rank
  // The one worker explains most of the slowdown; the other replicas almost none.
  EXPECT_GT(r.m_w, 0.8);
  EXPECT_LT(r.decomposition.by_dp_rank[0], 1.03);
}

TEST(FleetModelWhatIfTest, StageImbalanceIsOneStageOnEveryReplica) {
  const whatif::WindowResult r = Analyze("stage-imbalance:stage=3,factor=1.25");
  EXPECT_NEAR(r.actual_us / r.measured_us, 1.0, kReplay);
  EXPECT_GT(r.slowdown, 1.07);
  EXPECT_EQ(ArgMax(r.decomposition.by_stage), 3u);
  EXPECT_EQ(r.m_s_stage, 3u);
  EXPECT_GT(r.m_s, 0.8);
  // Every replica holds the same share of it.
  EXPECT_LT(Spread(r.decomposition.by_dp_rank), 0.02);
}

TEST(FleetModelWhatIfTest, SequenceImbalanceMovesTheSlowestReplica) {
  const whatif::WindowResult r = Analyze("sequence-imbalance:spread=0.3");
  EXPECT_NEAR(r.actual_us / r.measured_us, 1.0, kReplay);
  EXPECT_GT(r.slowdown, 1.1);
  // Neither one stage nor a few workers explain it; the slowest replica of a step changes
  // from step to step.
  EXPECT_LT(r.m_s, 0.5);
  EXPECT_LT(r.m_w, 0.5);
  std::set<size_t> slowest;
  for (const whatif::StepResult& s : r.per_step) {
    if (!s.decomposition.by_dp_rank.empty()) slowest.insert(ArgMax(s.decomposition.by_dp_rank));
  }
  EXPECT_GE(slowest.size(), 3u);
}

TEST(FleetModelWhatIfTest, GcPausesAreTheTopOpGroupWhateverTheirTensorRank) {
  // Rank 13 is tensor rank 1 of worker (data rank 2, stage 1).
  const whatif::WindowResult r = Analyze("gc:rank=13,every=4,ms=40");
  EXPECT_NEAR(r.actual_us / r.measured_us, 1.0, kReplay);
  EXPECT_GT(r.slowdown, 1.05);
  ASSERT_FALSE(r.decomposition.by_op_group.empty());
  EXPECT_EQ(r.decomposition.by_op_group.front().first, "gc");
  EXPECT_EQ(ArgMax(r.decomposition.by_dp_rank), 2u);
  EXPECT_EQ(ArgMax(r.decomposition.by_stage), 1u);
}

TEST(FleetModelWhatIfTest, TorchSchedulesReplayAndNameTheSlowWorker) {
  for (const char* schedule : {"schedule=interleaved", "schedule=interleaved,vpp=3", "schedule=zb",
                               "schedule=zb,vpp=2", "schedule=zbv", "schedule=dualpipev"}) {
    const auto spec = ParsePipelineSpec(std::string("dp=2,pp=4,mb=8,") + schedule);
    ASSERT_TRUE(spec.ok()) << spec.status();
    const whatif::WindowResult balanced = Analyze("", *spec);
    ASSERT_EQ(balanced.steps, kSteps) << schedule;
    // Sends do not hold a worker up, receives wait just before their compute: the model replays
    // the step closer than 1F1B's blocking pairs.
    EXPECT_NEAR(balanced.actual_us / balanced.measured_us, 1.0, 0.005) << schedule;
    EXPECT_GE(balanced.slowdown, 1.0) << schedule;
    EXPECT_LT(balanced.slowdown, 1.03) << schedule;

    const whatif::WindowResult r = Analyze("slow-worker:dp=1,pp=2,factor=1.3", *spec);
    EXPECT_NEAR(r.actual_us / r.measured_us, 1.0, 0.005) << schedule;
    EXPECT_GT(r.slowdown, 1.1) << schedule;
    ASSERT_EQ(r.decomposition.by_stage.size(), 4u) << schedule;
    EXPECT_EQ(ArgMax(r.decomposition.by_dp_rank), 1u) << schedule;
    EXPECT_EQ(ArgMax(r.decomposition.by_stage), 2u) << schedule;
    EXPECT_LT(r.decomposition.by_dp_rank[0], 1.03) << schedule;
    // The weight-gradient ops are an op group of their own, and compute like the others.
    const bool split = std::string(schedule).find("zb") != std::string::npos ||
                       std::string(schedule).find("dualpipe") != std::string::npos;
    bool weight_group = false;
    for (const auto& [group, s] : r.decomposition.by_op_group) {
      weight_group |= group == "backward-weight-compute";
    }
    EXPECT_EQ(weight_group, split) << schedule;
  }
}

}  // namespace
}  // namespace rankwatch
