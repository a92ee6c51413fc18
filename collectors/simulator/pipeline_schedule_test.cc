#include "collectors/simulator/pipeline_schedule.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <tuple>

namespace rankwatch {
namespace {

constexpr double kF = 100, kB = 200;  // µs per microbatch

// Forward kF, backward kB on every stage (x `slow` on stage `slow_stage`), optimizer
// `optimizer`, every transfer `transfer`.
StepCosts Costs(double transfer = 0, double optimizer = 0, int slow_stage = -1, double slow = 1,
                uint32_t dp = 1) {
  StepCosts c;
  c.compute = [=](uint32_t worker, const ProgramOp& op) {
    const double factor = static_cast<int>(worker / dp) == slow_stage ? slow : 1.0;
    switch (op.type) {
      case v1::OP_FORWARD_COMPUTE: return kF * factor;
      case v1::OP_BACKWARD_COMPUTE: return kB * factor;
      default: return optimizer;
    }
  };
  c.transfer = [=](uint32_t, const ProgramOp&) { return transfer; };
  return c;
}

std::vector<TimedOp> OfType(const std::vector<TimedOp>& ops, v1::OpType type) {
  std::vector<TimedOp> out;
  for (const TimedOp& op : ops) {
    if (op.type == type) out.push_back(op);
  }
  return out;
}

TEST(PipelineSpecTest, ParsesAndRejects) {
  auto s = ParsePipelineSpec("dp=4,pp=4,tp=2");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->dp, 4u);
  EXPECT_EQ(s->pp, 4u);
  EXPECT_EQ(s->tp, 2u);
  EXPECT_EQ(s->microbatches, 8u);
  EXPECT_EQ(s->world_size(), 32u);
  s = ParsePipelineSpec("mb=16,pp=2");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->dp, 1u);
  EXPECT_EQ(s->tp, 1u);
  EXPECT_EQ(s->microbatches, 16u);
  for (const char* bad :
       {"", "dp=0,pp=2", "dp=2,xx=3", "dp=2,", "dp", "dp=-1", "dp=1024,pp=1024,tp=2", "mb=1025"}) {
    auto r = ParsePipelineSpec(bad);
    EXPECT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("--parallel"), std::string::npos) << r.status();
  }
}

TEST(PipelineSpecTest, MegatronRankOrder) {
  const PipelineSpec s{.dp = 4, .pp = 4, .tp = 2};
  // rank = tp + T * (dp + D * pp): rank 13 = tp 1 + 2 * (dp 2 + 4 * stage 1).
  EXPECT_EQ(s.TensorRankOf(13), 1u);
  EXPECT_EQ(s.DataRankOf(13), 2u);
  EXPECT_EQ(s.StageOf(13), 1u);
  EXPECT_EQ(s.WorkerOf(13), 6u);  // stage * dp + data rank
  EXPECT_EQ(s.StageOf(31), 3u);
  EXPECT_EQ(s.DataRankOf(31), 3u);
}

TEST(PipelineScheduleTest, OneForwardOneBackwardProgram) {
  const PipelineSpec s{.dp = 2, .pp = 4, .tp = 1, .microbatches = 8};
  for (uint32_t stage = 0; stage < 4; ++stage) {
    std::vector<ProgramOp> flat;
    for (const auto& slot : StageProgram(s, stage))
      flat.insert(flat.end(), slot.begin(), slot.end());
    // Warm-up: P - stage - 1 forwards before the first backward, then strict alternation.
    std::vector<v1::OpType> compute;
    for (const ProgramOp& op : flat) {
      if (op.type == v1::OP_FORWARD_COMPUTE || op.type == v1::OP_BACKWARD_COMPUTE) {
        compute.push_back(op.type);
      }
    }
    // Warm-up: P - stage - 1 forwards; steady: forward, backward, ...; cool-down: backwards.
    const uint32_t warmup = 3 - stage;
    std::vector<v1::OpType> expected(warmup, v1::OP_FORWARD_COMPUTE);
    for (uint32_t i = warmup; i < 8; ++i) {
      expected.push_back(v1::OP_FORWARD_COMPUTE);
      expected.push_back(v1::OP_BACKWARD_COMPUTE);
    }
    expected.insert(expected.end(), warmup, v1::OP_BACKWARD_COMPUTE);
    EXPECT_EQ(compute, expected) << stage;
    // The first and last stage have no receive / send towards outside the pipeline.
    auto count = [&](v1::OpType t) {
      return std::count_if(flat.begin(), flat.end(),
                           [&](const ProgramOp& op) { return op.type == t; });
    };
    EXPECT_EQ(count(v1::OP_FORWARD_RECV), stage == 0 ? 0 : 8);
    EXPECT_EQ(count(v1::OP_BACKWARD_SEND), stage == 0 ? 0 : 8);
    EXPECT_EQ(count(v1::OP_FORWARD_SEND), stage == 3 ? 0 : 8);
    EXPECT_EQ(count(v1::OP_BACKWARD_RECV), stage == 3 ? 0 : 8);
    EXPECT_EQ(count(v1::OP_EMBEDDING_GRADS_ALL_REDUCE), stage == 0 || stage == 3 ? 1 : 0);
    EXPECT_EQ(count(v1::OP_PARAMS_ALL_GATHER), 1);
    EXPECT_EQ(count(v1::OP_GRADS_REDUCE_SCATTER), 1);
    EXPECT_EQ(flat.back().type, v1::OP_OPTIMIZER);
    EXPECT_EQ(flat[flat.size() - 2].type, v1::OP_OPTIMIZER_CLIP_MAIN_GRAD);
  }
  // No data parallelism: no data-parallel collectives.
  const PipelineSpec single{.dp = 1, .pp = 2, .tp = 1, .microbatches = 4};
  for (const auto& slot : StageProgram(single, 0)) {
    EXPECT_NE(slot[0].type, v1::OP_PARAMS_ALL_GATHER);
    EXPECT_NE(slot[0].type, v1::OP_GRADS_REDUCE_SCATTER);
  }
}

TEST(PipelineScheduleTest, BalancedStepIsTheClosedFormWithBubblesWhereExpected) {
  // 4 stages, 8 microbatches, no communication cost: (M + P - 1) (f + b).
  const PipelineSpec s{.dp = 1, .pp = 4, .tp = 1, .microbatches = 8};
  const SimulatedStep step = SimulatePipelineStep(s, Costs());
  EXPECT_DOUBLE_EQ(step.end_us, (8 + 4 - 1) * (kF + kB));
  for (uint32_t stage = 0; stage < 4; ++stage) {
    const auto& ops = step.workers[stage];
    const auto fwd = OfType(ops, v1::OP_FORWARD_COMPUTE);
    const auto bwd = OfType(ops, v1::OP_BACKWARD_COMPUTE);
    // The fill bubble: stage s waits s forwards for its first microbatch; the drain: its last
    // backward ends s backwards before stage 0's.
    EXPECT_DOUBLE_EQ(fwd.front().start_us, stage * kF) << stage;
    EXPECT_DOUBLE_EQ(bwd.back().start_us + bwd.back().duration_us,
                     (8 + 4 - 1) * (kF + kB) - stage * kB)
        << stage;
    // Between its first forward and its last backward the stage idles (P - 1 - stage)(f + b):
    // none on the last stage, the most on the first, which waits for the pipeline's backwards.
    const double span = bwd.back().start_us + bwd.back().duration_us - fwd.front().start_us;
    EXPECT_DOUBLE_EQ(span - 8 * (kF + kB), (3 - stage) * (kF + kB)) << stage;
    // Ops are in start order.
    for (size_t i = 1; i < ops.size(); ++i) {
      EXPECT_GE(ops[i].start_us, ops[i - 1].start_us);
    }
  }
  // The steady phase has no bubble on the last stage: forward, backward, forward, ...
  const auto last = OfType(step.workers[3], v1::OP_FORWARD_COMPUTE);
  const auto last_b = OfType(step.workers[3], v1::OP_BACKWARD_COMPUTE);
  for (size_t m = 0; m + 1 < last.size(); ++m) {
    EXPECT_DOUBLE_EQ(last[m + 1].start_us, last_b[m].start_us + kB) << m;
  }
}

TEST(PipelineScheduleTest, ClosedFormHoldsForEveryShape) {
  for (uint32_t p : {1u, 2u, 3u, 8u}) {
    for (uint32_t m : {1u, 2u, 5u, 8u, 16u}) {
      for (uint32_t dp : {1u, 3u}) {
        const PipelineSpec s{.dp = dp, .pp = p, .tp = 1, .microbatches = m};
        const SimulatedStep step = SimulatePipelineStep(s, Costs(0, 0, -1, 1, dp));
        EXPECT_DOUBLE_EQ(step.end_us, (m + p - 1) * (kF + kB)) << p << " " << m << " " << dp;
      }
    }
  }
}

TEST(PipelineScheduleTest, ALongerLastStageSetsThePace) {
  // The last stage 1.5x: sum over stages of (f + b) plus M - 1 more of the slowest stage.
  const PipelineSpec s{.dp = 1, .pp = 4, .tp = 1, .microbatches = 8};
  const SimulatedStep step = SimulatePipelineStep(s, Costs(0, 0, 3, 1.5));
  const double slow = 1.5 * (kF + kB);
  EXPECT_DOUBLE_EQ(step.end_us, 3 * (kF + kB) + slow + 7 * slow);
  // An earlier slow stage costs less than that bound but more than the balanced step.
  const SimulatedStep first = SimulatePipelineStep(s, Costs(0, 0, 0, 1.5));
  EXPECT_GT(first.end_us, 11 * (kF + kB));
  EXPECT_LE(first.end_us, step.end_us);
}

TEST(PipelineScheduleTest, CommunicationEndsTogetherAfterTheLastMemberStarts) {
  // Transfers of 10 µs, optimizer 50 µs, 2 replicas, stage 1 of replica 1 slower: its
  // replica's grads reduce-scatter partner waits for it, and clipping syncs everyone.
  const PipelineSpec s{.dp = 2, .pp = 2, .tp = 1, .microbatches = 4};
  StepCosts c = Costs(10, 50);
  c.compute = [](uint32_t worker, const ProgramOp& op) {
    const double f = worker == 3 ? 1.2 : 1.0;  // stage 1, replica 1
    switch (op.type) {
      case v1::OP_FORWARD_COMPUTE: return kF * f;
      case v1::OP_BACKWARD_COMPUTE: return kB * f;
      default: return 50.0;
    }
  };
  const SimulatedStep step = SimulatePipelineStep(s, c);
  auto end = [](const TimedOp& op) { return op.start_us + op.duration_us; };
  // Every forward send ends with its receive, a transfer after the later of the two started.
  for (uint32_t d = 0; d < 2; ++d) {
    const auto sends = OfType(step.workers[d], v1::OP_FORWARD_SEND);
    const auto recvs = OfType(step.workers[2 + d], v1::OP_FORWARD_RECV);
    ASSERT_EQ(sends.size(), 4u);
    ASSERT_EQ(recvs.size(), 4u);
    for (size_t m = 0; m < 4; ++m) {
      EXPECT_EQ(sends[m].microbatch, recvs[m].microbatch);
      EXPECT_DOUBLE_EQ(end(sends[m]), end(recvs[m]));
      EXPECT_DOUBLE_EQ(end(sends[m]), std::max(sends[m].start_us, recvs[m].start_us) + 10);
    }
  }
  // Grads reduce-scatter of stage 1: replicas 0 and 1 (workers 2, 3) end together.
  const auto rs2 = OfType(step.workers[2], v1::OP_GRADS_REDUCE_SCATTER);
  const auto rs3 = OfType(step.workers[3], v1::OP_GRADS_REDUCE_SCATTER);
  EXPECT_DOUBLE_EQ(end(rs2[0]), end(rs3[0]));
  EXPECT_GT(rs2[0].duration_us, rs3[0].duration_us + 100);  // the fast replica waited
  // Clipping ends at the same time on all four workers; the step ends an optimizer later.
  std::vector<double> clip_ends;
  for (const auto& ops : step.workers) {
    clip_ends.push_back(end(OfType(ops, v1::OP_OPTIMIZER_CLIP_MAIN_GRAD)[0]));
  }
  for (double e : clip_ends) EXPECT_DOUBLE_EQ(e, clip_ends[0]);
  EXPECT_DOUBLE_EQ(step.end_us, clip_ends[0] + 50);
}

TEST(PipelineSpecTest, ParsesSchedulesAndTheirChunks) {
  auto s = ParsePipelineSpec("dp=2,pp=4,schedule=interleaved");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->schedule, PipelineScheduleKind::kInterleaved1F1B);
  EXPECT_EQ(s->vpp, 2u);
  s = ParsePipelineSpec("pp=4,schedule=zb");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->vpp, 1u);
  s = ParsePipelineSpec("pp=4,schedule=zb,vpp=2");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->vpp, 2u);
  s = ParsePipelineSpec("pp=4,mb=8,schedule=dualpipev");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->vpp, 2u);
  // V placement: chunk 0 down the stages, chunk 1 back up.
  EXPECT_EQ(s->GlobalChunk(0, 1), 7u);
  EXPECT_EQ(s->GlobalChunk(3, 1), 4u);
  EXPECT_EQ(s->StageOfChunk(5), 2u);
  EXPECT_EQ(s->LocalChunk(5), 1u);
  EXPECT_EQ(ParsePipelineSpec("pp=4")->vpp, 1u);
  for (const char* bad :
       {"pp=4,mb=6,schedule=dualpipev", "pp=4,schedule=zbv,vpp=3", "pp=1,schedule=zbv",
        "pp=4,schedule=1f1b,vpp=2", "pp=4,schedule=interleaved,vpp=1", "pp=4,schedule=foo",
        "pp=4,mb=9,schedule=interleaved", "pp=4,mb=600,schedule=interleaved"}) {
    auto r = ParsePipelineSpec(bad);
    EXPECT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("--parallel"), std::string::npos) << r.status();
  }
}

// Forward kF, full backward kB, its input and weight parts kB / 2 each, per stage (a chunk
// takes its share), transfers `transfer`.
StepCosts ChunkCosts(const PipelineSpec& s, double transfer) {
  StepCosts c;
  c.compute = [=](uint32_t, const ProgramOp& op) {
    switch (op.type) {
      case v1::OP_FORWARD_COMPUTE: return kF / s.vpp;
      case v1::OP_BACKWARD_COMPUTE: return (op.input_only ? kB / 2 : kB) / s.vpp;
      case v1::OP_BACKWARD_WEIGHT_COMPUTE: return kB / 2 / s.vpp;
      default: return 0.0;
    }
  };
  c.transfer = [=](uint32_t, const ProgramOp&) { return transfer; };
  return c;
}

TEST(PipelineScheduleTest, TorchSchedulesKeepEveryDependencyAndShortenTheStep) {
  const double one_f_one_b = (8 + 4 - 1) * (kF + kB);
  for (const char* schedule : {"schedule=interleaved", "schedule=zb", "schedule=zb,vpp=2",
                               "schedule=zbv", "schedule=dualpipev"}) {
    const PipelineSpec s = *ParsePipelineSpec(std::string("dp=2,pp=4,mb=8,") + schedule);
    const SimulatedStep step = SimulatePipelineStep(s, ChunkCosts(s, 5));
    // Fewer bubbles than 1F1B with the same work (the transfers cost little here).
    EXPECT_LT(step.end_us, one_f_one_b) << schedule;
    // Each forward starts after the previous model chunk's forward of its microbatch ended
    // (plus the transfer between stages); each backward after the next chunk's backward.
    const uint32_t chunks = s.pp * s.vpp;
    std::map<std::tuple<uint32_t, bool, uint32_t, uint32_t>, TimedOp> compute;  // d, fwd, g, mb
    for (uint32_t w = 0; w < s.workers(); ++w) {
      for (const TimedOp& op : step.workers[w]) {
        if (op.type != v1::OP_FORWARD_COMPUTE && op.type != v1::OP_BACKWARD_COMPUTE) continue;
        compute[{w % s.dp, op.type == v1::OP_FORWARD_COMPUTE, s.GlobalChunk(w / s.dp, op.chunk),
                 op.microbatch}] = op;
      }
    }
    ASSERT_EQ(compute.size(), 2u * 2 * chunks * 8) << schedule;
    for (const auto& [key, op] : compute) {
      const auto [d, forward, g, mb] = key;
      if (forward ? g == 0 : g + 1 == chunks) continue;
      const TimedOp& from = compute.at({d, forward, forward ? g - 1 : g + 1, mb});
      const bool remote = s.StageOfChunk(forward ? g - 1 : g + 1) != s.StageOfChunk(g);
      EXPECT_GE(op.start_us, from.start_us + from.duration_us + (remote ? 5 : 0))
          << schedule << " chunk " << g << " mb " << mb;
    }
    // A send never holds its worker up: some send ends after its worker's next op started.
    bool overlapped = false;
    for (const auto& ops : step.workers) {
      for (size_t i = 0; i + 1 < ops.size(); ++i) {
        if (ops[i].type != v1::OP_FORWARD_SEND && ops[i].type != v1::OP_BACKWARD_SEND) continue;
        EXPECT_GE(ops[i].duration_us, 5) << schedule;
        overlapped |= ops[i + 1].start_us < ops[i].start_us + ops[i].duration_us;
      }
    }
    EXPECT_TRUE(overlapped) << schedule;
  }
}

TEST(PipelineScheduleTest, OpTypeNamesAreTheWiresKebabCase) {
  EXPECT_EQ(OpTypeName(v1::OP_FORWARD_COMPUTE), "forward-compute");
  EXPECT_EQ(OpTypeName(v1::OP_OPTIMIZER_CLIP_MAIN_GRAD), "optimizer-clip-main-grad");
  EXPECT_EQ(OpTypeName(v1::OP_GC), "gc");
  std::map<std::string_view, int> seen;
  for (int t = 1; t <= 16; ++t) ++seen[OpTypeName(static_cast<v1::OpType>(t))];
  EXPECT_EQ(seen.size(), 16u);
}

}  // namespace
}  // namespace rankwatch
