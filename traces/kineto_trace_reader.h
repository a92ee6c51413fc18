// Reads a Kineto (PyTorch profiler) Chrome trace, `.json` or `.json.gz`, into compact events:
// the complete events (those with `dur` and `cat`) with the args the kernel analyses use,
// names and categories interned. Definitions and quirks: docs/spec/kernel-analysis.md
// sections 1.1, 1.2 and 13.
//
// Timestamps are kept exactly as written, in integer nanoseconds (Kineto writes µs with at most
// three decimals); whether any `ts` was written as a fractional number is recorded, because
// HTA's ns-rounding depends on it. The reader applies no analysis rule: dropping the "Trace"
// span, correlation, alignment and step filtering belong to operators/kernel.
//
// A KinetoTrace is a plain value: owned by the caller, not thread-safe to mutate.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace rankwatch {

// One complete event. 64 bytes; strings are ids into KinetoTrace::strings.
struct KinetoEvent {
  int64_t ts_ns = 0;
  int64_t dur_ns = 0;
  int64_t stream = -1;        // args.stream; absent or non-numeric -> -1
  int64_t correlation = -1;   // args.correlation
  int64_t bytes = -1;         // args.bytes (memcpy / memset)
  double memory_bw_gbps = 0;  // args["memory bandwidth (GB/s)"]
  uint32_t name = 0;
  uint32_t category = 0;
  uint32_t index = 0;  // position in `traceEvents` (HTA's row label)
  int32_t pid = 0;     // OS pid, or device id for GPU events
};

struct KinetoTrace {
  std::filesystem::path file;
  std::vector<std::string> strings;  // interned names and categories; strings[0] == ""
  std::vector<KinetoEvent> events;   // in trace order
  uint64_t raw_events = 0;           // elements of `traceEvents`
  // Rank as HTA finds it: the first line matching `"rank":\s+(\d+)`; nullopt when none does
  // (compact JSON), in which case HTA uses rank 0.
  std::optional<uint32_t> hta_rank;
  std::optional<uint32_t> json_rank;         // distributedInfo.rank
  std::optional<uint32_t> world_size;        // distributedInfo.world_size
  std::string backend;                       // distributedInfo.backend
  std::optional<int64_t> base_time_unix_ns;  // baseTimeNanoseconds
  // Any `ts` was written as a non-integer JSON number (or was missing): HTA's ts column is
  // then floating point and its ns-rounding applies.
  bool ts_is_float = false;
  uint64_t decompressed_bytes = 0;

  // The rank to report: distributedInfo.rank, else the regex rank, else 0.
  uint32_t rank() const { return json_rank ? *json_rank : hta_rank.value_or(0); }
  std::string_view str(uint32_t id) const { return strings[id]; }
};

// Reads and parses one trace file (gzip detected by its magic bytes, not its name). Errors are
// InvalidArgument/NotFound with a message that starts with the file name and says why.
absl::StatusOr<KinetoTrace> ReadKinetoTrace(const std::filesystem::path& file);

// Parses trace JSON already in memory. `json` must stay valid for the call and have
// simdjson::SIMDJSON_PADDING readable bytes after its end. `file` is used in messages only.
absl::StatusOr<KinetoTrace> ParseKinetoTrace(std::string_view json,
                                             const std::filesystem::path& file);

// Parses trace JSON fed in pieces of `piece` bytes (at least 1), as ReadKinetoTrace feeds a
// file's pieces: the result is the same as ParseKinetoTrace's wherever the pieces end. For
// tests; no padding is needed after `json`.
absl::StatusOr<KinetoTrace> ParseKinetoTraceInPieces(std::string_view json, size_t piece,
                                                     const std::filesystem::path& file);

// Expands `paths` (files, or directories searched recursively for *.json and *.json.gz) into
// trace files, sorted. A missing path, or a directory without traces, is an error.
absl::StatusOr<std::vector<std::filesystem::path>> FindKinetoTraces(
    const std::vector<std::string>& paths);

}  // namespace rankwatch
