// Iteration traces of vendor profilers, read as step records (a bounded source for
// `rankwatch replay`). Formats and quirks: docs/spec/formats.md.
//
//   msprof timeline `step_trace_<dev>_<model>_<iter>.json` (Chrome-trace array; rank from the
//     device directory's info.json.<dev>): step = Iteration ID; dataloader = Data_aug Bound
//     (the gap before the iteration's FP start); forward_backward = FP_BP Time; optimizer =
//     Iteration Refresh (BP end -> iteration end: gradient reduction and update); collective =
//     the Reduce spans; step_time = dataloader + Iteration Time. Units from the key suffix.
//   MindSpore `step_trace_raw_<rank>_detail_time.csv` (10 ns ticks; the `-` averages row is
//     skipped): dataloader = iteration_interval, forward_backward = fp_and_bp, optimizer = tail,
//     collective = the union of the communication ops' [start, end] intervals (ops on several
//     streams overlap: their durations can add up to more than the step), step_time = total.
//   torch_npu `ASCEND_PROFILER_OUTPUT/step_trace_time.csv` (µs, CRLF; rank from
//     profiler_info_<rank>.json or the `rank<N>_ascend_pt` directory): dataloader = Preparing,
//     collective = Communication(Not Overlapped), forward_backward = Computing + collective,
//     step_time = Preparing + Stage (so wait = Free).
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "rankwatch/v1/telemetry.pb.h"

namespace rankwatch {

enum class IterationTraceFormat {
  kMsprofStepTraceJson,
  kMindSporeStepTraceRaw,
  kTorchNpuStepTraceTime,
};

struct IterationTrace {
  std::filesystem::path file;
  IterationTraceFormat format;
  uint32_t rank = 0;
  std::string node;                   // host name when the trace says
  std::string device;                 // e.g. "npu:1"
  std::vector<v1::StepRecord> steps;  // ascending step numbers, durations in ns
};

// The format of a file, from its name; nullopt for files that are not iteration traces.
std::optional<IterationTraceFormat> DetectIterationTraceFormat(const std::filesystem::path& file);

// Reads one iteration trace. Errors name the file (and the line for CSV files).
absl::StatusOr<IterationTrace> ReadIterationTrace(const std::filesystem::path& file);

// Expands `paths` (files, or directories searched recursively) into iteration-trace files,
// sorted. A named file of unknown format, a missing path, or nothing found is an error.
absl::StatusOr<std::vector<std::filesystem::path>> FindIterationTraces(
    const std::vector<std::string>& paths);

// Format-specific readers (ReadIterationTrace dispatches to them).
absl::StatusOr<IterationTrace> ReadMsprofStepTrace(const std::filesystem::path& file);
absl::StatusOr<IterationTrace> ReadMindSporeStepTrace(const std::filesystem::path& file);
absl::StatusOr<IterationTrace> ReadTorchNpuStepTrace(const std::filesystem::path& file);

}  // namespace rankwatch
