// The what-if model on steps of torch.distributed.pipelining's schedules, built from the exact
// per-rank action orders PyTorch's own tests keep (tests/fixtures/pytorch-pipelining/): the
// interleaved zero-bubble schedule ZB1P (two model chunks per rank placed in a loop, weight
// gradients split off), without and with its lowered sends and receives, and DualPipeV (the V
// placement; forwards and full backwards overlapped). A step's ops are timed by running each
// rank's actions in order with fixed durations: a compute waits for its input (a receive, or
// the producer on its own rank); a receive is posted where its rank reaches it and ends a
// transfer time after the later of its post and its send's; a send is posted after its
// compute and holds nobody up. These are the model's own rules, so its simulation of the
// measured durations must give back the measured step exactly.
#include <cctype>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "operators/whatif/step_model.h"
#include "operators/whatif/whatif.h"

namespace rankwatch::whatif {
namespace {

using internal::StepModel;
using K = OpKind;
constexpr double kMs = 1000;
constexpr double kTransferMs = 1;
constexpr double kOptimizerMs = 5;

enum class Act { kF, kI, kW, kFull, kSendF, kRecvF, kSendB, kRecvB };

struct Action {
  uint32_t stage;  // global
  Act act;
  uint32_t mb;
};

// One row per rank. The ZB1P files write the input-gradient backward `B` and the full one
// `BW`; the DualPipeV file `I` and `B`.
std::vector<std::vector<Action>> ReadOrders(const std::string& file, bool zb1p_notation) {
  std::ifstream in(std::string(RANKWATCH_FIXTURES) + "/pytorch-pipelining/" + file);
  EXPECT_TRUE(in.good()) << file;
  const std::map<std::string, Act> acts = {
      {"F", Act::kF},          {"I", Act::kI},
      {"W", Act::kW},          {"B", zb1p_notation ? Act::kI : Act::kFull},
      {"BW", Act::kFull},      {"SEND_F", Act::kSendF},
      {"RECV_F", Act::kRecvF}, {"SEND_B", Act::kSendB},
      {"RECV_B", Act::kRecvB}};
  std::vector<std::vector<Action>> ranks;
  std::string line;
  while (std::getline(in, line)) {
    std::vector<Action>& out = ranks.emplace_back();
    std::stringstream cells(line);
    std::string cell;
    while (std::getline(cells, cell, ',')) {
      if (cell.empty()) continue;  // a bubble
      std::vector<std::string> parts = {cell};
      if (cell.front() == '(') {  // (a;b)OVERLAP_F_B: torch runs a, then b
        const std::string inner = cell.substr(1, cell.find(')') - 1);
        parts = {inner.substr(0, inner.find(';')), inner.substr(inner.find(';') + 1)};
      }
      for (const std::string& a : parts) {
        size_t i = 0, j = a.size();
        while (i < a.size() && std::isdigit(static_cast<unsigned char>(a[i]))) ++i;
        while (j > i && std::isdigit(static_cast<unsigned char>(a[j - 1]))) --j;
        const auto it = acts.find(a.substr(i, j - i));
        EXPECT_NE(it, acts.end()) << a;
        if (it == acts.end()) continue;
        out.push_back({static_cast<uint32_t>(std::stoul(a.substr(0, i))), it->second,
                       static_cast<uint32_t>(std::stoul(a.substr(j)))});
      }
    }
  }
  return ranks;
}

// Where global stage g runs: rank and local model chunk (two chunks per rank).
struct Placement {
  bool v = false;
  uint32_t pp = 1;
  uint32_t Rank(uint32_t g) const { return v ? (g < pp ? g : 2 * pp - 1 - g) : g % pp; }
  uint16_t Chunk(uint32_t g) const { return static_cast<uint16_t>(v ? (g < pp ? 0 : 1) : g / pp); }
};

// Times one replica's step: `factor[r]` scales rank r's computes (forward 10 ms, input and
// weight backward 10 ms each, full backward 20 ms; transfers 1 ms, optimizer 5 ms). Without
// sends and receives in the orders, each compute whose input comes from another rank has a
// receive posted just before it and each whose output goes to one a send just after it.
std::vector<std::vector<Op>> Run(const std::vector<std::vector<Action>>& orders, Placement p,
                                 const std::vector<double>& factor) {
  const uint32_t ranks = static_cast<uint32_t>(orders.size()), last = 2 * p.pp - 1;
  bool explicit_comms = false;
  for (const auto& order : orders) {
    for (const Action& a : order) explicit_comms |= a.act >= Act::kSendF;
  }
  // (forward?, receiving global stage, microbatch) -> times; (stage, forward?, mb) -> the
  // end of its compute (the input-gradient or full backward for backward).
  using Key = std::tuple<bool, uint32_t, uint32_t>;
  std::map<Key, double> send_start, recv_post;
  std::map<Key, std::pair<uint32_t, size_t>> send_op, recv_op;  // (rank, op index)
  std::map<Key, double> done;
  std::vector<std::vector<Op>> ops(ranks);
  std::vector<size_t> pc(ranks, 0);
  std::vector<double> t(ranks, 0);
  auto add = [&](uint32_t r, K kind, uint32_t g, uint32_t mb, double start, double dur) {
    ops[r].push_back(Op{kind, static_cast<uint16_t>(mb), p.Chunk(g), start, dur});
    return ops[r].size() - 1;
  };
  auto post_send = [&](uint32_t r, bool forward, uint32_t g, uint32_t mb) {
    const Key k{forward, forward ? g + 1 : g - 1, mb};
    send_start[k] = t[r];
    send_op[k] = {r, add(r, forward ? K::kForwardSend : K::kBackwardSend, g, mb, t[r], 0)};
  };
  auto post_recv = [&](uint32_t r, bool forward, uint32_t g, uint32_t mb) {
    const Key k{forward, g, mb};
    recv_post[k] = t[r];
    recv_op[k] = {r, add(r, forward ? K::kForwardRecv : K::kBackwardRecv, g, mb, t[r], 0)};
  };
  for (bool progress = true; progress;) {
    progress = false;
    for (uint32_t r = 0; r < ranks; ++r) {
      while (pc[r] < orders[r].size()) {
        const Action& a = orders[r][pc[r]];
        const uint32_t g = a.stage;
        if (a.act == Act::kSendF || a.act == Act::kSendB) {
          post_send(r, a.act == Act::kSendF, g, a.mb);
        } else if (a.act == Act::kRecvF || a.act == Act::kRecvB) {
          post_recv(r, a.act == Act::kRecvF, g, a.mb);
        } else {
          const bool forward = a.act == Act::kF;
          double ready = t[r];
          // The producer of this compute's input: the previous stage's forward, the next
          // stage's backward, or (the last stage's backward) its own forward.
          const bool has_input = a.act != Act::kW && (forward ? g > 0 : true);
          const Key producer = forward     ? Key{true, g - 1, a.mb}
                               : g == last ? Key{true, g, a.mb}
                                           : Key{false, g + 1, a.mb};
          if (has_input && p.Rank(std::get<1>(producer)) != r) {
            const Key k{forward, g, a.mb};
            if (!explicit_comms && !recv_post.contains(k)) post_recv(r, forward, g, a.mb);
            if (!send_start.contains(k)) break;  // blocked until its sender posts
            if (!recv_post.contains(k)) {
              ADD_FAILURE() << "a compute before its receive";
              return ops;
            }
            const double end = std::max(send_start[k], recv_post[k]) + kTransferMs * kMs;
            const auto [rr, ri] = recv_op[k];
            ops[rr][ri].duration_us = end - ops[rr][ri].start_us;
            ready = std::max(ready, end);
          } else if (has_input) {
            if (!done.contains(producer)) {
              ADD_FAILURE() << "a local input before its producer";
              return ops;
            }
            ready = std::max(ready, done[producer]);
          }
          const double ms = a.act == Act::kFull ? 20 : 10;
          const K kind = a.act == Act::kW ? K::kBackwardWeightCompute
                         : forward        ? K::kForwardCompute
                                          : K::kBackwardCompute;
          const double dur = ms * kMs * factor[r];
          add(r, kind, g, a.mb, ready, dur);
          t[r] = ready + dur;
          if (a.act != Act::kW) done[{forward, g, a.mb}] = t[r];
          const bool sends = a.act != Act::kW && (forward ? g < last : g > 0);
          const uint32_t to = forward ? g + 1 : g - 1;
          if (!explicit_comms && sends && p.Rank(to) != r) post_send(r, forward, g, a.mb);
        }
        ++pc[r];
        progress = true;
      }
    }
  }
  for (uint32_t r = 0; r < ranks; ++r) {
    EXPECT_EQ(pc[r], orders[r].size()) << "rank " << r << " deadlocked";
  }
  for (const auto& [k, where] : send_op) {
    EXPECT_TRUE(recv_post.contains(k)) << "a send without its receive";
    const double end = std::max(send_start[k], recv_post[k]) + kTransferMs * kMs;
    ops[where.first][where.second].duration_us = end - send_start[k];
  }
  for (uint32_t r = 0; r < ranks; ++r) {
    ops[r].push_back(Op{K::kOptimizer, 0, 0, t[r], kOptimizerMs * kMs});
  }
  return ops;
}

// `dp` replicas of the schedule; `factor[d][r]` scales replica d's rank r.
StepOps Step(uint64_t step, const std::vector<std::vector<Action>>& orders, Placement p,
             const std::vector<std::vector<double>>& factor) {
  const auto dp = static_cast<uint32_t>(factor.size());
  StepOps s;
  s.step = step;
  s.workers.resize(dp * p.pp);
  for (uint32_t d = 0; d < dp; ++d) {
    std::vector<std::vector<Op>> ops = Run(orders, p, factor[d]);
    for (uint32_t r = 0; r < p.pp; ++r) s.workers[r * dp + d] = std::move(ops[r]);
  }
  return s;
}

StepModel::Pairing PairingOf(const Layout& layout, const StepOps& step) {
  std::vector<internal::WorkerIndex> index(step.workers.size());
  for (size_t w = 0; w < index.size(); ++w) index[w].Build(step.workers[w]);
  auto model = internal::BuildStepModel(layout, step, index, {});
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? (*model)->pairing : StepModel::Pairing::kByOrder;
}

double Measured(const StepOps& s) {
  double first = 1e300, last = -1e300;
  for (const auto& ops : s.workers) {
    for (const Op& op : ops) {
      first = std::min(first, op.start_us);
      last = std::max(last, op.start_us + op.duration_us);
    }
  }
  return last - first;
}

size_t CountKind(const StepOps& s, K kind) {
  size_t n = 0;
  for (const auto& ops : s.workers) {
    for (const Op& op : ops) n += op.kind == kind;
  }
  return n;
}

TEST(WhatifSchedules, Zb1pComputeOrderPairsItsTransfersAcrossTheLoop) {
  const auto orders = ReadOrders("zb1p_2rank_2stagep_compute.csv", true);
  ASSERT_EQ(orders.size(), 2u);
  const Placement p{.v = false, .pp = 2};
  const Layout layout{.dp = 1, .pp = 2, .tp = 1, .vpp = 2};
  const StepOps balanced = Step(0, orders, p, {{1, 1}});
  // 8 microbatches x 4 global stages: 32 forwards, 32 input and 32 weight backwards; a send
  // and a receive for each of the 3 stage boundaries in each direction and microbatch.
  EXPECT_EQ(CountKind(balanced, K::kBackwardWeightCompute), 32u);
  EXPECT_EQ(CountKind(balanced, K::kForwardSend), 24u);
  EXPECT_EQ(PairingOf(layout, balanced), StepModel::Pairing::kInterleaved);

  Analyzer a(layout, Options{});
  for (uint64_t i = 0; i < 4; ++i) {
    const absl::Status st = a.AddStep(Step(i, orders, p, {{1, 1}}));
    ASSERT_TRUE(st.ok()) << st;
  }
  WindowResult r = a.Window();
  EXPECT_DOUBLE_EQ(r.actual_us, Measured(balanced));
  EXPECT_DOUBLE_EQ(r.slowdown, 1);
  EXPECT_DOUBLE_EQ(r.typical_us[static_cast<int>(K::kBackwardWeightCompute)], 10 * kMs);

  // Rank 1 (global stages 1 and 3) computes 1.5x: the model replays it exactly, and the
  // slowdown is that stage's.
  Analyzer slow(layout, Options{});
  const StepOps s = Step(0, orders, p, {{1, 1.5}});
  ASSERT_TRUE(slow.AddStep(s).ok());
  r = slow.Window();
  EXPECT_DOUBLE_EQ(r.actual_us, Measured(s));
  EXPECT_GT(r.slowdown, 1.15);
  EXPECT_EQ(r.m_s_stage, 1u);
  EXPECT_GT(r.decomposition.by_stage[1], 1.15);
  EXPECT_LT(r.decomposition.by_stage[0], 1.05);
}

TEST(WhatifSchedules, Zb1pWithEarlyReceivesAndMergedBackwards) {
  // The lowered schedule: receives posted as early as torch posts them, and rank 0's input and
  // weight backwards merged into full backwards (backward-compute ops with no W beside them),
  // while rank 1 keeps them split.
  const auto orders = ReadOrders("zb1p_2rank_2stagep_comms.csv", true);
  const Placement p{.v = false, .pp = 2};
  const Layout layout{.dp = 1, .pp = 2, .tp = 1, .vpp = 2};
  const StepOps balanced = Step(0, orders, p, {{1, 1}});
  EXPECT_EQ(CountKind(balanced, K::kBackwardWeightCompute), 16u);  // rank 1's
  EXPECT_EQ(PairingOf(layout, balanced), StepModel::Pairing::kInterleaved);
  Analyzer a(layout, Options{});
  ASSERT_TRUE(a.AddStep(balanced).ok());
  WindowResult r = a.Window();
  EXPECT_DOUBLE_EQ(r.actual_us, Measured(balanced));
  // Full backwards are ideally an input and a weight backward: 20 ms, as measured.
  EXPECT_DOUBLE_EQ(r.slowdown, 1);

  // Rank 0 computes 1.5x: its full backwards are the only ones, and their ideal comes from rank
  // 1's split ones, so the slow stage stays visible.
  Analyzer slow(layout, Options{});
  const StepOps s = Step(0, orders, p, {{1.5, 1}});
  ASSERT_TRUE(slow.AddStep(s).ok());
  r = slow.Window();
  EXPECT_DOUBLE_EQ(r.actual_us, Measured(s));
  EXPECT_GT(r.slowdown, 1.2);
  EXPECT_EQ(r.m_s_stage, 0u);
  EXPECT_LT(r.decomposition.by_stage[1], 1.05);
}

TEST(WhatifSchedules, SendsWaitedForAtTheStepsEndChangeNothing) {
  // torch waits for its asynchronous sends only at the step's end: a send's op may last until
  // then. Nothing waits for a send, so the step, its ideal and its slowdown stay as they were.
  const auto orders = ReadOrders("zb1p_2rank_2stagep_comms.csv", true);
  const Layout layout{.dp = 1, .pp = 2, .tp = 1, .vpp = 2};
  for (const double slow : {1.0, 1.5}) {
    const StepOps s = Step(0, orders, Placement{.v = false, .pp = 2}, {{slow, 1}});
    StepOps late = s;
    for (auto& ops : late.workers) {
      const double end = ops.back().start_us;  // the optimizer's start
      for (Op& op : ops) {
        if (op.kind == K::kForwardSend || op.kind == K::kBackwardSend) {
          op.duration_us = end - op.start_us;
        }
      }
    }
    Analyzer a(layout, Options{}), b(layout, Options{});
    ASSERT_TRUE(a.AddStep(s).ok());
    ASSERT_TRUE(b.AddStep(late).ok());
    const WindowResult ra = a.Window(), rb = b.Window();
    EXPECT_DOUBLE_EQ(rb.actual_us, ra.actual_us) << slow;
    EXPECT_DOUBLE_EQ(rb.ideal_us, ra.ideal_us) << slow;
    EXPECT_DOUBLE_EQ(rb.slowdown, ra.slowdown) << slow;
  }
}

TEST(WhatifSchedules, DualPipeVPairsBothDirectionsOfTheV) {
  const auto orders = ReadOrders("dualpipev_4rank_10mb.csv", false);
  ASSERT_EQ(orders.size(), 4u);
  const Placement p{.v = true, .pp = 4};
  const Layout layout{.dp = 1, .pp = 4, .tp = 1, .vpp = 2};
  const StepOps balanced = Step(0, orders, p, {{1, 1, 1, 1}});
  // The turn of the V (global stages 3 and 4, both on rank 3) is local: 6 boundaries cross
  // ranks, in each direction, for 10 microbatches.
  EXPECT_EQ(CountKind(balanced, K::kForwardSend), 60u);
  EXPECT_EQ(CountKind(balanced, K::kBackwardRecv), 60u);
  EXPECT_EQ(PairingOf(layout, balanced), StepModel::Pairing::kV);
  Analyzer a(layout, Options{});
  ASSERT_TRUE(a.AddStep(balanced).ok());
  WindowResult r = a.Window();
  EXPECT_DOUBLE_EQ(r.actual_us, Measured(balanced));
  EXPECT_DOUBLE_EQ(r.slowdown, 1);

  for (uint32_t slow_rank = 0; slow_rank < 4; ++slow_rank) {
    std::vector<double> factor(4, 1.0);
    factor[slow_rank] = 1.3;
    Analyzer slow(layout, Options{});
    const StepOps s = Step(0, orders, p, {factor});
    ASSERT_TRUE(slow.AddStep(s).ok());
    r = slow.Window();
    EXPECT_DOUBLE_EQ(r.actual_us, Measured(s)) << slow_rank;
    EXPECT_GT(r.slowdown, 1.1) << slow_rank;
    EXPECT_EQ(r.m_s_stage, slow_rank);
  }
}

TEST(WhatifSchedules, ASlowWorkerOfOneReplica) {
  // Two replicas of ZB1P; replica 1's rank 0 computes 1.4x.
  const auto orders = ReadOrders("zb1p_2rank_2stagep_compute.csv", true);
  const Placement p{.v = false, .pp = 2};
  Analyzer a(Layout{.dp = 2, .pp = 2, .tp = 1, .vpp = 2}, Options{});
  for (uint64_t i = 0; i < 4; ++i) {
    const absl::Status st = a.AddStep(Step(i, orders, p, {{1, 1}, {1.4, 1}}));
    ASSERT_TRUE(st.ok()) << st;
  }
  const WindowResult r = a.Window();
  EXPECT_GT(r.slowdown, 1.2);
  EXPECT_LT(r.decomposition.by_dp_rank[0], 1.02);
  EXPECT_GT(r.decomposition.by_dp_rank[1], 1.2);
  EXPECT_EQ(r.m_s_stage, 0u);
  ASSERT_FALSE(r.m_w_workers.empty());
  EXPECT_EQ(r.m_w_workers[0], 1u);  // stage 0 x dp 2 + data rank 1
}

TEST(WhatifSchedules, AReceiveWithoutItsSendIsRejected) {
  const auto orders = ReadOrders("dualpipev_4rank_10mb.csv", false);
  StepOps s = Step(0, orders, Placement{.v = true, .pp = 4}, {{1, 1, 1, 1}});
  auto& ops = s.workers[1];
  for (size_t i = 0; i < ops.size(); ++i) {
    if (ops[i].kind == K::kForwardSend) {
      ops.erase(ops.begin() + static_cast<std::ptrdiff_t>(i));
      break;
    }
  }
  Analyzer a(Layout{.dp = 1, .pp = 4, .tp = 1, .vpp = 2}, Options{});
  const absl::Status st = a.AddStep(s);
  EXPECT_FALSE(st.ok());
  EXPECT_EQ(a.steps(), 0u);
}

}  // namespace
}  // namespace rankwatch::whatif
