// FleetModel with --parallel: the records of a data x pipeline x tensor parallel job, and each
// fault as it shows in the ops.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "collectors/simulator/fleet_model.h"

namespace rankwatch {
namespace {

FaultSpec Fault(const std::string& text) {
  auto f = ParseFaultSpec(text);
  EXPECT_TRUE(f.ok()) << f.status();
  return f.ok() ? *f : FaultSpec{};
}

FleetOptions Parallel(uint32_t dp, uint32_t pp, uint32_t tp, uint32_t mb = 8) {
  FleetOptions o;
  o.parallel = PipelineSpec{.dp = dp, .pp = pp, .tp = tp, .microbatches = mb};
  o.ranks = dp * pp * tp;
  o.report_collective = true;
  return o;
}

struct Steps {
  explicit Steps(FleetOptions o)
      : model([&] {
          EXPECT_TRUE(CheckFleetOptions(o).ok()) << CheckFleetOptions(o);
          return o;
        }()) {}
  const std::vector<v1::StepRecord>& Step(uint64_t s) {
    model.Step(s, &records, &reported);
    return records;
  }
  FleetModel model;
  std::vector<v1::StepRecord> records;
  std::vector<bool> reported;
};

double Sum(const v1::StepRecord& r, v1::OpType type) {
  double us = 0;
  for (const v1::OpRecord& op : r.ops()) {
    if (op.type() == type) us += static_cast<double>(op.duration_us());
  }
  return us;
}

double Compute(const v1::StepRecord& r) {
  return Sum(r, v1::OP_FORWARD_COMPUTE) + Sum(r, v1::OP_BACKWARD_COMPUTE);
}

// Rank of (tensor rank t, data rank d, stage s) in Megatron's order.
uint32_t RankOf(const FleetOptions& o, uint32_t t, uint32_t d, uint32_t s) {
  return t + o.parallel->tp * (d + o.parallel->dp * s);
}

TEST(FaultSpecTest, ParsesTheParallelKinds) {
  FaultSpec f = Fault("slow-worker:dp=0,pp=1,factor=1.3");
  EXPECT_EQ(f.kind, FaultKind::kSlowWorker);
  EXPECT_EQ(f.dp, 0u);
  EXPECT_EQ(f.stage, 1u);
  EXPECT_DOUBLE_EQ(f.magnitude, 1.3);
  EXPECT_EQ(f.from_step, 0u);
  f = Fault("slow-worker:pp=3,dp=2:100-200");
  EXPECT_EQ(f.dp, 2u);
  EXPECT_EQ(f.stage, 3u);
  EXPECT_DOUBLE_EQ(f.magnitude, 1.3);  // the default factor
  EXPECT_EQ(f.from_step, 100u);
  EXPECT_EQ(f.until_step, 200u);
  f = Fault("stage-imbalance:stage=3,factor=1.25");
  EXPECT_EQ(f.kind, FaultKind::kStageImbalance);
  EXPECT_EQ(f.stage, 3u);
  EXPECT_DOUBLE_EQ(f.magnitude, 1.25);
  f = Fault("sequence-imbalance:spread=0.2:50");
  EXPECT_EQ(f.kind, FaultKind::kSequenceImbalance);
  EXPECT_DOUBLE_EQ(f.magnitude, 0.2);
  EXPECT_EQ(f.from_step, 50u);
  EXPECT_DOUBLE_EQ(Fault("sequence-imbalance").magnitude, 0.3);
  f = Fault("gc:rank=5,every=4,ms=30");
  EXPECT_EQ(f.kind, FaultKind::kGc);
  EXPECT_EQ(f.target.kind, FaultTarget::Kind::kRank);
  EXPECT_EQ(f.target.index, 5u);
  EXPECT_EQ(f.every, 4u);
  EXPECT_DOUBLE_EQ(f.magnitude, 30);
  EXPECT_EQ(FaultKindName(f.kind), "gc");
  EXPECT_TRUE(IsKeyedFault(FaultKind::kGc));
  EXPECT_FALSE(IsKeyedFault(FaultKind::kSlowCompute));
  for (const char* bad :
       {"slow-worker:dp=0", "slow-worker:pp=1", "slow-worker:dp=0,pp=1,factor=0",
        "slow-worker:dp=0,pp=1,rank=2", "stage-imbalance:factor=1.2", "stage-imbalance:stage=x",
        "sequence-imbalance:spread=-1", "sequence-imbalance:spread=1", "gc:every=3",
        "gc:rank=1,every=0", "gc:rank=1,ms=-5", "gc:rank=1:9-3", "gc:rank=1:1:2",
        "slow-worker:dp=0,pp=1,factor"}) {
    auto r = ParseFaultSpec(bad);
    EXPECT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find(bad), std::string::npos) << r.status();
  }
}

TEST(FleetModelParallelTest, CheckFleetOptionsKeepsFaultsInsideTheLayout) {
  FleetOptions o = Parallel(4, 4, 2);
  EXPECT_TRUE(CheckFleetOptions(o).ok());
  o.ranks = 16;
  EXPECT_FALSE(CheckFleetOptions(o).ok());
  o = Parallel(4, 4, 2);
  o.sync = FleetOptions::Sync::kNone;
  EXPECT_FALSE(CheckFleetOptions(o).ok());
  for (const char* bad :
       {"slow-worker:dp=4,pp=0", "slow-worker:dp=0,pp=4", "stage-imbalance:stage=4", "gc:rank=32",
        "slow-host:3", "slow-input:3", "wait:all"}) {
    o = Parallel(4, 4, 2);
    o.faults.push_back(Fault(bad));
    EXPECT_FALSE(CheckFleetOptions(o).ok()) << bad;
  }
  for (const char* good : {"slow-worker:dp=3,pp=3", "gc:rank=31", "slow-compute:node1",
                           "memory-leak:3", "hang:2:0:10"}) {
    o = Parallel(4, 4, 2);
    o.faults.push_back(Fault(good));
    EXPECT_TRUE(CheckFleetOptions(o).ok()) << good << CheckFleetOptions(o);
  }
  FleetOptions flat;
  flat.faults.push_back(Fault("stage-imbalance:stage=1"));
  EXPECT_FALSE(CheckFleetOptions(flat).ok());
  flat.faults = {Fault("gc:rank=7")};
  EXPECT_TRUE(CheckFleetOptions(flat).ok());
  flat.faults = {Fault("gc:rank=8")};
  EXPECT_FALSE(CheckFleetOptions(flat).ok());
}

TEST(FleetModelParallelTest, RecordsCarryLayoutOpsAndConsistentPhases) {
  FleetOptions o = Parallel(2, 4, 2);
  Steps s(o);
  s.model.set_job_start_unix_ns(1'000'000'000'000);
  const auto& recs = s.Step(0);
  ASSERT_EQ(recs.size(), 16u);
  ASSERT_EQ(std::count(s.reported.begin(), s.reported.end(), true), 16);
  uint64_t latest_end = 0;  // of any rank's ops: the step's end
  for (uint32_t r = 0; r < 16; ++r) {
    const v1::ParallelLayout l = s.model.LayoutOf(r);
    EXPECT_EQ(r, RankOf(o, l.tensor_rank(), l.data_rank(), l.pipeline_rank())) << r;
    EXPECT_EQ(l.data_size(), 2u);
    EXPECT_EQ(l.pipeline_size(), 4u);
    EXPECT_EQ(l.tensor_size(), 2u);
    const v1::StepRecord& rec = recs[r];
    // One origin for every rank (no clock skew), the step's start.
    EXPECT_EQ(rec.ops_origin_unix_ns(), 1'000'000'000'000);
    EXPECT_EQ(rec.step_time_ns(), recs[0].step_time_ns());
    EXPECT_EQ(rec.end_unix_ns(),
              rec.ops_origin_unix_ns() + static_cast<int64_t>(rec.step_time_ns()));
    // M forwards and backwards, in start order, inside the step.
    int fwd = 0, bwd = 0;
    uint64_t last_start = 0, last_end = 0;
    for (const v1::OpRecord& op : rec.ops()) {
      fwd += op.type() == v1::OP_FORWARD_COMPUTE;
      bwd += op.type() == v1::OP_BACKWARD_COMPUTE;
      EXPECT_GE(op.start_offset_us(), last_start);
      last_start = op.start_offset_us();
      last_end = std::max(last_end, op.start_offset_us() + op.duration_us());
    }
    EXPECT_EQ(fwd, 8);
    EXPECT_EQ(bwd, 8);
    EXPECT_EQ(rec.ops(rec.ops_size() - 1).type(), v1::OP_OPTIMIZER);
    EXPECT_LE(static_cast<double>(last_end), rec.step_time_ns() / 1e3 + 1);
    latest_end = std::max(latest_end, last_end);
    // Phases are the ops' sums (each op rounded to whole µs on the wire).
    EXPECT_NEAR(rec.forward_ns() / 1e3, Sum(rec, v1::OP_FORWARD_COMPUTE), 8);
    EXPECT_NEAR(rec.backward_ns() / 1e3, Sum(rec, v1::OP_BACKWARD_COMPUTE), 8);
    EXPECT_NEAR(rec.optimizer_ns() / 1e3, Sum(rec, v1::OP_OPTIMIZER), 1);
    EXPECT_LE(rec.forward_ns() + rec.backward_ns() + rec.optimizer_ns(), rec.step_time_ns());
    EXPECT_GT(rec.collective_ns(), 0u);
    EXPECT_TRUE(rec.has_gc_ns());
    EXPECT_EQ(rec.gc_count(), 0u);
  }
  // (Within the tensor ranks' lockstep noise on the last optimizer.)
  EXPECT_NEAR(static_cast<double>(latest_end), recs[0].step_time_ns() / 1e3,
              1e-3 * recs[0].step_time_ns() / 1e3);
  // Tensor ranks of a worker: the same ops at the same offsets, durations within 2.5 %.
  for (uint32_t r = 0; r < 16; r += 2) {
    ASSERT_EQ(recs[r].ops_size(), recs[r + 1].ops_size());
    for (int i = 0; i < recs[r].ops_size(); ++i) {
      const v1::OpRecord& a = recs[r].ops(i);
      const v1::OpRecord& b = recs[r + 1].ops(i);
      EXPECT_EQ(a.type(), b.type());
      EXPECT_EQ(a.microbatch(), b.microbatch());
      EXPECT_EQ(a.start_offset_us(), b.start_offset_us());
      EXPECT_NEAR(static_cast<double>(a.duration_us()), static_cast<double>(b.duration_us()),
                  0.025 * a.duration_us() + 1);
    }
  }
  // The nominal step: about step_ms.
  EXPECT_NEAR(recs[0].step_time_ns() / 1e6, o.step_ms, 0.15 * o.step_ms);
}

// No noise; forward 1 ms and backward 2 ms per microbatch; communication and optimizer free.
FleetOptions Exact(uint32_t dp, uint32_t pp, uint32_t tp, uint32_t mb = 8) {
  FleetOptions o = Parallel(dp, pp, tp, mb);
  o.op_noise = 0;
  o.pipeline_costs = FleetOptions::PipelineCosts{.forward = 1000, .backward = 2000};
  return o;
}

TEST(FleetModelParallelTest, BalancedStepIsTheClosedFormAndStepsFollowEachOther) {
  Steps s(Exact(2, 4, 2));
  s.model.set_job_start_unix_ns(0);
  const auto& first = s.Step(0);
  const uint64_t closed_form = (8 + 4 - 1) * 3'000'000ull;  // (M + P - 1)(f + b), ns
  for (const v1::StepRecord& r : first) {
    EXPECT_EQ(r.step_time_ns(), closed_form);
    EXPECT_EQ(r.forward_ns(), 8'000'000u);
    EXPECT_EQ(r.backward_ns(), 16'000'000u);
  }
  const auto& second = s.Step(1);
  EXPECT_EQ(second[5].ops_origin_unix_ns(), static_cast<int64_t>(closed_form));
  EXPECT_EQ(s.model.elapsed_ns(), static_cast<int64_t>(2 * closed_form));
}

TEST(FleetModelParallelTest, SeededNoiseAndClockSkew) {
  FleetOptions o = Parallel(2, 2, 2);
  o.op_noise = 0.03;
  o.clock_skew_us = 200;
  o.ranks_per_node = 4;
  Steps a(o), b(o);
  const std::vector<v1::StepRecord> ra = a.Step(3);
  const std::vector<v1::StepRecord> rb = b.Step(3);
  for (size_t r = 0; r < ra.size(); ++r)
    EXPECT_EQ(ra[r].SerializeAsString(), rb[r].SerializeAsString());
  o.seed = 2;
  Steps c(o);
  EXPECT_NE(c.Step(3)[0].forward_ns(), ra[0].forward_ns());
  // Forward computes of one rank vary by a few % (lognormal, sigma 3 %).
  std::vector<double> fwd;
  for (const v1::OpRecord& op : ra[0].ops()) {
    if (op.type() == v1::OP_FORWARD_COMPUTE) fwd.push_back(static_cast<double>(op.duration_us()));
  }
  const auto [lo, hi] = std::minmax_element(fwd.begin(), fwd.end());
  EXPECT_GT(*hi / *lo, 1.005);
  EXPECT_LT(*hi / *lo, 1.3);
  // Skew: one origin per node (ranks 0-3, 4-7), different between the nodes, within ~5 sigma.
  EXPECT_EQ(ra[0].ops_origin_unix_ns(), ra[3].ops_origin_unix_ns());
  EXPECT_EQ(ra[4].ops_origin_unix_ns(), ra[7].ops_origin_unix_ns());
  EXPECT_NE(ra[0].ops_origin_unix_ns(), ra[4].ops_origin_unix_ns());
  EXPECT_LT(std::abs(ra[0].ops_origin_unix_ns() - ra[4].ops_origin_unix_ns()), 2'000'000);
}

// Mean duration of the forward and backward computes of rank `r`, µs.
double MeanCompute(const v1::StepRecord& r) { return Compute(r) / (2.0 * 8); }

TEST(FleetModelParallelTest, SlowWorkerLengthensItsComputeFromItsStep) {
  FleetOptions o = Exact(4, 4, 2);
  o.faults.push_back(Fault("slow-worker:dp=1,pp=2,factor=1.3:5"));
  Steps s(o);
  const uint64_t before = s.Step(4)[0].step_time_ns();
  const auto& recs = s.Step(5);
  for (uint32_t stage = 0; stage < 4; ++stage) {
    for (uint32_t d = 0; d < 4; ++d) {
      for (uint32_t t = 0; t < 2; ++t) {
        const double expected = (stage == 2 && d == 1) ? 1.3 * 1500 : 1500;
        EXPECT_NEAR(MeanCompute(recs[RankOf(o, t, d, stage)]), expected, 1) << stage << d << t;
      }
    }
  }
  // The job waits for it: every rank's step is longer.
  EXPECT_GT(recs[0].step_time_ns(), before * 1.05);
  for (const v1::StepRecord& r : recs) EXPECT_EQ(r.step_time_ns(), recs[0].step_time_ns());
}

TEST(FleetModelParallelTest, StageImbalanceLengthensTheStageOnEveryReplica) {
  FleetOptions o = Exact(4, 4, 1);
  o.faults.push_back(Fault("stage-imbalance:stage=3,factor=1.25"));
  Steps s(o);
  const auto& recs = s.Step(0);
  for (uint32_t stage = 0; stage < 4; ++stage) {
    for (uint32_t d = 0; d < 4; ++d) {
      EXPECT_NEAR(MeanCompute(recs[RankOf(o, 0, d, stage)]), stage == 3 ? 1875 : 1500, 1);
    }
  }
  // The last stage sets the pace: sum over stages plus M - 1 of the longest (1.25 x 3 ms).
  EXPECT_NEAR(recs[0].step_time_ns() / 1e6, 3 * 3 + 3.75 + 7 * 3.75, 0.01);
}

TEST(FleetModelParallelTest, SequenceImbalanceMovesTheSlowReplicaFromStepToStep) {
  FleetOptions o = Exact(4, 2, 1);
  o.faults.push_back(Fault("sequence-imbalance:spread=0.3"));
  Steps s(o);
  std::set<uint32_t> slowest;
  double mean = 0;  // of the replicas' factors: the work is the same on average
  for (uint64_t step = 0; step < 20; ++step) {
    const auto& recs = s.Step(step);
    double worst = 0;
    uint32_t worst_d = 0;
    for (uint32_t d = 0; d < 4; ++d) {
      // Every stage of the replica scales alike (its microbatches' sequences pass through all).
      const double f0 = MeanCompute(recs[RankOf(o, 0, d, 0)]) / 1500;
      const double f1 = MeanCompute(recs[RankOf(o, 0, d, 1)]) / 1500;
      EXPECT_NEAR(f0, f1, 0.002);
      EXPECT_GE(f0, 0.7 - 0.001);
      EXPECT_LT(f0, 1.3 + 0.001);
      mean += f0 / (20 * 4);
      if (f0 > worst) worst = f0, worst_d = d;
    }
    slowest.insert(worst_d);
  }
  EXPECT_GE(slowest.size(), 3u);  // 20 steps, 4 replicas: the slow one moves
  EXPECT_NEAR(mean, 1.0, 0.06);   // 80 draws of 1 + 0.3 v: standard error 0.02
}

TEST(FleetModelParallelTest, GcPauseIsAnOpInsideAForwardComputeEveryNSteps) {
  FleetOptions o = Exact(2, 2, 2);
  o.faults.push_back(Fault("gc:rank=5,every=3,ms=20"));  // rank 5: tp 1, dp 0, stage 1
  Steps s(o);
  for (uint64_t step = 0; step < 7; ++step) {
    const auto& recs = s.Step(step);
    const bool fires = step % 3 == 0;
    for (uint32_t r = 0; r < 8; ++r) {
      const v1::StepRecord& rec = recs[r];
      EXPECT_EQ(rec.gc_count(), r == 5 && fires ? 1u : 0u) << r << " " << step;
      EXPECT_EQ(rec.gc_ns(), r == 5 && fires ? 20'000'000u : 0u) << r << " " << step;
      int gc_ops = 0;
      for (int i = 0; i < rec.ops_size(); ++i) {
        if (rec.ops(i).type() != v1::OP_GC) continue;
        ++gc_ops;
        // Inside the forward compute just before it, which it lengthened by 20 ms.
        const v1::OpRecord& outer = rec.ops(i - 1);
        ASSERT_EQ(outer.type(), v1::OP_FORWARD_COMPUTE);
        EXPECT_EQ(rec.ops(i).duration_us(), 20'000u);
        EXPECT_GE(rec.ops(i).start_offset_us(), outer.start_offset_us());
        EXPECT_LE(rec.ops(i).start_offset_us() + 20'000,
                  outer.start_offset_us() + outer.duration_us());
        EXPECT_EQ(outer.duration_us(), 21'000u);
      }
      EXPECT_EQ(gc_ops, r == 5 && fires ? 1 : 0);
    }
    // The tensor peer (rank 4) waits for it in lockstep: one forward 20 ms longer, no gc op.
    EXPECT_EQ(recs[4].forward_ns(), fires ? 28'000'000u : 8'000'000u) << step;
    EXPECT_EQ(recs[0].forward_ns(), 8'000'000u);
  }
}

TEST(FleetModelParallelTest, FlatGcLengthensForwardAndIsRecorded) {
  FleetOptions o;
  o.ranks = 4;
  o.jitter = 0;
  o.faults.push_back(Fault("gc:rank=2,every=2,ms=10"));
  Steps s(o);
  const auto& r0 = s.Step(0);
  EXPECT_EQ(r0[2].forward_ns(), 40'000'000u);
  EXPECT_EQ(r0[2].gc_ns(), 10'000'000u);
  EXPECT_EQ(r0[2].gc_count(), 1u);
  EXPECT_EQ(r0[1].gc_ns(), 0u);
  EXPECT_TRUE(r0[1].has_gc_count());
  EXPECT_EQ(r0[1].step_time_ns(), 110'000'000u);  // DDP: everyone waits for it
  EXPECT_EQ(r0[1].ops_size(), 0);
  const auto& r1 = s.Step(1);
  EXPECT_EQ(r1[2].forward_ns(), 30'000'000u);
  EXPECT_EQ(r1[2].gc_count(), 0u);
  // Without a gc fault the flat records have no GC fields (as before).
  FleetOptions plain;
  plain.ranks = 2;
  Steps p(plain);
  EXPECT_FALSE(p.Step(0)[0].has_gc_ns());
}

TEST(FleetModelParallelTest, SlowComputeSlowsTheWholeWorkerAndHangStopsTheJob) {
  FleetOptions o = Exact(2, 2, 2);
  o.faults.push_back(Fault("slow-compute:3:0.5"));  // rank 3: tp 1, dp 1, stage 0
  o.faults.push_back(Fault("hang:6:0:4"));
  Steps s(o);
  const auto& recs = s.Step(0);
  EXPECT_NEAR(MeanCompute(recs[2]), 1.5 * 1500, 1);  // its tensor peer too
  EXPECT_NEAR(MeanCompute(recs[3]), 1.5 * 1500, 1);
  EXPECT_NEAR(MeanCompute(recs[0]), 1500, 1);
  s.Step(4);
  EXPECT_EQ(std::count(s.reported.begin(), s.reported.end(), true), 0);
}
}  // namespace
}  // namespace rankwatch
