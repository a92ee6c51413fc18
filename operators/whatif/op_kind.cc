// Names of the what-if op kinds (the study's vocabulary) and their classes.
#include <array>
#include <string_view>

#include "operators/whatif/whatif.h"

namespace rankwatch::whatif {
namespace {

constexpr std::array<std::string_view, kOpKindCount> kNames = {
    "unspecified",
    "forward-compute",
    "backward-compute",
    "forward-send",
    "forward-recv",
    "backward-send",
    "backward-recv",
    "tensor-parallel",
    "grads-reduce-scatter",
    "params-all-gather",
    "grads-all-reduce",
    "layernorm-grads-all-reduce",
    "embedding-grads-all-reduce",
    "optimizer-clip-main-grad",
    "optimizer",
    "gc",
    "data-loading",
    "backward-weight-compute",
};

}  // namespace

std::string_view OpKindName(OpKind kind) {
  const auto i = static_cast<size_t>(kind);
  return i < kNames.size() ? kNames[i] : std::string_view("unspecified");
}

std::optional<OpKind> OpKindFromName(std::string_view name) {
  for (size_t i = 0; i < kNames.size(); ++i) {
    if (kNames[i] == name) return static_cast<OpKind>(i);
  }
  // The study's Megatron name for the all-reduce of gradients outside the overlapped buckets.
  if (name == "separate-grads-all-reduce") return OpKind::kGradsAllReduce;
  return std::nullopt;
}

std::string_view OpGroupName(OpKind kind) {
  switch (kind) {
    case OpKind::kForwardSend:
    case OpKind::kForwardRecv: return "forward-pp-comm";
    case OpKind::kBackwardSend:
    case OpKind::kBackwardRecv: return "backward-pp-comm";
    default: return OpKindName(kind);
  }
}

bool IsCommunication(OpKind kind) {
  switch (kind) {
    case OpKind::kForwardSend:
    case OpKind::kForwardRecv:
    case OpKind::kBackwardSend:
    case OpKind::kBackwardRecv:
    case OpKind::kGradsReduceScatter:
    case OpKind::kParamsAllGather:
    case OpKind::kGradsAllReduce:
    case OpKind::kLayernormGradsAllReduce:
    case OpKind::kEmbeddingGradsAllReduce:
    case OpKind::kOptimizerClipMainGrad: return true;
    default: return false;
  }
}

bool IsModelled(OpKind kind) {
  const auto i = static_cast<int>(kind);
  return i > 0 && i < kOpKindCount && kind != OpKind::kTensorParallel;
}

}  // namespace rankwatch::whatif
