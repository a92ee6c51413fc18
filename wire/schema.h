// The telemetry batch format's contract between the producers (collector library, node
// agent, simulator, replays) and the daemon's BatchDecoder: the schema version writers set
// and the size limits a batch must stay within (proto/rankwatch/v1/telemetry.proto).
//
// Constants and a plain value type only; safe to use from any thread.
#pragma once

#include <cstddef>
#include <cstdint>

namespace rankwatch {

// The schema major version this build writes and the newest it reads.
inline constexpr uint32_t kSchemaVersion = 1;

// Limits from proto/rankwatch/v1/telemetry.proto, each with its default. A reader rejects a
// batch over any of them; a producer keeps its batches within the defaults.
struct BatchLimits {
  size_t max_bytes = 4u << 20;  // 4 MiB
  size_t max_steps = 100'000;
  size_t max_kernels = 1'000'000;
  size_t max_samples = 10'000;
  size_t max_strings = 1'000'000;
  size_t max_string_bytes = 4096;  // every string field and interned string
  size_t max_job_id_bytes = 256;
  uint32_t max_world_size = 1u << 20;
  uint64_t max_duration_ns = 86'400ull * 1'000'000'000ull;  // one day
  uint64_t max_step = 1ull << 62;
  // Op records of one step record (StepRecord.ops); a collector keeps its first this many.
  size_t max_ops_per_step = 4096;
  // An op's microbatch and model chunk (OpRecord) are below this.
  uint32_t max_op_index = 1u << 16;
  // PyTorch Flight Recorder dumps (Batch.flight_recorder_dumps): dumps a batch, entries and
  // groups a dump (the node agent trims a dump's entries to fit), frames an entry, shapes
  // and dtypes an entry, dimensions a shape. Strings are bounded by max_string_bytes and
  // group members by max_world_size.
  size_t max_fr_dumps = 16;
  size_t max_fr_entries = 4096;
  size_t max_fr_groups = 16'384;
  size_t max_fr_frames = 64;
  size_t max_fr_tensors = 1024;
  size_t max_fr_dims = 64;
  // A timestamp (batch creation, step end, sample) more than this ahead of the reader's clock
  // is a producer with a wrong clock: its batches are rejected. Default: one hour.
  int64_t max_clock_ahead_ns = 3'600'000'000'000;
};

}  // namespace rankwatch
