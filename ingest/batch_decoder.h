// BatchDecoder: turns the bytes of one Kafka message into a validated telemetry `Batch`, or
// says why not. Bad input is normal (ARCHITECTURE.md): every rejection has a reason that the
// daemon counts, and nothing here throws or aborts on input. The version and limits it checks
// are the wire contract in wire/schema.h.
//
// Thread-compatible: const methods may run concurrently on distinct output batches.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "rankwatch/v1/telemetry.pb.h"
#include "wire/schema.h"

namespace rankwatch {

enum class RejectReason {
  kNone = 0,
  kOversized,        // message larger than BatchLimits::max_bytes
  kMalformed,        // not a protobuf Batch
  kSchemaVersion,    // version 0 (not a rankwatch batch) or newer than kSchemaVersion
  kMissingSource,    // no source identity or no training job id
  kBadRank,          // world size 0 or too large, rank >= world size, a layout that does not fit
  kTooManyRecords,   // a repeated field over its limit (a step's ops too)
  kBadValue,         // a duration, step number, timestamp or sample outside its range (NaN, inf)
  kBadString,        // string table index out of range, or an oversized string in any field
  kFutureTimestamp,  // a timestamp further ahead of the daemon's clock than max_clock_ahead_ns
};
inline constexpr int kRejectReasonCount = 10;

// Metric label value ("oversized", "malformed", ...).
std::string_view RejectReasonName(RejectReason reason);

// What an accepted batch carried that the daemon reads past instead of rejecting, for the
// caller to count. Op types are a proto3 open enum: a newer collector may send types this build
// does not know (and OP_UNSPECIFIED is no type); the batch is accepted and the what-if analysis
// skips those ops.
struct DecodeNotes {
  uint64_t ops = 0;               // op records (StepRecord.ops) in the batch
  uint64_t unknown_op_types = 0;  // of which of a type this build does not know
};

class BatchDecoder {
 public:
  explicit BatchDecoder(BatchLimits limits = {}) : limits_(limits) {}

  // Parses `bytes` into `batch` (cleared first; reuse it across calls to keep its memory)
  // and validates it. Returns kNone on success; otherwise the reason, with a one-line
  // explanation in `detail` when it is not null. Timestamps are checked against
  // `wall_now_unix_ns` when it is not 0. `notes`, when not null, is set for an accepted batch.
  [[nodiscard]] RejectReason Decode(std::string_view bytes, v1::Batch* batch,
                                    std::string* detail = nullptr, int64_t wall_now_unix_ns = 0,
                                    DecodeNotes* notes = nullptr) const;

  // Validates an already-parsed batch (what Decode runs after parsing).
  [[nodiscard]] RejectReason Validate(const v1::Batch& batch, std::string* detail,
                                      int64_t wall_now_unix_ns = 0,
                                      DecodeNotes* notes = nullptr) const;

 private:
  RejectReason ValidateSource(const v1::Batch& batch, std::string* detail) const;
  RejectReason ValidateSteps(const v1::Batch& batch, std::string* detail, int64_t wall_now_unix_ns,
                             DecodeNotes* notes) const;
  // A step's ops: how many, their durations, offsets and indexes (`chunks`: the model chunks
  // of the source's layout, 0 without one).
  RejectReason ValidateOps(const v1::StepRecord& step, uint32_t chunks, std::string* detail,
                           DecodeNotes* notes) const;
  RejectReason ValidateKernels(const v1::Batch& batch, std::string* detail) const;
  // Flight Recorder dumps: each the source's rank, a known state, within the fr limits.
  RejectReason ValidateFlightRecorder(const v1::Batch& batch, std::string* detail) const;
  RejectReason ValidateFrEntry(const v1::FlightRecorderEntry& e, std::string* detail) const;
  RejectReason ValidateSamples(const v1::Batch& batch, std::string* detail,
                               int64_t wall_now_unix_ns) const;
  // Whether `unix_ns` is negative, or ahead of the clock by more than the limit.
  RejectReason CheckTime(int64_t unix_ns, int64_t wall_now_unix_ns, const char* what,
                         std::string* detail) const;

  BatchLimits limits_;
};

}  // namespace rankwatch
