// Name-based classification of GPU operations (docs/spec/kernel-analysis.md section 2), and the
// fixed name sets the analyses key on (launch calls, sync events, ProfilerStep markers).
// Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace rankwatch::kernel {

enum class KernelType : uint8_t { kComputation, kCommunication, kMemory, kOther };

// "COMPUTATION", "COMMUNICATION", "MEMORY", "OTHER" (HTA's names).
std::string_view KernelTypeName(KernelType t);

// HTA's get_kernel_type on the full raw name (prefix/contains rules, first match wins).
KernelType ClassifyKernel(std::string_view name);

// Memory sub-type for the bandwidth analysis: "Memset", "Memcpy Unknown", or the first 11
// characters of a name starting with "Memcpy" ("Memcpy DtoH", ...).
std::string MemorySubtype(std::string_view name);

// CPU calls whose GPU op counts in launch statistics (spec 8, include_memory_events=true).
bool IsLaunchStatsCall(std::string_view name);

// CPU calls that enqueue onto a stream, for queue length (spec 10).
bool IsQueueLaunchCall(std::string_view name);

// "Event Sync" / "Context Sync": GPU-side in the correlation join even without a stream.
bool IsGpuSyncName(std::string_view name);

// N for names matching ^ProfilerStep#(\d+) (HTA's step set); nullopt otherwise.
std::optional<int64_t> ProfilerStepNumber(std::string_view name);

// N for names matching ProfilerStep\s*#\s*(\d+) anywhere (HTA's iteration regex).
std::optional<int64_t> IterationStepNumber(std::string_view name);

// Categories whose events enter the idle-time breakdown (spec 1.6).
bool IsIdleCategory(std::string_view category);

// Names of communication kernels for the straggler heuristic: HTA checks only the
// "ncclKernel" prefix; the corrected mode also takes "ncclDevKernel".
bool IsStragglerCommKernel(std::string_view name, bool hta_compat);

}  // namespace rankwatch::kernel
