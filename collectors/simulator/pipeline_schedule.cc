#include "collectors/simulator/pipeline_schedule.h"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <deque>

namespace rankwatch {
namespace {

bool IsCompute(v1::OpType t) {
  return t == v1::OP_FORWARD_COMPUTE || t == v1::OP_BACKWARD_COMPUTE ||
         t == v1::OP_BACKWARD_WEIGHT_COMPUTE || t == v1::OP_OPTIMIZER;
}

// The communication groups of one step, numbered densely: forward p2p (replica, boundary
// between global model chunks b and b + 1, microbatch), backward p2p (same), params
// all-gather per stage, grads reduce-scatter per stage, embedding all-reduce per replica,
// clipping.
class Groups {
 public:
  explicit Groups(const PipelineSpec& s)
      : s_(s),
        p2p_(s.dp * (s.pp * s.vpp - 1) * s.microbatches),
        all_gather_(2 * p2p_),
        reduce_scatter_(all_gather_ + s.pp),
        embedding_(reduce_scatter_ + s.pp),
        clip_(embedding_ + s.dp),
        count_(clip_ + 1) {}

  uint32_t count() const { return count_; }

  // The group of `op` on `worker`, its size, and the canonical op and lowest worker that name
  // it to StepCosts::transfer.
  struct Id {
    uint32_t index, size, lowest_worker;
    ProgramOp canonical;
  };
  Id Of(uint32_t worker, const ProgramOp& op) const {
    const uint32_t stage = worker / s_.dp, d = worker % s_.dp, mb = op.microbatch;
    const uint32_t global = s_.GlobalChunk(stage, op.chunk);
    // The group between global chunks b and b + 1: named by the lower one's chunk and by the
    // lower-indexed worker of the two.
    auto p2p = [&](uint32_t base, uint32_t b, v1::OpType send) -> Id {
      const uint32_t lower = s_.StageOfChunk(b) * s_.dp + d;
      const uint32_t upper = s_.StageOfChunk(b + 1) * s_.dp + d;
      return {base + (d * (s_.pp * s_.vpp - 1) + b) * s_.microbatches + mb,
              2,
              std::min(lower, upper),
              {send, mb, s_.LocalChunk(b)}};
    };
    switch (op.type) {
      case v1::OP_FORWARD_SEND: return p2p(0, global, v1::OP_FORWARD_SEND);
      case v1::OP_FORWARD_RECV: return p2p(0, global - 1, v1::OP_FORWARD_SEND);
      case v1::OP_BACKWARD_SEND: return p2p(p2p_, global - 1, v1::OP_BACKWARD_SEND);
      case v1::OP_BACKWARD_RECV: return p2p(p2p_, global, v1::OP_BACKWARD_SEND);
      case v1::OP_PARAMS_ALL_GATHER:
        return {all_gather_ + stage, s_.dp, stage * s_.dp, {op.type, 0}};
      case v1::OP_GRADS_REDUCE_SCATTER:
        return {reduce_scatter_ + stage, s_.dp, stage * s_.dp, {op.type, 0}};
      case v1::OP_EMBEDDING_GRADS_ALL_REDUCE: return {embedding_ + d, 2, d, {op.type, 0}};
      case v1::OP_OPTIMIZER_CLIP_MAIN_GRAD: return {clip_, s_.workers(), 0, {op.type, 0}};
      default: break;
    }
    std::fprintf(stderr, "PipelineSchedule: op %d is not a communication op\n", op.type);
    std::abort();
  }

 private:
  const PipelineSpec& s_;
  const uint32_t p2p_, all_gather_, reduce_scatter_, embedding_, clip_, count_;
};

bool ParseUint(std::string_view s, uint32_t* out) {
  if (s.empty()) return false;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && ptr == s.data() + s.size();
}

}  // namespace

absl::StatusOr<PipelineSpec> ParsePipelineSpec(std::string_view text) {
  const std::string quoted = "--parallel '" + std::string(text) + "': ";
  PipelineSpec spec;
  uint32_t vpp = 0;  // absent: the schedule's default
  bool seen_any = false;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find(',', start);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view item = text.substr(start, end - start);
    start = end + 1;
    const size_t eq = item.find('=');
    uint32_t value = 0;
    if (eq == std::string_view::npos ||
        (item.substr(0, eq) != "schedule" && !ParseUint(item.substr(eq + 1), &value))) {
      return absl::InvalidArgumentError(quoted + "expected dp=D,pp=P,tp=T[,mb=M]");
    }
    const std::string_view key = item.substr(0, eq);
    if (key == "schedule") {
      if (!ParsePipelineScheduleName(item.substr(eq + 1), &spec.schedule)) {
        return absl::InvalidArgumentError(
            quoted + "schedule is one of 1f1b, interleaved, zb, zbv, dualpipev");
      }
      seen_any = true;
      continue;
    }
    uint32_t* field = key == "dp"    ? &spec.dp
                      : key == "pp"  ? &spec.pp
                      : key == "tp"  ? &spec.tp
                      : key == "mb"  ? &spec.microbatches
                      : key == "vpp" ? &vpp
                                     : nullptr;
    if (field == nullptr) {
      return absl::InvalidArgumentError(quoted + "unknown key '" + std::string(key) +
                                        "' (dp, pp, tp, mb, schedule, vpp)");
    }
    if (value == 0) return absl::InvalidArgumentError(quoted + std::string(key) + " must be >= 1");
    *field = value;
    seen_any = true;
  }
  if (!seen_any) return absl::InvalidArgumentError(quoted + "expected dp=D,pp=P,tp=T[,mb=M]");
  if (uint64_t{spec.dp} * spec.pp * spec.tp > (uint64_t{1} << 20)) {
    return absl::InvalidArgumentError(quoted + "more than 2^20 ranks");
  }
  using K = PipelineScheduleKind;
  const K k = spec.schedule;
  spec.vpp = vpp != 0 ? vpp : (k == K::k1F1B || k == K::kZeroBubble) ? 1 : 2;
  if (uint64_t{spec.microbatches} * spec.vpp > 1024) {
    return absl::InvalidArgumentError(quoted + "mb x vpp must be <= 1024");
  }
  const std::string name(PipelineScheduleName(k));
  if (k == K::k1F1B && spec.vpp != 1) {
    return absl::InvalidArgumentError(quoted + "schedule 1f1b has one chunk a stage (vpp=1)");
  }
  if (k == K::kInterleaved1F1B && spec.vpp < 2) {
    return absl::InvalidArgumentError(quoted + "schedule interleaved needs vpp >= 2");
  }
  if ((k == K::kZbv || k == K::kDualPipeV) && (spec.vpp != 2 || spec.pp < 2)) {
    return absl::InvalidArgumentError(quoted + "schedule " + name + " needs vpp=2 and pp >= 2");
  }
  if (k == K::kDualPipeV && spec.microbatches < 2 * spec.pp) {
    return absl::InvalidArgumentError(quoted + "schedule dualpipev needs mb >= 2 x pp");
  }
  const uint32_t rounds = std::max(1u, spec.microbatches / spec.pp);
  if ((k == K::kInterleaved1F1B || k == K::kZeroBubble) && spec.microbatches % rounds != 0) {
    return absl::InvalidArgumentError(quoted + "schedule " + name + " needs mb a multiple of " +
                                      std::to_string(rounds) + " (max(1, mb / pp))");
  }
  return spec;
}

namespace {

// A torch schedule's program: its compute order with a receive before each compute whose input
// comes from another stage and a send after each whose output goes to one.
std::vector<std::vector<ProgramOp>> TorchProgram(const PipelineSpec& spec, uint32_t stage) {
  const uint32_t chunks = spec.pp * spec.vpp;
  std::vector<std::vector<ProgramOp>> program;
  auto one = [&](ProgramOp op) { program.push_back({op}); };
  if (spec.dp > 1) one({v1::OP_PARAMS_ALL_GATHER});
  auto remote = [&](uint32_t global, int delta) {
    const int64_t peer = int64_t{global} + delta;
    return peer >= 0 && peer < int64_t{chunks} &&
           spec.StageOfChunk(static_cast<uint32_t>(peer)) != stage;
  };
  for (const ComputeAction& a :
       RankComputeOrder(spec.schedule, spec.pp, spec.vpp, spec.microbatches, stage)) {
    const uint32_t g = spec.GlobalChunk(stage, a.chunk), mb = a.microbatch;
    switch (a.work) {
      case ComputeWork::kForward:
        if (remote(g, -1)) one({v1::OP_FORWARD_RECV, mb, a.chunk});
        one({v1::OP_FORWARD_COMPUTE, mb, a.chunk});
        if (remote(g, 1)) one({v1::OP_FORWARD_SEND, mb, a.chunk, false, true});
        break;
      case ComputeWork::kBackward:
      case ComputeWork::kBackwardInput:
        if (remote(g, 1)) one({v1::OP_BACKWARD_RECV, mb, a.chunk});
        one({v1::OP_BACKWARD_COMPUTE, mb, a.chunk, a.work == ComputeWork::kBackwardInput});
        if (remote(g, -1)) one({v1::OP_BACKWARD_SEND, mb, a.chunk, false, true});
        break;
      case ComputeWork::kBackwardWeight: one({v1::OP_BACKWARD_WEIGHT_COMPUTE, mb, a.chunk}); break;
    }
  }
  const bool embedding_ends = !IsVShaped(spec.schedule) && (stage == 0 || stage + 1 == spec.pp);
  if (spec.pp > 1 && embedding_ends) one({v1::OP_EMBEDDING_GRADS_ALL_REDUCE});
  if (spec.dp > 1) one({v1::OP_GRADS_REDUCE_SCATTER});
  one({v1::OP_OPTIMIZER_CLIP_MAIN_GRAD});
  one({v1::OP_OPTIMIZER});
  return program;
}

}  // namespace

std::vector<std::vector<ProgramOp>> StageProgram(const PipelineSpec& spec, uint32_t stage) {
  if (spec.schedule != PipelineScheduleKind::k1F1B) return TorchProgram(spec, stage);
  const uint32_t p = spec.pp, m = spec.microbatches;
  const bool first = stage == 0, last = stage == p - 1;
  const uint32_t warmup = std::min(p - stage - 1, m);
  const uint32_t steady = m - warmup;
  std::vector<std::vector<ProgramOp>> program;
  auto one = [&](v1::OpType t, uint32_t mb) { program.push_back({{t, mb}}); };
  if (spec.dp > 1) one(v1::OP_PARAMS_ALL_GATHER, 0);
  for (uint32_t i = 0; i < warmup; ++i) {
    if (!first) one(v1::OP_FORWARD_RECV, i);
    one(v1::OP_FORWARD_COMPUTE, i);
    if (!last) one(v1::OP_FORWARD_SEND, i);
  }
  if (steady > 0 && !first) one(v1::OP_FORWARD_RECV, warmup);
  for (uint32_t i = 0; i < steady; ++i) {
    const uint32_t fwd = warmup + i;
    one(v1::OP_FORWARD_COMPUTE, fwd);
    if (!last) program.push_back({{v1::OP_FORWARD_SEND, fwd}, {v1::OP_BACKWARD_RECV, i}});
    one(v1::OP_BACKWARD_COMPUTE, i);
    if (first) continue;
    if (i + 1 == steady) {
      one(v1::OP_BACKWARD_SEND, i);
    } else {
      program.push_back({{v1::OP_BACKWARD_SEND, i}, {v1::OP_FORWARD_RECV, fwd + 1}});
    }
  }
  for (uint32_t i = steady; i < m; ++i) {
    if (!last) one(v1::OP_BACKWARD_RECV, i);
    one(v1::OP_BACKWARD_COMPUTE, i);
    if (!first) one(v1::OP_BACKWARD_SEND, i);
  }
  if (p > 1 && (first || last)) one(v1::OP_EMBEDDING_GRADS_ALL_REDUCE, 0);
  if (spec.dp > 1) one(v1::OP_GRADS_REDUCE_SCATTER, 0);
  one(v1::OP_OPTIMIZER_CLIP_MAIN_GRAD, 0);
  one(v1::OP_OPTIMIZER, 0);
  return program;
}

SimulatedStep SimulatePipelineStep(const PipelineSpec& spec, const StepCosts& costs) {
  const uint32_t workers = spec.workers();
  std::vector<std::vector<std::vector<ProgramOp>>> programs(spec.pp);
  for (uint32_t s = 0; s < spec.pp; ++s) programs[s] = StageProgram(spec, s);

  const Groups groups(spec);
  struct GroupState {
    uint32_t started = 0;
    double latest_start = 0;
    double end = -1;  // < 0 until every member started
    std::vector<uint32_t> waiting;
  };
  std::vector<GroupState> state(groups.count());
  struct Worker {
    size_t pc = 0;
    double ready = 0;
    bool posted = false;  // the current slot's communication ops have started
  };
  std::vector<Worker> w(workers);
  SimulatedStep out;
  out.workers.resize(workers);
  std::deque<uint32_t> runnable;
  for (uint32_t i = 0; i < workers; ++i) runnable.push_back(i);
  struct Unwaited {
    uint32_t worker;
    size_t op;
    uint32_t group;
  };
  std::vector<Unwaited> unwaited;  // nonblocking sends: their ends once their groups complete

  while (!runnable.empty()) {
    const uint32_t wi = runnable.front();
    runnable.pop_front();
    Worker& me = w[wi];
    const auto& program = programs[wi / spec.dp];
    std::vector<TimedOp>& ops = out.workers[wi];
    while (me.pc < program.size()) {
      const std::vector<ProgramOp>& slot = program[me.pc];
      if (IsCompute(slot[0].type)) {
        const double d = costs.compute(wi, slot[0]);
        ops.push_back(
            {slot[0].type, slot[0].microbatch, slot[0].chunk, slot[0].input_only, me.ready, d});
        me.ready += d;
        ++me.pc;
        continue;
      }
      if (!me.posted) {
        me.posted = true;
        for (const ProgramOp& op : slot) {
          ops.push_back({op.type, op.microbatch, op.chunk, false, me.ready, -1});
          const Groups::Id id = groups.Of(wi, op);
          if (op.nonblocking) unwaited.push_back({wi, ops.size() - 1, id.index});
          GroupState& g = state[id.index];
          g.latest_start = g.started == 0 ? me.ready : std::max(g.latest_start, me.ready);
          if (++g.started == id.size) {
            g.end = g.latest_start + costs.transfer(id.lowest_worker, id.canonical);
            for (uint32_t other : g.waiting) runnable.push_back(other);
            g.waiting.clear();
          } else if (!op.nonblocking) {
            g.waiting.push_back(wi);
          }
        }
      }
      if (std::all_of(slot.begin(), slot.end(),
                      [](const ProgramOp& op) { return op.nonblocking; })) {
        me.posted = false;  // posted; its end is filled in below
        ++me.pc;
        continue;
      }
      bool done = true;
      for (const ProgramOp& op : slot) done = done && state[groups.Of(wi, op).index].end >= 0;
      if (!done) break;  // blocked: woken when the group completes
      double ready = me.ready;
      for (size_t k = 0; k < slot.size(); ++k) {
        const double end = state[groups.Of(wi, slot[k]).index].end;
        TimedOp& op = ops[ops.size() - slot.size() + k];
        op.duration_us = end - op.start_us;
        ready = std::max(ready, end);
      }
      me.ready = ready;
      me.posted = false;
      ++me.pc;
    }
  }
  for (uint32_t i = 0; i < workers; ++i) {
    if (w[i].pc != programs[i / spec.dp].size()) {
      std::fprintf(stderr, "PipelineSchedule: deadlock, worker %u stuck at slot %zu\n", i, w[i].pc);
      std::abort();
    }
    out.end_us = std::max(out.end_us, w[i].ready);
  }
  for (const Unwaited& u : unwaited) {
    TimedOp& op = out.workers[u.worker][u.op];
    op.duration_us = state[u.group].end - op.start_us;
    out.end_us = std::max(out.end_us, state[u.group].end);
  }
  return out;
}

std::string_view OpTypeName(v1::OpType type) {
  switch (type) {
    case v1::OP_FORWARD_COMPUTE: return "forward-compute";
    case v1::OP_BACKWARD_COMPUTE: return "backward-compute";
    case v1::OP_FORWARD_SEND: return "forward-send";
    case v1::OP_FORWARD_RECV: return "forward-recv";
    case v1::OP_BACKWARD_SEND: return "backward-send";
    case v1::OP_BACKWARD_RECV: return "backward-recv";
    case v1::OP_TENSOR_PARALLEL: return "tensor-parallel";
    case v1::OP_GRADS_REDUCE_SCATTER: return "grads-reduce-scatter";
    case v1::OP_PARAMS_ALL_GATHER: return "params-all-gather";
    case v1::OP_GRADS_ALL_REDUCE: return "grads-all-reduce";
    case v1::OP_LAYERNORM_GRADS_ALL_REDUCE: return "layernorm-grads-all-reduce";
    case v1::OP_EMBEDDING_GRADS_ALL_REDUCE: return "embedding-grads-all-reduce";
    case v1::OP_OPTIMIZER_CLIP_MAIN_GRAD: return "optimizer-clip-main-grad";
    case v1::OP_OPTIMIZER: return "optimizer";
    case v1::OP_GC: return "gc";
    case v1::OP_DATA_LOADING: return "data-loading";
    case v1::OP_BACKWARD_WEIGHT_COMPUTE: return "backward-weight-compute";
    default: return "unspecified";
  }
}

}  // namespace rankwatch
