// BatchDecoder: turns the bytes of one Kafka message into a validated telemetry `Batch`, or
// says why not. Bad input is normal (ARCHITECTURE.md): every rejection has a reason that the
// daemon counts, and nothing here throws or aborts on input.
//
// Thread-compatible: const methods may run concurrently on distinct output batches.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "rankwatch/v1/telemetry.pb.h"

namespace rankwatch {

// The schema major version this build writes and the newest it reads.
inline constexpr uint32_t kSchemaVersion = 1;

enum class RejectReason {
  kNone = 0,
  kOversized,        // message larger than BatchLimits::max_bytes
  kMalformed,        // not a protobuf Batch
  kSchemaVersion,    // version 0 (not a rankwatch batch) or newer than kSchemaVersion
  kMissingSource,    // no source identity or no training job id
  kBadRank,          // world size 0 or too large, rank >= world size
  kTooManyRecords,   // a repeated field over its limit
  kBadValue,         // a duration or step number outside its range
  kBadString,        // string table index out of range, or an oversized string
};
inline constexpr int kRejectReasonCount = 9;

// Metric label value ("oversized", "malformed", ...).
std::string_view RejectReasonName(RejectReason reason);

// Limits from proto/rankwatch/v1/telemetry.proto, each with its default.
struct BatchLimits {
  size_t max_bytes = 4u << 20;                 // 4 MiB
  size_t max_steps = 100'000;
  size_t max_kernels = 1'000'000;
  size_t max_samples = 10'000;
  size_t max_strings = 1'000'000;
  size_t max_string_bytes = 4096;
  size_t max_job_id_bytes = 256;
  uint32_t max_world_size = 1u << 20;
  uint64_t max_duration_ns = 86'400ull * 1'000'000'000ull;  // one day
  uint64_t max_step = 1ull << 62;
};

class BatchDecoder {
 public:
  explicit BatchDecoder(BatchLimits limits = {}) : limits_(limits) {}

  // Parses `bytes` into `batch` (cleared first; reuse it across calls to keep its memory)
  // and validates it. Returns kNone on success; otherwise the reason, with a one-line
  // explanation in `detail` when it is not null.
  [[nodiscard]] RejectReason Decode(std::string_view bytes, v1::Batch* batch,
                                    std::string* detail = nullptr) const;

  // Validates an already-parsed batch (what Decode runs after parsing).
  [[nodiscard]] RejectReason Validate(const v1::Batch& batch, std::string* detail) const;

 private:
  RejectReason ValidateSteps(const v1::Batch& batch, std::string* detail) const;
  RejectReason ValidateKernels(const v1::Batch& batch, std::string* detail) const;

  BatchLimits limits_;
};

}  // namespace rankwatch
