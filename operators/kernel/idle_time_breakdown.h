// Idle-time breakdown per stream (docs/spec/kernel-analysis.md section 5): each gap between
// consecutive kernels of a stream is host wait (the launch started after the previous kernel
// ended), kernel wait (gap under `consecutive_kernel_delay`) or other. Pure; thread-safe.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "operators/kernel/describe.h"
#include "operators/kernel/rank_timeline.h"

namespace rankwatch::kernel {

enum class IdleCategory : uint8_t { kHostWait, kKernelWait, kOther };
std::string_view IdleCategoryName(IdleCategory c);  // host_wait, kernel_wait, other

struct IdleRow {
  uint32_t rank = 0;
  int64_t stream = 0;
  IdleCategory category = IdleCategory::kOther;
  double idle_us = 0;  // Σ gaps (the first kernel's undefined gap counts 0)
  double ratio = 0;    // idle_us / Σ over the stream's categories; NaN when that is 0
  Describe gaps_us;    // the gaps of this category (show_idle_interval_stats)
};

// Rows per stream (streams in order of first appearance among kernel/memcpy/memset ops), one
// per category present, in the order host_wait, kernel_wait, other.
std::vector<IdleRow> ComputeIdleTimeBreakdown(const RankTimeline& t,
                                              int64_t consecutive_kernel_delay_ns = 30'000);

}  // namespace rankwatch::kernel
