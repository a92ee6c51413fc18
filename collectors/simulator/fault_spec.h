// FaultSpec: one fault the fleet simulator injects, parsed from the command line as
// `KIND:TARGET[:MAGNITUDE[:FROM_STEP[-UNTIL_STEP]]]`, TARGET a rank number, `node<N>` or
// `all`; the fault holds for FROM_STEP <= step < UNTIL_STEP (no end by default).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace rankwatch {

enum class FaultKind {
  kSlowCompute,      // forward+backward take MAGNITUDE longer (0.3 = +30%); default 0.3
  kSlowInput,        // dataloader x(1+MAGNITUDE); default 1.0
  kInputBound,       // dataloader becomes MAGNITUDE x compute; default 1.0
  kWait,             // extra wait of MAGNITUDE x step; default 0.2
  kMemoryLeak,       // +MAGNITUDE MiB per step since FROM_STEP; default 64
  kMemoryImbalance,  // x(1+MAGNITUDE) memory; default 0.3
  kMemoryPressure,   // peak at MAGNITUDE x capacity; default 0.95
  kHang,             // stops reporting (under DDP every rank stops at that step)
  // Host code outside every measured phase (between forward and backward, say) takes
  // MAGNITUDE x the nominal step (0.2 = +20% of the step); default 0.2. The rank's own time:
  // under DDP every other rank waits for it inside backward.
  kSlowHost,
};

struct FaultTarget {
  enum class Kind { kRank, kNode, kAll } kind = Kind::kAll;
  uint32_t index = 0;  // rank or node number
};

struct FaultSpec {
  FaultKind kind = FaultKind::kSlowCompute;
  FaultTarget target;
  double magnitude = 0;
  uint64_t from_step = 0;
  uint64_t until_step = UINT64_MAX;  // exclusive
};

// Parses a fault; errors are InvalidArgument with a message fit for the command line.
absl::StatusOr<FaultSpec> ParseFaultSpec(std::string_view text);

std::string_view FaultKindName(FaultKind kind);

}  // namespace rankwatch
