// Step records as JSON Lines (`*.steps.jsonl`): what a collector records on a machine without
// Kafka (a GPU box), for `rankwatch replay --format records` to publish into a daemon elsewhere
// (docs/formats.md, "Step records as JSON Lines"). One line a record:
//
//   {"rank": 0, "world_size": 2, "node": "gpu-1", "device": "cuda:0",
//    "record": {"step": "12", "forwardNs": "30000000", "clock": "STEP_CLOCK_DEVICE", ...}}
//
// `record` is a rankwatch.v1.StepRecord in protobuf's JSON mapping (fields and enum names this
// version does not know are ignored: a newer collector's); `rank` is required, the others
// optional. Blank lines are skipped.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "rankwatch/v1/telemetry.pb.h"

namespace rankwatch {

struct StepRecordLine {
  uint32_t rank = 0;
  uint32_t world_size = 0;  // 0: the line did not say
  std::string node;
  std::string device;
  v1::StepRecord record;
};

// Whether `file` is named like a step-records file (`*.steps.jsonl`).
bool IsStepRecordsFile(const std::filesystem::path& file);

// Reads one file, in line order. A line that is not such an object (bad JSON, a record the JSON
// mapping refuses, no rank, a rank not below its world size) is an InvalidArgument error naming
// the file and the line (`FILE:LINE: ...`); an unreadable file names the file.
absl::StatusOr<std::vector<StepRecordLine>> ReadStepRecordsJsonl(const std::filesystem::path& file);

// Expands `paths` into step-records files, sorted: a named file must be one (`*.steps.jsonl`), a
// directory is searched recursively and must hold at least one; a missing path is an error.
absl::StatusOr<std::vector<std::filesystem::path>> FindStepRecordFiles(
    const std::vector<std::string>& paths);

}  // namespace rankwatch
