#include "operators/whatif/step_model.h"

#include <algorithm>
#include <deque>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>

#include "absl/status/status.h"

namespace rankwatch::whatif::internal {
namespace {

bool IsChainKind(OpKind k) {
  return k == OpKind::kForwardCompute || k == OpKind::kBackwardCompute ||
         k == OpKind::kBackwardWeightCompute || k == OpKind::kDataLoading;
}

// Kinds with a node per op (GC has slots instead).
bool IsOpNodeKind(OpKind k) { return IsModelled(k) && k != OpKind::kGc; }

size_t K(OpKind k) { return static_cast<size_t>(k); }

constexpr OpKind kP2pKinds[] = {OpKind::kForwardSend, OpKind::kForwardRecv, OpKind::kBackwardSend,
                                OpKind::kBackwardRecv};
int P2pSlot(OpKind k) { return static_cast<int>(k) - static_cast<int>(OpKind::kForwardSend); }

// An op's microbatch and model chunk as one key.
uint32_t Key(const Op& op) { return (uint32_t{op.microbatch} << 16) | op.chunk; }

// The stage and local chunk of global model chunk `g` (the inverse of GlobalChunk).
std::pair<uint32_t, uint32_t> Locate(StepModel::Pairing pairing, uint32_t pp, uint32_t g) {
  if (pairing == StepModel::Pairing::kV)
    return g < pp ? std::pair(g, 0u) : std::pair(2 * pp - 1 - g, 1u);
  return {g % pp, g / pp};
}

absl::Status Invalid(const std::string& why) { return absl::InvalidArgumentError(why); }

class Builder {
 public:
  Builder(const Layout& layout, const StepOps& step, const std::vector<WorkerIndex>& index,
          StepModel* m)
      : layout_(layout), step_(step), index_(index), m_(m) {}

  absl::Status Build() {
    FullBackwards();
    LayOutNodes();
    valid_.assign(layout_.pp, {});
    m_->pairing = KeyedPairing();
    for (uint32_t s = 0; s < layout_.pp; ++s) {
      if (absl::Status st = StageEdges(s); !st.ok()) return st;
    }
    if (absl::Status st = Groups(); !st.ok()) return st;
    BuildDeps();
    return Schedule();
  }

 private:
  const std::vector<Op>& Ops(uint32_t s) const { return step_.workers[s * layout_.dp]; }
  const WorkerIndex& Index(uint32_t s) const { return index_[s * layout_.dp]; }
  uint32_t Node(uint32_t s, OpKind k, uint32_t seq) const {
    const StageModel& st = m_->stages[s];
    return st.first + st.kind_first[K(k)] + seq;
  }
  uint32_t NodeOfOp(uint32_t s, uint32_t op) const {
    return Node(s, Ops(s)[op].kind, Index(s).seq[op]);
  }
  void Link(uint32_t pred, uint32_t succ) { edges_.emplace_back(succ, pred); }
  std::string Where(uint32_t s) const {
    return "step " + std::to_string(step_.step) + ", stage " + std::to_string(s) + ": ";
  }

  void LayOutNodes() {
    m_->stages.resize(layout_.pp);
    uint32_t next = 0;
    for (uint32_t s = 0; s < layout_.pp; ++s) {
      StageModel& st = m_->stages[s];
      const WorkerIndex& rep = Index(s);
      st.first = next;
      uint32_t local = 0;
      for (int k = 0; k < kOpKindCount; ++k) {
        const auto kind = static_cast<OpKind>(k);
        st.kind_first[k] = local;
        st.kind_count[k] = IsOpNodeKind(kind) ? rep.Count(kind) : 0;
        local += st.kind_count[k];
      }
      st.chain_len = static_cast<uint32_t>(rep.chain.size());
      st.gc_slot.assign(st.chain_len + 1, -1);
      for (uint32_t d = 0; d < layout_.dp; ++d) {
        for (uint32_t pos : index_[s * layout_.dp + d].gc_pos) {
          if (pos <= st.chain_len) st.gc_slot[pos] = 0;  // CheckDataRanksAgree: always
        }
      }
      st.gc_slot[st.chain_len] = 0;
      for (int32_t& slot : st.gc_slot) {
        if (slot == 0) slot = static_cast<int32_t>(local++);
      }
      st.count = local;
      next += local;
      for (uint32_t i = 0; i < st.count; ++i) {
        m_->stage.push_back(static_cast<uint16_t>(s));
      }
      for (int k = 0; k < kOpKindCount; ++k) {
        for (uint32_t i = 0; i < st.kind_count[k]; ++i) {
          m_->kind.push_back(static_cast<OpKind>(k));
          const bool full = k == static_cast<int>(OpKind::kBackwardCompute) && full_[s][i];
          m_->typical.push_back(static_cast<uint8_t>(full ? kFullBackwardTypical : k));
        }
      }
      for (uint32_t pos = 0; pos <= st.chain_len; ++pos) {
        if (st.gc_slot[pos] < 0) continue;
        m_->kind.push_back(OpKind::kGc);
        m_->typical.push_back(
            static_cast<uint8_t>(pos == st.chain_len ? K(OpKind::kGc) : kZeroTypical));
      }
      if (rep.Count(OpKind::kGradsAllReduce) > 0) m_->overlapped_dp = true;
    }
    m_->nodes = next;
    m_->group.assign(next, -1);
  }

  absl::Status StageEdges(uint32_t s) {
    const std::vector<Op>& ops = Ops(s);
    const WorkerIndex& wi = Index(s);
    const StageModel& st = m_->stages[s];
    for (uint32_t op : wi.chain) {
      if (ops[op].chunk >= layout_.vpp) {
        return Invalid(Where(s) + std::string(OpKindName(ops[op].kind)) + " of model chunk " +
                       std::to_string(ops[op].chunk) + ", but vpp is " +
                       std::to_string(layout_.vpp));
      }
    }

    // The compute chain, GC slots in their places; it ends with the slot after the last compute.
    int64_t prev = -1;
    for (uint32_t pos = 0; pos <= st.chain_len; ++pos) {
      if (st.gc_slot[pos] >= 0) {
        const uint32_t slot = st.first + static_cast<uint32_t>(st.gc_slot[pos]);
        if (prev >= 0) Link(static_cast<uint32_t>(prev), slot);
        prev = slot;
      }
      if (pos < st.chain_len) {
        const uint32_t node = NodeOfOp(s, wi.chain[pos]);
        if (prev >= 0) Link(static_cast<uint32_t>(prev), node);
        prev = node;
      }
    }
    const auto tail = static_cast<uint32_t>(prev);

    if (m_->pairing == StepModel::Pairing::kByOrder) {
      if (absl::Status status = PipelineEdges(s); !status.ok()) return status;
    } else {
      KeyedPipelineEdges(s);
    }
    WeightEdges(s);
    DataParallelEdges(s);

    // After the last compute: layernorm -> embedding -> reduce-scatters (or the separate grads
    // all-reduce) -> clip -> optimizer. With overlapped reduce-scatters the chain also waits
    // for the last of them.
    std::vector<uint32_t> heads = {tail};
    std::vector<OpKind> post = {OpKind::kLayernormGradsAllReduce, OpKind::kEmbeddingGradsAllReduce};
    if (m_->overlapped_dp) {
      if (const uint32_t n = wi.Count(OpKind::kGradsReduceScatter); n > 0) {
        heads.push_back(Node(s, OpKind::kGradsReduceScatter, n - 1));
      }
      post.push_back(OpKind::kGradsAllReduce);
    } else {
      post.push_back(OpKind::kGradsReduceScatter);
    }
    post.push_back(OpKind::kOptimizerClipMainGrad);
    post.push_back(OpKind::kOptimizer);
    for (OpKind k : post) {
      for (uint32_t i = 0; i < wi.Count(k); ++i) {
        const uint32_t node = Node(s, k, i);
        for (uint32_t h : heads) Link(h, node);
        heads = {node};
      }
    }
    return absl::OkStatus();
  }

  // Matches each send/receive with the compute it feeds or follows; a send or receive with no
  // peer (before the first or after the last model chunk, or outside the schedule) is a no-op.
  absl::Status PipelineEdges(uint32_t s) {
    const std::vector<Op>& ops = Ops(s);
    const WorkerIndex& wi = Index(s);
    const uint32_t total_chunks = layout_.vpp * layout_.pp;
    for (OpKind k : kP2pKinds) {
      const auto list = wi.Kind(k);
      for (size_t i = 1; i < list.size(); ++i) {
        Link(Node(s, k, static_cast<uint32_t>(i - 1)), Node(s, k, static_cast<uint32_t>(i)));
      }
    }
    for (const bool forward : {true, false}) {
      const OpKind compute_kind = forward ? OpKind::kForwardCompute : OpKind::kBackwardCompute;
      const auto computes = wi.Kind(compute_kind);
      double last_start = -1e300, first_end = 1e300;
      for (uint32_t c : computes) {
        last_start = std::max(last_start, ops[c].start_us);
        first_end = std::min(first_end, ops[c].start_us + ops[c].duration_us);
      }
      for (const bool send : {true, false}) {
        const OpKind kind = forward ? (send ? OpKind::kForwardSend : OpKind::kForwardRecv)
                                    : (send ? OpKind::kBackwardSend : OpKind::kBackwardRecv);
        const auto list = wi.Kind(kind);
        auto in_schedule = [&](uint32_t op) {
          if (computes.empty()) return false;
          return send ? ops[op].start_us + ops[op].duration_us >= first_end - kP2pMatchEpsUs
                      : ops[op].start_us <= last_start + kP2pMatchEpsUs;
        };
        const auto n = static_cast<uint32_t>(computes.size());
        uint32_t count = 0;
        for (uint32_t op : list) count += in_schedule(op);
        uint32_t compute_id = 0;
        if (count != n && !list.empty()) {
          if (s != 0 && s + 1 != layout_.pp) {
            return Invalid(Where(s) + std::to_string(count) + " " + std::string(OpKindName(kind)) +
                           " ops for " + std::to_string(n) + " " +
                           std::string(OpKindName(compute_kind)) +
                           " ops (only the first and last stage may lack some)");
          }
          if (count + 1 != n && count != 0) {
            return Invalid(Where(s) + std::to_string(count) + " " + std::string(OpKindName(kind)) +
                           " ops for " + std::to_string(n) + " " +
                           std::string(OpKindName(compute_kind)) + " ops");
          }
          if (!send && count + 1 == n) compute_id = 1;  // the first receive is not recorded
        }
        const int delta = (forward == send) ? 1 : -1;
        for (uint32_t op : list) {
          const uint32_t node = NodeOfOp(s, op);
          if (!in_schedule(op) || compute_id >= n) {
            noop_.push_back(node);
            continue;
          }
          const uint32_t c = computes[compute_id];
          const uint32_t compute_node = Node(s, compute_kind, compute_id);
          if (send) {
            Link(compute_node, node);
          } else {
            Link(node, compute_node);
            if (compute_id > 0) Link(Node(s, compute_kind, compute_id - 1), node);
          }
          ++compute_id;
          const int64_t peer_chunk =
              int64_t{ops[c].chunk} * layout_.pp + s + static_cast<int64_t>(delta);
          if (peer_chunk < 0 || peer_chunk >= int64_t{total_chunks}) {
            noop_.push_back(node);
          } else {
            valid_[s][P2pSlot(kind)].push_back(node);
          }
        }
      }
    }
    // The first backward send and receive wait for the forward compute two before the first
    // backward compute (the warm-up's last forward sends overlap them).
    std::vector<uint32_t> computes;
    for (uint32_t op : wi.chain) {
      if (ops[op].kind != OpKind::kDataLoading) computes.push_back(op);
    }
    for (size_t i = 0; i < computes.size(); ++i) {
      if (ops[computes[i]].kind != OpKind::kBackwardCompute) continue;
      if (i >= 2 && ops[computes[i - 1]].kind == OpKind::kForwardCompute &&
          ops[computes[i - 2]].kind == OpKind::kForwardCompute) {
        const uint32_t pred = NodeOfOp(s, computes[i - 2]);
        for (OpKind k : {OpKind::kBackwardRecv, OpKind::kBackwardSend}) {
          if (wi.Count(k) > 0) Link(pred, Node(s, k, 0));
        }
      }
      break;
    }
    return absl::OkStatus();
  }

  bool AnyWeightOps() const {
    for (uint32_t s = 0; s < layout_.pp; ++s) {
      if (Index(s).Count(OpKind::kBackwardWeightCompute) > 0) return true;
    }
    return false;
  }

  // Keys of a kind's ops on stage s in seq order; false when two share a key.
  bool KeysOf(uint32_t s, OpKind k, std::unordered_map<uint32_t, uint32_t>* out) const {
    const auto list = Index(s).Kind(k);
    out->clear();
    for (uint32_t i = 0; i < list.size(); ++i) {
      if (!out->emplace(Key(Ops(s)[list[i]]), i).second) return false;
    }
    return true;
  }

  // In a step with weight-gradient ops, a stage's backward-compute ops with no weight-gradient
  // op of their microbatch and chunk are full backwards (both parts in one op: torch's
  // FULL_BACKWARD beside BACKWARD_INPUT). Without distinct keys, none is.
  void FullBackwards() {
    full_.assign(layout_.pp, {});
    const bool any_weight = AnyWeightOps();
    std::unordered_map<uint32_t, uint32_t> backs, weights;
    for (uint32_t s = 0; s < layout_.pp; ++s) {
      const WorkerIndex& wi = Index(s);
      full_[s].assign(wi.Count(OpKind::kBackwardCompute), false);
      if (!any_weight || wi.Count(OpKind::kBackwardWeightCompute) >= full_[s].size()) continue;
      if (!KeysOf(s, OpKind::kBackwardCompute, &backs) ||
          !KeysOf(s, OpKind::kBackwardWeightCompute, &weights)) {
        continue;
      }
      for (const auto& [key, seq] : backs) full_[s][seq] = !weights.contains(key);
    }
  }

  // Matches sends with receives by microbatch and model chunk when the step has model chunks
  // or weight-gradient ops (torch.distributed.pipelining's interleaved, zero-bubble and V
  // schedules record only the real transfers): every send, receive and compute of a direction
  // has a distinct key on its stage, each send or receive names a compute of its stage, and
  // under one placement of the model chunks every send finds its peer's receive and every
  // receive its sender. kByOrder otherwise (Megatron's schedules, the study's traces).
  StepModel::Pairing KeyedPairing() {
    if (layout_.vpp < 2 && !AnyWeightOps()) return StepModel::Pairing::kByOrder;
    keys_.assign(layout_.pp, {});
    for (uint32_t s = 0; s < layout_.pp; ++s) {
      StageKeys& k = keys_[s];
      if (!KeysOf(s, OpKind::kForwardCompute, &k.compute[0]) ||
          !KeysOf(s, OpKind::kBackwardCompute, &k.compute[1])) {
        return StepModel::Pairing::kByOrder;
      }
      for (OpKind kind : kP2pKinds) {
        if (!KeysOf(s, kind, &k.p2p[P2pSlot(kind)])) return StepModel::Pairing::kByOrder;
        const bool forward = kind == OpKind::kForwardSend || kind == OpKind::kForwardRecv;
        for (const auto& [key, seq] : k.p2p[P2pSlot(kind)]) {
          if ((key & 0xffff) >= layout_.vpp || !k.compute[forward ? 0 : 1].contains(key)) {
            return StepModel::Pairing::kByOrder;
          }
        }
      }
    }
    for (const auto pairing : {StepModel::Pairing::kInterleaved, StepModel::Pairing::kV}) {
      if (pairing == StepModel::Pairing::kV && layout_.vpp != 2) continue;
      if (MatchUnder(pairing)) return pairing;
    }
    pairs_.clear();
    return StepModel::Pairing::kByOrder;
  }

  bool MatchUnder(StepModel::Pairing pairing) {
    pairs_.clear();
    const uint32_t pp = layout_.pp;
    const int64_t total = int64_t{pp} * layout_.vpp;
    std::vector<std::array<std::vector<bool>, 4>> used(pp);
    for (uint32_t s = 0; s < pp; ++s) {
      for (OpKind kind : kP2pKinds) used[s][P2pSlot(kind)].assign(Index(s).Count(kind), false);
    }
    for (uint32_t s = 0; s < pp; ++s) {
      for (const bool forward : {true, false}) {
        const OpKind send = forward ? OpKind::kForwardSend : OpKind::kBackwardSend;
        const OpKind recv = forward ? OpKind::kForwardRecv : OpKind::kBackwardRecv;
        const auto list = Index(s).Kind(send);
        for (uint32_t i = 0; i < list.size(); ++i) {
          const Op& op = Ops(s)[list[i]];
          const int64_t g = int64_t{GlobalChunk(pairing, pp, s, op.chunk)} + (forward ? 1 : -1);
          if (g < 0 || g >= total) return false;
          const auto [t, chunk] = Locate(pairing, pp, static_cast<uint32_t>(g));
          const auto& receives = keys_[t].p2p[P2pSlot(recv)];
          const auto it = receives.find((uint32_t{op.microbatch} << 16) | chunk);
          if (it == receives.end() || used[t][P2pSlot(recv)][it->second]) return false;
          used[t][P2pSlot(recv)][it->second] = true;
          pairs_.emplace_back(Node(s, send, i), Node(t, recv, it->second));
        }
      }
    }
    for (uint32_t s = 0; s < pp; ++s) {
      for (OpKind recv : {OpKind::kForwardRecv, OpKind::kBackwardRecv}) {
        const auto& u = used[s][P2pSlot(recv)];
        if (std::find(u.begin(), u.end(), false) != u.end()) return false;
      }
    }
    return true;
  }

  // Keyed: a send follows the compute of its microbatch and chunk, a receive precedes it and is
  // posted where its rank reached it: after the last compute (before that one) that started
  // before it. This holds whether a rank posts its receives early and waits for them in the
  // compute (torch's schedules) or posts each just before it (Megatron's). Sends do not wait for
  // each other (asynchronous, waited for at the step's end); a receive's group ends its
  // transfer time after the later of its start and its send's.
  void KeyedPipelineEdges(uint32_t s) {
    const StageKeys& k = keys_[s];
    const std::vector<Op>& ops = Ops(s);
    const WorkerIndex& wi = Index(s);
    std::vector<uint32_t> chain_pos(ops.size(), 0);
    for (uint32_t pos = 0; pos < wi.chain.size(); ++pos) chain_pos[wi.chain[pos]] = pos;
    for (OpKind kind : kP2pKinds) {
      const bool forward = kind == OpKind::kForwardSend || kind == OpKind::kForwardRecv;
      const bool send = kind == OpKind::kForwardSend || kind == OpKind::kBackwardSend;
      const OpKind compute_kind = forward ? OpKind::kForwardCompute : OpKind::kBackwardCompute;
      const auto list = wi.Kind(kind);
      for (uint32_t i = 0; i < list.size(); ++i) {
        const Op& op = ops[list[i]];
        const uint32_t seq = k.compute[forward ? 0 : 1].at(Key(op));
        const uint32_t compute = Node(s, compute_kind, seq);
        const uint32_t node = Node(s, kind, i);
        if (send) {
          Link(compute, node);
          continue;
        }
        Link(node, compute);
        const auto first = wi.chain.begin();
        const auto last = first + chain_pos[wi.Kind(compute_kind)[seq]];
        const auto after = std::partition_point(
            first, last, [&](uint32_t c) { return ops[c].start_us < op.start_us; });
        if (after != first) Link(NodeOfOp(s, *(after - 1)), node);
      }
    }
  }

  // A weight-gradient op follows the backward of its microbatch and chunk on its stage (the
  // compute chain orders them too; this rejects a step whose times put the two the wrong way
  // round). It sends nothing.
  void WeightEdges(uint32_t s) {
    if (Index(s).Count(OpKind::kBackwardWeightCompute) == 0) return;
    std::unordered_map<uint32_t, uint32_t> backs;
    if (!KeysOf(s, OpKind::kBackwardCompute, &backs)) return;
    const auto weights = Index(s).Kind(OpKind::kBackwardWeightCompute);
    for (uint32_t i = 0; i < weights.size(); ++i) {
      const auto it = backs.find(Key(Ops(s)[weights[i]]));
      if (it != backs.end()) {
        Link(Node(s, OpKind::kBackwardCompute, it->second),
             Node(s, OpKind::kBackwardWeightCompute, i));
      }
    }
  }

  void DataParallelEdges(uint32_t s) {
    const std::vector<Op>& ops = Ops(s);
    const WorkerIndex& wi = Index(s);
    // Params all-gathers and grads reduce-scatters share one stream, in start order.
    std::vector<uint32_t> stream;
    for (OpKind k : {OpKind::kParamsAllGather, OpKind::kGradsReduceScatter}) {
      for (uint32_t op : wi.Kind(k)) stream.push_back(op);
    }
    std::sort(stream.begin(), stream.end(), [&](uint32_t a, uint32_t b) {
      return std::tuple(ops[a].start_us, wi.seq[a], ops[a].kind) <
             std::tuple(ops[b].start_us, wi.seq[b], ops[b].kind);
    });
    for (size_t i = 1; i < stream.size(); ++i) {
      Link(NodeOfOp(s, stream[i - 1]), NodeOfOp(s, stream[i]));
    }
    // A chunk's first forward compute waits for the chunk's last params all-gather.
    const auto forwards = wi.Kind(OpKind::kForwardCompute);
    const auto gathers = wi.Kind(OpKind::kParamsAllGather);
    std::vector<bool> done(layout_.vpp + 1, false);
    for (size_t i = gathers.size(); i-- > 0;) {
      const uint32_t chunk = std::min<uint32_t>(ops[gathers[i]].chunk, layout_.vpp);
      if (done[chunk]) continue;
      done[chunk] = true;
      for (size_t f = 0; f < forwards.size(); ++f) {
        if (ops[forwards[f]].chunk == chunk) {
          Link(Node(s, OpKind::kParamsAllGather, static_cast<uint32_t>(i)),
               Node(s, OpKind::kForwardCompute, static_cast<uint32_t>(f)));
          break;
        }
      }
    }
    if (!m_->overlapped_dp) return;
    // Overlapped: a chunk's first reduce-scatter waits for the chunk's last backward compute
    // (or weight-gradient op: the gradients are complete once both parts ran).
    const auto scatters = wi.Kind(OpKind::kGradsReduceScatter);
    std::fill(done.begin(), done.end(), false);
    for (size_t i = 0; i < scatters.size(); ++i) {
      const uint32_t chunk = std::min<uint32_t>(ops[scatters[i]].chunk, layout_.vpp);
      if (done[chunk]) continue;
      done[chunk] = true;
      int64_t last = -1;
      double last_end = 0;
      for (OpKind k : {OpKind::kBackwardCompute, OpKind::kBackwardWeightCompute}) {
        const auto list = wi.Kind(k);
        for (size_t b = 0; b < list.size(); ++b) {
          const Op& op = ops[list[b]];
          if (op.chunk != chunk) continue;
          if (last < 0 || op.start_us + op.duration_us >= last_end) {
            last = Node(s, k, static_cast<uint32_t>(b));
            last_end = op.start_us + op.duration_us;
          }
        }
      }
      if (last >= 0) {
        Link(static_cast<uint32_t>(last),
             Node(s, OpKind::kGradsReduceScatter, static_cast<uint32_t>(i)));
      }
    }
  }

  absl::Status Groups() {
    std::vector<std::vector<uint32_t>> groups;
    std::vector<uint8_t> synced;
    auto add = [&](std::vector<uint32_t> members, bool sync) {
      groups.push_back(std::move(members));
      synced.push_back(sync ? 1 : 0);
    };
    const uint32_t pp = layout_.pp;
    for (const auto& [send, recv] : pairs_) add({send, recv}, false);
    for (uint32_t s = 0; s < pp && m_->pairing == StepModel::Pairing::kByOrder; ++s) {
      for (const bool forward : {true, false}) {
        const OpKind send = forward ? OpKind::kForwardSend : OpKind::kBackwardSend;
        const OpKind recv = forward ? OpKind::kForwardRecv : OpKind::kBackwardRecv;
        const uint32_t peer = forward ? (s + 1) % pp : (s + pp - 1) % pp;
        const auto& sends = valid_[s][P2pSlot(send)];
        const auto& recvs = valid_[peer][P2pSlot(recv)];
        if (sends.size() != recvs.size()) {
          return Invalid("step " + std::to_string(step_.step) + ": stage " + std::to_string(s) +
                         " has " + std::to_string(sends.size()) + " " +
                         std::string(OpKindName(send)) + " ops with a peer, stage " +
                         std::to_string(peer) + " " + std::to_string(recvs.size()) + " " +
                         std::string(OpKindName(recv)) + ": unpaired");
        }
        for (size_t i = 0; i < sends.size(); ++i) add({sends[i], recvs[i]}, false);
      }
    }
    for (uint32_t node : noop_) add({node}, false);
    for (uint32_t s = 0; s < pp; ++s) {
      for (OpKind k :
           {OpKind::kParamsAllGather, OpKind::kGradsReduceScatter, OpKind::kGradsAllReduce}) {
        for (uint32_t i = 0; i < m_->stages[s].kind_count[K(k)]; ++i) add({Node(s, k, i)}, true);
      }
    }
    // The embedding all-reduce pairs the stages holding the embeddings within a replica;
    // gradient clipping syncs every worker.
    for (const OpKind k : {OpKind::kEmbeddingGradsAllReduce, OpKind::kOptimizerClipMainGrad}) {
      uint32_t most = 0;
      for (uint32_t s = 0; s < pp; ++s) most = std::max(most, m_->stages[s].kind_count[K(k)]);
      for (uint32_t i = 0; i < most; ++i) {
        std::vector<uint32_t> members;
        for (uint32_t s = 0; s < pp; ++s) {
          if (m_->stages[s].kind_count[K(k)] > i) members.push_back(Node(s, k, i));
        }
        add(std::move(members), k == OpKind::kOptimizerClipMainGrad);
      }
    }
    m_->group_begin.push_back(0);
    for (size_t g = 0; g < groups.size(); ++g) {
      for (uint32_t node : groups[g]) {
        if (m_->group[node] >= 0) {
          return Invalid("step " + std::to_string(step_.step) + ": " +
                         std::string(OpKindName(m_->kind[node])) + " in two groups");
        }
        m_->group[node] = static_cast<int32_t>(g);
        m_->group_members.push_back(node);
      }
      m_->group_begin.push_back(static_cast<uint32_t>(m_->group_members.size()));
    }
    m_->group_synced = std::move(synced);
    return absl::OkStatus();
  }

  void BuildDeps() {
    std::sort(edges_.begin(), edges_.end());
    edges_.erase(std::unique(edges_.begin(), edges_.end()), edges_.end());
    m_->dep_begin.assign(m_->nodes + 1, 0);
    for (const auto& [succ, pred] : edges_) ++m_->dep_begin[succ + 1];
    for (uint32_t v = 0; v < m_->nodes; ++v) m_->dep_begin[v + 1] += m_->dep_begin[v];
    m_->deps.reserve(edges_.size());
    for (const auto& [succ, pred] : edges_) m_->deps.push_back(pred);
  }

  // Kahn's algorithm: a node starts when its dependencies ended; a group member ends when
  // every member of its group started.
  absl::Status Schedule() {
    const uint32_t n = m_->nodes;
    std::vector<uint32_t> succ_begin(n + 1, 0), succ(edges_.size()), indegree(n, 0);
    for (const auto& [s, p] : edges_) ++succ_begin[p + 1];
    for (uint32_t v = 0; v < n; ++v) succ_begin[v + 1] += succ_begin[v];
    {
      std::vector<uint32_t> fill(succ_begin.begin(), succ_begin.end() - 1);
      for (const auto& [s, p] : edges_) succ[fill[p]++] = s;
    }
    for (uint32_t v = 0; v < n; ++v) indegree[v] = m_->dep_begin[v + 1] - m_->dep_begin[v];
    std::deque<uint32_t> ready;
    for (uint32_t v = 0; v < n; ++v) {
      if (indegree[v] == 0) ready.push_back(v);
    }
    std::vector<uint32_t> started(m_->groups(), 0);
    auto release = [&](uint32_t u) {
      for (uint32_t i = succ_begin[u]; i < succ_begin[u + 1]; ++i) {
        if (--indegree[succ[i]] == 0) ready.push_back(succ[i]);
      }
    };
    uint32_t count = 0;
    m_->schedule.reserve(n + m_->groups());
    while (!ready.empty()) {
      const uint32_t v = ready.front();
      ready.pop_front();
      ++count;
      m_->schedule.push_back({v, false});
      const int32_t g = m_->group[v];
      if (g < 0) {
        release(v);
        continue;
      }
      const uint32_t begin = m_->group_begin[g], end = m_->group_begin[g + 1];
      if (++started[g] == end - begin) {
        m_->schedule.push_back({static_cast<uint32_t>(g), true});
        for (uint32_t i = begin; i < end; ++i) release(m_->group_members[i]);
      }
    }
    if (count != n) {
      for (uint32_t v = 0; v < n; ++v) {
        if (indegree[v] == 0) continue;
        const uint32_t s = m_->stage[v];
        const StageModel& st = m_->stages[s];
        const OpKind k = m_->kind[v];
        const uint32_t local = v - st.first;
        const std::string what = k == OpKind::kGc ? std::string("a gc slot")
                                                  : std::string(OpKindName(k)) + " #" +
                                                        std::to_string(local - st.kind_first[K(k)]);
        return Invalid("step " + std::to_string(step_.step) + ": dependency cycle: stage " +
                       std::to_string(s) + " " + what + " never starts");
      }
    }
    for (uint32_t v = 0; v < n; ++v) {
      if (m_->kind[v] == OpKind::kOptimizer) m_->end_nodes.push_back(v);
    }
    if (m_->end_nodes.empty()) {
      for (uint32_t v = 0; v < n; ++v) m_->end_nodes.push_back(v);
    }
    return absl::OkStatus();
  }

  const Layout& layout_;
  const StepOps& step_;
  const std::vector<WorkerIndex>& index_;
  StepModel* m_;
  std::vector<std::pair<uint32_t, uint32_t>> edges_;         // (successor, predecessor), global ids
  std::vector<std::array<std::vector<uint32_t>, 4>> valid_;  // per stage, per p2p kind
  std::vector<uint32_t> noop_;
  // Keyed pairing: per stage, each compute direction's and p2p kind's ops by key (key -> seq).
  struct StageKeys {
    std::array<std::unordered_map<uint32_t, uint32_t>, 2> compute;  // forward, backward
    std::array<std::unordered_map<uint32_t, uint32_t>, 4> p2p;      // by P2pSlot
  };
  std::vector<StageKeys> keys_;
  std::vector<std::pair<uint32_t, uint32_t>> pairs_;  // keyed (send, receive) nodes
  std::vector<std::vector<bool>> full_;               // per stage, per backward-compute seq
};

}  // namespace

void WorkerIndex::Build(const std::vector<Op>& ops) {
  const auto n = static_cast<uint32_t>(ops.size());
  kind_begin.fill(0);
  for (const Op& op : ops) ++kind_begin[K(op.kind) + 1];
  for (int k = 0; k < kOpKindCount; ++k) kind_begin[k + 1] += kind_begin[k];
  by_kind.resize(n);
  {
    std::array<uint32_t, kOpKindCount + 1> fill = kind_begin;
    for (uint32_t i = 0; i < n; ++i) by_kind[fill[K(ops[i].kind)]++] = i;
  }
  seq.resize(n);
  chain.clear();
  gc_pos.clear();
  for (int k = 0; k < kOpKindCount; ++k) {
    auto first = by_kind.begin() + kind_begin[k], last = by_kind.begin() + kind_begin[k + 1];
    std::stable_sort(first, last,
                     [&](uint32_t a, uint32_t b) { return ops[a].start_us < ops[b].start_us; });
    for (uint32_t i = kind_begin[k]; i < kind_begin[k + 1]; ++i)
      seq[by_kind[i]] = i - kind_begin[k];
    if (IsChainKind(static_cast<OpKind>(k))) chain.insert(chain.end(), first, last);
  }
  std::sort(chain.begin(), chain.end(), [&](uint32_t a, uint32_t b) {
    return std::tuple(ops[a].start_us, seq[a], ops[a].kind) <
           std::tuple(ops[b].start_us, seq[b], ops[b].kind);
  });
  for (uint32_t op : Kind(OpKind::kGc)) {
    const double start = ops[op].start_us;
    const auto it = std::partition_point(chain.begin(), chain.end(),
                                         [&](uint32_t c) { return ops[c].start_us < start; });
    gc_pos.push_back(static_cast<uint32_t>(it - chain.begin()));
  }
}

uint32_t GlobalChunk(StepModel::Pairing pairing, uint32_t pp, uint32_t stage, uint32_t chunk) {
  if (pairing == StepModel::Pairing::kV) return chunk == 0 ? stage : 2 * pp - 1 - stage;
  return chunk * pp + stage;
}

absl::Status CheckDataRanksAgree(const Layout& layout, const StepOps& step,
                                 const std::vector<WorkerIndex>& index) {
  for (uint32_t s = 0; s < layout.pp; ++s) {
    const WorkerIndex& rep = index[s * layout.dp];
    for (uint32_t d = 1; d < layout.dp; ++d) {
      const WorkerIndex& wi = index[s * layout.dp + d];
      for (int k = 0; k < kOpKindCount; ++k) {
        const auto kind = static_cast<OpKind>(k);
        if (!IsOpNodeKind(kind) || wi.Count(kind) == rep.Count(kind)) continue;
        return Invalid("step " + std::to_string(step.step) + ": data rank " + std::to_string(d) +
                       " of stage " + std::to_string(s) + " has " + std::to_string(wi.Count(kind)) +
                       " " + std::string(OpKindName(kind)) + " ops, data rank 0 has " +
                       std::to_string(rep.Count(kind)));
      }
    }
  }
  return absl::OkStatus();
}

std::vector<uint32_t> StepShape(const Layout& layout, const StepOps& step,
                                const std::vector<WorkerIndex>& index) {
  std::vector<uint32_t> key;
  std::vector<uint32_t> positions;
  for (uint32_t s = 0; s < layout.pp; ++s) {
    const WorkerIndex& rep = index[s * layout.dp];
    const std::vector<Op>& ops = step.workers[s * layout.dp];
    key.push_back(0xffffffffu);
    for (int k = 0; k < kOpKindCount; ++k) {
      if (IsOpNodeKind(static_cast<OpKind>(k))) key.push_back(rep.Count(static_cast<OpKind>(k)));
    }
    key.push_back(static_cast<uint32_t>(rep.chain.size()));
    for (uint32_t op : rep.chain) {
      key.push_back((static_cast<uint32_t>(ops[op].kind) << 16) | ops[op].chunk);
      key.push_back(ops[op].microbatch);
    }
    // Keyed pairing matches sends and receives by microbatch and chunk.
    for (OpKind k : kP2pKinds) {
      for (uint32_t op : rep.Kind(k)) key.push_back(Key(ops[op]));
    }
    positions.clear();
    for (uint32_t d = 0; d < layout.dp; ++d) {
      const auto& p = index[s * layout.dp + d].gc_pos;
      positions.insert(positions.end(), p.begin(), p.end());
    }
    std::sort(positions.begin(), positions.end());
    positions.erase(std::unique(positions.begin(), positions.end()), positions.end());
    key.push_back(static_cast<uint32_t>(positions.size()));
    key.insert(key.end(), positions.begin(), positions.end());
  }
  return key;
}

absl::StatusOr<std::shared_ptr<const StepModel>> BuildStepModel(
    const Layout& layout, const StepOps& step, const std::vector<WorkerIndex>& index,
    std::vector<uint32_t> key) {
  auto model = std::make_shared<StepModel>();
  model->layout = layout;
  model->key = std::move(key);
  Builder builder(layout, step, index, model.get());
  if (absl::Status s = builder.Build(); !s.ok()) return s;
  return std::shared_ptr<const StepModel>(std::move(model));
}

}  // namespace rankwatch::whatif::internal
