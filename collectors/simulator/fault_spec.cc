#include "collectors/simulator/fault_spec.h"

#include <charconv>
#include <cmath>
#include <string>
#include <vector>

namespace rankwatch {
namespace {

struct KindInfo {
  std::string_view name;
  FaultKind kind;
  double default_magnitude;
};

constexpr KindInfo kKinds[] = {
    {"slow-compute", FaultKind::kSlowCompute, 0.3},
    {"slow-input", FaultKind::kSlowInput, 1.0},
    {"input-bound", FaultKind::kInputBound, 1.0},
    {"wait", FaultKind::kWait, 0.2},
    {"memory-leak", FaultKind::kMemoryLeak, 64},
    {"memory-imbalance", FaultKind::kMemoryImbalance, 0.3},
    {"memory-pressure", FaultKind::kMemoryPressure, 0.95},
    {"hang", FaultKind::kHang, 0},
    {"slow-host", FaultKind::kSlowHost, 0.2},
};

std::vector<std::string_view> Split(std::string_view s, char sep) {
  std::vector<std::string_view> parts;
  size_t start = 0;
  while (true) {
    size_t pos = s.find(sep, start);
    parts.push_back(s.substr(start, pos == std::string_view::npos ? pos : pos - start));
    if (pos == std::string_view::npos) return parts;
    start = pos + 1;
  }
}

template <typename T>
bool ParseNumber(std::string_view s, T* out) {
  if (s.empty()) return false;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && ptr == s.data() + s.size();
}

}  // namespace

std::string_view FaultKindName(FaultKind kind) {
  for (const KindInfo& k : kKinds) {
    if (k.kind == kind) return k.name;
  }
  return "unknown";
}

absl::StatusOr<FaultSpec> ParseFaultSpec(std::string_view text) {
  const std::string quoted = "fault '" + std::string(text) + "': ";
  const std::vector<std::string_view> parts = Split(text, ':');
  if (parts.size() < 2 || parts.size() > 4) {
    return absl::InvalidArgumentError(quoted +
                                      "expected KIND:TARGET[:MAGNITUDE[:FROM_STEP[-UNTIL_STEP]]]");
  }
  FaultSpec spec;
  const KindInfo* info = nullptr;
  for (const KindInfo& k : kKinds) {
    if (k.name == parts[0]) info = &k;
  }
  if (info == nullptr) {
    return absl::InvalidArgumentError(
        quoted +
        "unknown kind (slow-compute, slow-input, slow-host, input-bound, wait, memory-leak, "
        "memory-imbalance, memory-pressure, hang)");
  }
  spec.kind = info->kind;
  spec.magnitude = info->default_magnitude;

  const std::string_view target = parts[1];
  if (target == "all") {
    spec.target.kind = FaultTarget::Kind::kAll;
  } else if (target.starts_with("node")) {
    spec.target.kind = FaultTarget::Kind::kNode;
    if (!ParseNumber(target.substr(4), &spec.target.index)) {
      return absl::InvalidArgumentError(quoted + "bad node target (use node<N>)");
    }
  } else {
    spec.target.kind = FaultTarget::Kind::kRank;
    if (!ParseNumber(target, &spec.target.index)) {
      return absl::InvalidArgumentError(quoted + "TARGET must be a rank, node<N> or all");
    }
  }
  if (parts.size() >= 3 && !parts[2].empty()) {
    std::string magnitude(parts[2]);  // from_chars for double is fine; keep strtod semantics
    char* end = nullptr;
    spec.magnitude = std::strtod(magnitude.c_str(), &end);
    if (end != magnitude.c_str() + magnitude.size() || !std::isfinite(spec.magnitude) ||
        spec.magnitude < 0) {
      return absl::InvalidArgumentError(quoted + "MAGNITUDE must be a number >= 0");
    }
  }
  if (parts.size() == 4) {
    const size_t dash = parts[3].find('-');
    if (!ParseNumber(parts[3].substr(0, dash), &spec.from_step)) {
      return absl::InvalidArgumentError(quoted + "FROM_STEP must be a step number");
    }
    if (dash != std::string::npos && (!ParseNumber(parts[3].substr(dash + 1), &spec.until_step) ||
                                      spec.until_step <= spec.from_step)) {
      return absl::InvalidArgumentError(quoted +
                                        "UNTIL_STEP must be a step number after FROM_STEP");
    }
  }
  return spec;
}

}  // namespace rankwatch
