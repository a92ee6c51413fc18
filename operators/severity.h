// Severity: how urgent a diagnosis or an alert is, shared by the step-time and memory
// diagnoses and the alert lifecycle. Plain value type.
#pragma once

#include <cstdint>
#include <string_view>

namespace rankwatch {

enum class Severity : uint8_t { kInfo, kWarn, kCrit };

// Metric label and log value: "info", "warn", "crit".
constexpr std::string_view SeverityName(Severity severity) {
  switch (severity) {
    case Severity::kInfo: return "info";
    case Severity::kWarn: return "warn";
    case Severity::kCrit: return "crit";
  }
  return "unknown";
}

}  // namespace rankwatch
