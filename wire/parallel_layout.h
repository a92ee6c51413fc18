// The wire's rule for a rank's coordinates in a parallel layout (v1::ParallelLayout in
// proto/rankwatch/v1/telemetry.proto), shared by the producers that set one (the collector
// library) and the daemon's BatchDecoder that checks it.
//
// Pure functions; safe from any thread. Users link rankwatch_telemetry_proto.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "rankwatch/v1/telemetry.pb.h"

namespace rankwatch {

// A size of 0 on the wire means 1 (that kind of parallelism is not used).
inline uint32_t LayoutSize(uint32_t size) { return size == 0 ? 1 : size; }

// Why `layout` cannot be a rank's place in a job of `world_size` ranks, or "" when it can:
// every rank is below its size; data x pipeline x tensor x context sizes multiply to the world
// size (Megatron-core's world: its data-parallel size excludes the context-parallel ranks);
// the expert-parallel size divides the ranks of one pipeline stage (expert parallelism
// regroups a stage's data, context and tensor ranks, as Megatron-core does).
inline std::string ParallelLayoutError(const v1::ParallelLayout& layout, uint32_t world_size) {
  struct Dim {
    const char* name;
    uint32_t rank, size;
  };
  const Dim dims[] = {{"data", layout.data_rank(), LayoutSize(layout.data_size())},
                      {"pipeline", layout.pipeline_rank(), LayoutSize(layout.pipeline_size())},
                      {"tensor", layout.tensor_rank(), LayoutSize(layout.tensor_size())},
                      {"context", layout.context_rank(), LayoutSize(layout.context_size())},
                      {"expert", layout.expert_rank(), LayoutSize(layout.expert_size())}};
  uint64_t product = 1;  // stops growing past the world size: no overflow
  for (const Dim& d : dims) {
    if (d.rank >= d.size) {
      return std::string("layout ") + d.name + " rank " + std::to_string(d.rank) +
             " is not below its size " + std::to_string(d.size);
    }
    if (std::string_view(d.name) != "expert" && product <= world_size) product *= d.size;
  }
  if (product != world_size) {
    return "layout data x pipeline x tensor x context sizes " + std::to_string(dims[0].size) +
           " x " + std::to_string(dims[1].size) + " x " + std::to_string(dims[2].size) + " x " +
           std::to_string(dims[3].size) + " do not multiply to the world size " +
           std::to_string(world_size);
  }
  const uint32_t stage_ranks = world_size / dims[1].size;
  if (stage_ranks % dims[4].size != 0) {
    return "layout expert size " + std::to_string(dims[4].size) +
           " does not divide the ranks of a pipeline stage (" + std::to_string(stage_ranks) + ")";
  }
  return "";
}

}  // namespace rankwatch
