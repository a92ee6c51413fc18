// HTA's potential-straggler heuristic (docs/spec/kernel-analysis.md section 11), offered by
// `rankwatch analyze`; the live straggler logic is docs/spec/step-diagnosis.md. Pure; thread-safe.
#pragma once

#include <cstdint>
#include <vector>

#include "operators/kernel/rank_timeline.h"

namespace rankwatch::kernel {

struct StragglerOptions {
  size_t num_candidates = 2;
  bool hta_compat = false;  // compat: only "ncclKernel*" names are collectives
};

// Ranks flagged most often, most flagged first (ties by rank), at most num_candidates. Empty
// when fewer than two ranks or no collective kernel qualifies (HTA raises there).
std::vector<uint32_t> FindPotentialStragglers(const std::vector<RankTimeline>& ranks,
                                              const std::vector<int64_t>& steps,
                                              const StragglerOptions& o);

}  // namespace rankwatch::kernel
