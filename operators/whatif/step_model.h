// The dependency model of one training step (docs/whatif.md, "The model"): the ops of every
// stage as nodes, the in-worker dependencies between them, the communication groups across
// workers, and a precomputed schedule ScheduleReplay replays. One model serves every data rank
// of a stage (they run the same op sequence) and every step of the same shape.
//
// Internal to the what-if analyzer. A StepModel is immutable once built and may be shared
// between threads; WorkerIndex is scratch owned by its caller.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "operators/whatif/whatif.h"

namespace rankwatch::whatif::internal {

// A pipeline send or receive that ends (starts) this close before the first compute of its
// direction ends (after the last one starts) still belongs to the schedule: the study's 5e-5 s.
inline constexpr double kP2pMatchEpsUs = 50;

// The typical-duration table has a slot per kind and two more: one always 0, the ideal of a
// GC slot in mid-step (GC time is ideally paid once, after the last compute); one for a full
// backward in a zero-bubble step (a backward-compute op with no weight-gradient op of its
// microbatch and chunk beside it, while the job has weight-gradient ops: it holds both parts,
// and its ideal is a typical backward-compute plus a typical weight-gradient op).
inline constexpr int kZeroTypical = kOpKindCount;
inline constexpr int kFullBackwardTypical = kOpKindCount + 1;
inline constexpr int kTypicalCount = kOpKindCount + 2;
using Typical = std::array<double, kTypicalCount>;

// A worker's ops indexed for the model. Rebuilt for each step; reuses its buffers.
struct WorkerIndex {
  // Op indices grouped by kind, each kind by (start, position in the step's list): the n-th
  // op of a kind is its seq n.
  std::vector<uint32_t> by_kind;
  std::array<uint32_t, kOpKindCount + 1> kind_begin{};
  std::vector<uint32_t> seq;  // per op: its seq within its kind
  // The compute chain's ops (forward and backward compute, data loading) by (start, seq, kind).
  std::vector<uint32_t> chain;
  // Per GC op, in by_kind order: its chain position, the number of chain ops that start
  // before it (0 .. chain.size()).
  std::vector<uint32_t> gc_pos;

  void Build(const std::vector<Op>& ops);
  std::span<const uint32_t> Kind(OpKind k) const {
    const auto i = static_cast<size_t>(k);
    return {by_kind.data() + kind_begin[i], kind_begin[i + 1] - kind_begin[i]};
  }
  uint32_t Count(OpKind k) const {
    const auto i = static_cast<size_t>(k);
    return kind_begin[i + 1] - kind_begin[i];
  }
};

struct StageModel {
  uint32_t first = 0;  // global id of the stage's first node; its nodes are contiguous
  uint32_t count = 0;
  // Local id of a kind's seq-0 node (a kind's nodes are contiguous, in seq order), and how
  // many. GC nodes are slots, not ops: see gc_slot.
  std::array<uint32_t, kOpKindCount> kind_first{};
  std::array<uint32_t, kOpKindCount> kind_count{};
  uint32_t chain_len = 0;
  // Chain position (0 .. chain_len) -> local id of the GC slot there, or -1. The slot at
  // chain_len (after the last compute) always exists.
  std::vector<int32_t> gc_slot;
};

struct StepModel {
  Layout layout;
  std::vector<uint32_t> key;  // StepShape() of the steps it serves
  std::vector<StageModel> stages;
  uint32_t nodes = 0;
  // Per node.
  std::vector<OpKind> kind;
  std::vector<uint16_t> stage;
  std::vector<uint8_t> typical;  // index into Typical
  std::vector<int32_t> group;    // communication group, -1 = none
  // Communication groups: members (global node ids) of group g are
  // group_members[group_begin[g] .. group_begin[g + 1]); synced groups also wait for every
  // data rank.
  std::vector<uint32_t> group_begin;
  std::vector<uint32_t> group_members;
  std::vector<uint8_t> group_synced;
  // In-worker dependencies: node v waits for deps[dep_begin[v] .. dep_begin[v + 1]).
  std::vector<uint32_t> dep_begin;
  std::vector<uint32_t> deps;
  // ScheduleReplay's program, in a topological order: start node `id`, or (finish) end every
  // member of group `id` once all of them started.
  struct Instr {
    uint32_t id;
    bool finish_group;
  };
  std::vector<Instr> schedule;
  std::vector<uint32_t> end_nodes;  // the optimizer nodes (every node when there is none)
  bool overlapped_dp = false;       // a separate grads all-reduce after overlapped reduce-scatters
  // How pipeline sends and receives were matched: by order (Megatron's schedules, the study's
  // traces), or by their microbatch and model chunk (torch.distributed.pipelining's schedules:
  // interleaved, zero-bubble, V-shaped), with chunk c of stage s at global model chunk
  // c * pp + s (kInterleaved) or, with two chunks, s and 2 * pp - 1 - s (kV).
  enum class Pairing : uint8_t { kByOrder, kInterleaved, kV } pairing = Pairing::kByOrder;

  uint32_t groups() const { return static_cast<uint32_t>(group_synced.size()); }
};

// The global model chunk of `chunk` on `stage` under a keyed pairing (kByOrder: interleaved).
uint32_t GlobalChunk(StepModel::Pairing pairing, uint32_t pp, uint32_t stage, uint32_t chunk);

// InvalidArgument (one line) unless every data rank of each stage has as many ops of each
// modelled kind (GC aside) as the stage's data rank 0.
absl::Status CheckDataRanksAgree(const Layout& layout, const StepOps& step,
                                 const std::vector<WorkerIndex>& index);

// What a model depends on, per stage: op counts per kind, the compute chain's kinds, chunks and
// microbatches (data rank 0), the pipeline sends' and receives' microbatches and chunks, the
// chain positions holding a GC op on any data rank.
std::vector<uint32_t> StepShape(const Layout& layout, const StepOps& step,
                                const std::vector<WorkerIndex>& index);

// Builds the model of `step` from each stage's data rank 0 (the study's choice); `index` holds
// every worker's WorkerIndex. InvalidArgument, one line, for a step no model fits: pipeline
// sends and receives that do not pair up, sends or receives missing in a middle stage, a
// dependency cycle.
absl::StatusOr<std::shared_ptr<const StepModel>> BuildStepModel(
    const Layout& layout, const StepOps& step, const std::vector<WorkerIndex>& index,
    std::vector<uint32_t> key);

}  // namespace rankwatch::whatif::internal
