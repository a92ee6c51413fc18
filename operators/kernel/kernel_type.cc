#include "operators/kernel/kernel_type.h"

#include <array>

namespace rankwatch::kernel {
namespace {

bool StartsWith(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }
bool Contains(std::string_view s, std::string_view p) {
  return s.find(p) != std::string_view::npos;
}

// The COMPUTATION exclusion regex of spec 2 rule 3, under re.match semantics.
bool ExcludedFromCompute(std::string_view n) {
  static constexpr std::array<std::string_view, 10> kPrefixes = {
      "nccl",        "Stream Wait Event",
      "runFunction", "hip",
      "job_exe",     "packet",
      "pe_exe",      "cpum_exe_subgraph",
      "hccl",        "collective_subgraph_execution"};
  for (std::string_view p : kPrefixes) {
    if (StartsWith(n, p)) return true;
  }
  if (Contains(n, "Memcpy") || Contains(n, "Memset") || Contains(n, "dma") || Contains(n, "Sync")) {
    return true;
  }
  // cuda.*LaunchKernel: starts with "cuda" and contains "LaunchKernel" after it.
  return StartsWith(n, "cuda") && n.find("LaunchKernel", 4) != std::string_view::npos;
}

}  // namespace

std::string_view KernelTypeName(KernelType t) {
  switch (t) {
    case KernelType::kComputation: return "COMPUTATION";
    case KernelType::kCommunication: return "COMMUNICATION";
    case KernelType::kMemory: return "MEMORY";
    case KernelType::kOther: return "OTHER";
  }
  return "OTHER";
}

KernelType ClassifyKernel(std::string_view n) {
  if (StartsWith(n, "nccl") || StartsWith(n, "hip") || StartsWith(n, "hccl") ||
      Contains(n, "ncclKernel")) {
    return KernelType::kCommunication;
  }
  if (StartsWith(n, "Memcpy") || StartsWith(n, "Memset") || StartsWith(n, "dma")) {
    return KernelType::kMemory;
  }
  if (!ExcludedFromCompute(n)) return KernelType::kComputation;
  return KernelType::kOther;
}

std::string MemorySubtype(std::string_view n) {
  if (StartsWith(n, "Memset")) return "Memset";
  if (!StartsWith(n, "Memcpy")) return "Memcpy Unknown";
  return std::string(n.substr(0, 11));
}

bool IsLaunchStatsCall(std::string_view n) {
  return n == "cudaLaunchKernel" || n == "cudaLaunchKernelExC" ||
         n == "runFunction - job_prep_and_submit_for_execution" || n == "cudaMemcpyAsync" ||
         n == "cudaMemsetAsync";
}

bool IsQueueLaunchCall(std::string_view n) {
  static constexpr std::array<std::string_view, 12> kNames = {
      "cudaLaunchKernel",
      "cudaLaunchKernelExC",
      "cuLaunchKernel",
      "cuLaunchKernelEx",
      "cudaMemcpyAsync",
      "cudaMemsetAsync",
      "runFunction - job_prep_and_submit_for_execution",
      "hipLaunchKernel",
      "hipExtModuleLaunchKernel",
      "hipMemsetAsync",
      "hipMemcpyAsync",
      "hipMemcpyWithStream"};
  for (std::string_view k : kNames) {
    if (n == k) return true;
  }
  return false;
}

bool IsGpuSyncName(std::string_view n) { return n == "Event Sync" || n == "Context Sync"; }

namespace {
std::optional<int64_t> Digits(std::string_view s) {
  if (s.empty() || s[0] < '0' || s[0] > '9') return std::nullopt;
  int64_t v = 0;
  for (size_t i = 0; i < s.size() && s[i] >= '0' && s[i] <= '9' && i < 18; ++i)
    v = v * 10 + (s[i] - '0');
  return v;
}
bool IsSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}
}  // namespace

std::optional<int64_t> ProfilerStepNumber(std::string_view n) {
  constexpr std::string_view kPrefix = "ProfilerStep#";
  if (!StartsWith(n, kPrefix)) return std::nullopt;
  return Digits(n.substr(kPrefix.size()));
}

std::optional<int64_t> IterationStepNumber(std::string_view n) {
  constexpr std::string_view kWord = "ProfilerStep";
  for (size_t pos = n.find(kWord); pos != std::string_view::npos; pos = n.find(kWord, pos + 1)) {
    size_t i = pos + kWord.size();
    while (i < n.size() && IsSpace(n[i])) ++i;
    if (i >= n.size() || n[i] != '#') continue;
    ++i;
    while (i < n.size() && IsSpace(n[i])) ++i;
    if (auto d = Digits(n.substr(i))) return d;
  }
  return std::nullopt;
}

bool IsIdleCategory(std::string_view c) {
  return c == "kernel" || c == "Kernel" || c == "gpu_memset" || c == "Memset" ||
         c == "gpu_memcpy" || c == "Memcpy" || c == "mtia_ccp_events";
}

bool IsStragglerCommKernel(std::string_view n, bool hta_compat) {
  return StartsWith(n, "ncclKernel") || (!hta_compat && StartsWith(n, "ncclDevKernel"));
}

}  // namespace rankwatch::kernel
