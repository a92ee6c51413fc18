// The JSON form of a job's live kernel results, served by rankwatchd at
// GET /kernel?training_job=J (and GET /kernel for the list of jobs). Per-step entries use the
// keys and units of `rankwatch analyze --format json` ("steps"), so the two compare directly.
// Pure; thread-safe.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "operators/kernel/kernel_job_summary.h"

namespace rankwatch {

std::string KernelJobJson(const kernel::KernelJobSnapshot& snapshot);

// {"jobs": ["a", "b"]}
std::string KernelJobListJson(const std::vector<std::string>& jobs);

}  // namespace rankwatch
