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
  bool keyed = false;  // KIND:KEY=VALUE,...
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
    {"slow-worker", FaultKind::kSlowWorker, 1.3, true},
    {"stage-imbalance", FaultKind::kStageImbalance, 1.25, true},
    {"sequence-imbalance", FaultKind::kSequenceImbalance, 0.3, true},
    {"gc", FaultKind::kGc, 100, true},
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

// FROM_STEP[-UNTIL_STEP] into spec; false with *error set otherwise.
bool ParseStepRange(std::string_view text, FaultSpec* spec, std::string* error) {
  const size_t dash = text.find('-');
  if (!ParseNumber(text.substr(0, dash), &spec->from_step)) {
    *error = "FROM_STEP must be a step number";
    return false;
  }
  if (dash != std::string::npos && (!ParseNumber(text.substr(dash + 1), &spec->until_step) ||
                                    spec->until_step <= spec->from_step)) {
    *error = "UNTIL_STEP must be a step number after FROM_STEP";
    return false;
  }
  return true;
}

bool ParseDouble(std::string_view text, double* out) {
  const std::string s(text);
  char* end = nullptr;
  *out = std::strtod(s.c_str(), &end);
  return !s.empty() && end == s.c_str() + s.size() && std::isfinite(*out);
}

// The KEY=VALUE list of a keyed kind into spec; a missing required key is an error.
absl::Status ParseKeys(std::string_view keys, FaultSpec* spec) {
  bool has_dp = false, has_stage = false, has_rank = false;
  if (!keys.empty()) {
    for (std::string_view item : Split(keys, ',')) {
      const size_t eq = item.find('=');
      if (eq == std::string_view::npos) return absl::InvalidArgumentError("expected KEY=VALUE");
      const std::string_view key = item.substr(0, eq), value = item.substr(eq + 1);
      const std::string named = "'" + std::string(key) + "' ";
      switch (spec->kind) {
        case FaultKind::kSlowWorker:
        case FaultKind::kStageImbalance:
          if (key == "factor") {
            if (!ParseDouble(value, &spec->magnitude) || spec->magnitude <= 0) {
              return absl::InvalidArgumentError("factor must be a number > 0");
            }
          } else if (key == "stage" || (key == "pp" && spec->kind == FaultKind::kSlowWorker)) {
            if (!ParseNumber(value, &spec->stage)) {
              return absl::InvalidArgumentError(named + "must be a stage number");
            }
            has_stage = true;
          } else if (key == "dp" && spec->kind == FaultKind::kSlowWorker) {
            if (!ParseNumber(value, &spec->dp)) {
              return absl::InvalidArgumentError("dp must be a data-parallel rank");
            }
            has_dp = true;
          } else {
            return absl::InvalidArgumentError(
                "unknown key " + named +
                (spec->kind == FaultKind::kSlowWorker ? "(dp, pp, factor)" : "(stage, factor)"));
          }
          break;
        case FaultKind::kSequenceImbalance:
          if (key != "spread")
            return absl::InvalidArgumentError("unknown key " + named + "(spread)");
          if (!ParseDouble(value, &spec->magnitude) || spec->magnitude < 0 ||
              spec->magnitude >= 1) {
            return absl::InvalidArgumentError("spread must be a number in [0, 1)");
          }
          break;
        case FaultKind::kGc:
          if (key == "rank") {
            if (!ParseNumber(value, &spec->target.index)) {
              return absl::InvalidArgumentError("rank must be a rank number");
            }
            has_rank = true;
          } else if (key == "every") {
            if (!ParseNumber(value, &spec->every) || spec->every == 0) {
              return absl::InvalidArgumentError("every must be a number of steps >= 1");
            }
          } else if (key == "ms") {
            if (!ParseDouble(value, &spec->magnitude) || spec->magnitude < 0) {
              return absl::InvalidArgumentError("ms must be a number >= 0");
            }
          } else {
            return absl::InvalidArgumentError("unknown key " + named + "(rank, every, ms)");
          }
          break;
        default: break;
      }
    }
  }
  if (spec->kind == FaultKind::kSlowWorker && !(has_dp && has_stage)) {
    return absl::InvalidArgumentError("slow-worker needs dp= and pp=");
  }
  if (spec->kind == FaultKind::kStageImbalance && !has_stage) {
    return absl::InvalidArgumentError("stage-imbalance needs stage=");
  }
  if (spec->kind == FaultKind::kGc) {
    if (!has_rank) return absl::InvalidArgumentError("gc needs rank=");
    spec->target.kind = FaultTarget::Kind::kRank;
  }
  return absl::OkStatus();
}

}  // namespace

bool IsKeyedFault(FaultKind kind) {
  for (const KindInfo& k : kKinds) {
    if (k.kind == kind) return k.keyed;
  }
  return false;
}

std::string_view FaultKindName(FaultKind kind) {
  for (const KindInfo& k : kKinds) {
    if (k.kind == kind) return k.name;
  }
  return "unknown";
}

absl::StatusOr<FaultSpec> ParseFaultSpec(std::string_view text) {
  const std::string quoted = "fault '" + std::string(text) + "': ";
  const std::vector<std::string_view> parts = Split(text, ':');
  FaultSpec spec;
  const KindInfo* info = nullptr;
  for (const KindInfo& k : kKinds) {
    if (k.name == parts[0]) info = &k;
  }
  if (info != nullptr && info->keyed) {
    spec.kind = info->kind;
    spec.magnitude = info->default_magnitude;
    spec.target.kind = FaultTarget::Kind::kAll;
    if (parts.size() > 3) {
      return absl::InvalidArgumentError(quoted +
                                        "expected KIND:KEY=VALUE,...[:FROM_STEP[-UNTIL_STEP]]");
    }
    if (auto s = ParseKeys(parts.size() >= 2 ? parts[1] : "", &spec); !s.ok()) {
      return absl::InvalidArgumentError(quoted + std::string(s.message()));
    }
    std::string error;
    if (parts.size() == 3 && !ParseStepRange(parts[2], &spec, &error)) {
      return absl::InvalidArgumentError(quoted + error);
    }
    return spec;
  }
  if (parts.size() < 2 || parts.size() > 4) {
    return absl::InvalidArgumentError(quoted +
                                      "expected KIND:TARGET[:MAGNITUDE[:FROM_STEP[-UNTIL_STEP]]]");
  }
  if (info == nullptr) {
    return absl::InvalidArgumentError(
        quoted +
        "unknown kind (slow-compute, slow-input, slow-host, input-bound, wait, memory-leak, "
        "memory-imbalance, memory-pressure, hang; with --parallel slow-worker, stage-imbalance, "
        "sequence-imbalance; gc)");
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
  std::string error;
  if (parts.size() == 4 && !ParseStepRange(parts[3], &spec, &error)) {
    return absl::InvalidArgumentError(quoted + error);
  }
  return spec;
}

}  // namespace rankwatch
