#include "traces/iteration_trace.h"

#include <algorithm>
#include <regex>

namespace rankwatch {

std::optional<IterationTraceFormat> DetectIterationTraceFormat(const std::filesystem::path& file) {
  static const std::regex kMsprof(R"(step_trace_\d+_\d+_\d+\.json)");
  static const std::regex kMindSpore(R"(step_trace_raw_\d+_detail_time\.csv)");
  const std::string name = file.filename().string();
  if (std::regex_match(name, kMsprof)) return IterationTraceFormat::kMsprofStepTraceJson;
  if (std::regex_match(name, kMindSpore)) return IterationTraceFormat::kMindSporeStepTraceRaw;
  if (name == "step_trace_time.csv") return IterationTraceFormat::kTorchNpuStepTraceTime;
  return std::nullopt;
}

absl::StatusOr<IterationTrace> ReadIterationTrace(const std::filesystem::path& file) {
  const auto format = DetectIterationTraceFormat(file);
  if (!format) {
    return absl::InvalidArgumentError(
        file.string() +
        ": not an iteration trace (expected step_trace_<dev>_<model>_<iter>.json, "
        "step_trace_raw_<rank>_detail_time.csv or step_trace_time.csv)");
  }
  switch (*format) {
    case IterationTraceFormat::kMsprofStepTraceJson: return ReadMsprofStepTrace(file);
    case IterationTraceFormat::kMindSporeStepTraceRaw: return ReadMindSporeStepTrace(file);
    case IterationTraceFormat::kTorchNpuStepTraceTime: return ReadTorchNpuStepTrace(file);
  }
  return absl::InternalError("unreachable");
}

absl::StatusOr<std::vector<std::filesystem::path>> FindIterationTraces(
    const std::vector<std::string>& paths) {
  std::vector<std::filesystem::path> found;
  for (const std::string& p : paths) {
    std::error_code ec;
    if (std::filesystem::is_directory(p, ec)) {
      size_t before = found.size();
      for (const auto& entry : std::filesystem::recursive_directory_iterator(p, ec)) {
        if (entry.is_regular_file() && DetectIterationTraceFormat(entry.path())) {
          found.push_back(entry.path());
        }
      }
      if (ec) return absl::UnavailableError(p + ": " + ec.message());
      if (found.size() == before) {
        return absl::NotFoundError(p +
                                   ": no iteration traces (step_trace_*.json, "
                                   "step_trace_raw_*_detail_time.csv, step_trace_time.csv)");
      }
    } else if (std::filesystem::is_regular_file(p, ec)) {
      if (!DetectIterationTraceFormat(p)) {
        return absl::InvalidArgumentError(p + ": not an iteration trace this version reads");
      }
      found.emplace_back(p);
    } else {
      return absl::NotFoundError(p + ": no such file or directory");
    }
  }
  std::sort(found.begin(), found.end());
  found.erase(std::unique(found.begin(), found.end()), found.end());
  return found;
}

}  // namespace rankwatch
