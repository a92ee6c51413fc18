// CSV files of `rankwatch analyze --format csv`: one file per analysis with the columns,
// row order and rounding of HTA's data frames written by pandas' to_csv (floats as Python's
// repr, NaN as an empty field), so notebooks written for HTA read them unchanged.
// Not thread-safe: one writer per output directory.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "operators/kernel/kernel_report.h"
#include "operators/kernel/timeline_builder.h"

namespace rankwatch {

// Python's repr of a double ("10.0", "1e-05", "0.00048828125"); "" for NaN.
std::string PyFloat(double x);
// Python's round(x, digits) then repr.
std::string PyRound(double x, int digits);

struct AnalyzeCsvInput {
  const kernel::JobTimelines* timelines = nullptr;
  std::vector<kernel::RankKernelReport> reports;  // whole-trace report per rank
  std::vector<uint32_t> stragglers;
  double runtime_cutoff_us = 50;
  double launch_delay_cutoff_us = 100;
};

// Writes every CSV into `dir` (created if missing). Errors name the file.
absl::Status WriteAnalyzeCsv(const AnalyzeCsvInput& in, const std::filesystem::path& dir);

}  // namespace rankwatch
