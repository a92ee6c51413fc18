// The telemetry batch format's contract between the producers (collector library, node
// agent, simulator, replays) and the daemon's BatchDecoder: the schema version writers set
// and the size limits a batch must stay within (proto/rankwatch/v1/telemetry.proto).
//
// Also the Kafka message limit every producer keeps its batches within (kDefaultMaxMessageBytes)
// and the arithmetic of that bound (MaxBatchPayloadBytes, EncodedFieldBytes).
//
// Constants, constexpr functions and a plain value type only; safe to use from any thread.
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

// The largest Kafka message a producer sends by default: librdkafka's `message.max.bytes`
// default, which its producer enforces itself (produce() refuses a larger message with
// MSG_SIZE_TOO_LARGE), and about a broker's (`message.max.bytes`) and a topic's
// (`max.message.bytes`) default of 1 MiB + 12. The collectors' setting `max_message_bytes`
// (--max-message-bytes, RANKWATCH_MAX_MESSAGE_BYTES) changes it; set it to the brokers' limit.
inline constexpr size_t kDefaultMaxMessageBytes = 1'000'000;
// The smallest max_message_bytes a collector accepts: room for a batch's identity and a
// step record with a few hundred ops.
inline constexpr size_t kMinMaxMessageBytes = 16 << 10;
// What a Kafka message costs beyond its value, kept free below max_message_bytes: the key (a
// training job id, at most BatchLimits::max_job_id_bytes), librdkafka's per-record overhead
// (36 bytes for the v2 format) and the record batch's header (61 bytes), with room to spare.
inline constexpr size_t kKafkaMessageOverheadBytes = 1024;

// The most serialized bytes a batch may have so that its message stays within
// `max_message_bytes` and the wire's BatchLimits::max_bytes.
constexpr size_t MaxBatchPayloadBytes(size_t max_message_bytes) {
  const size_t limit =
      max_message_bytes < BatchLimits{}.max_bytes ? max_message_bytes : BatchLimits{}.max_bytes;
  return limit > kKafkaMessageOverheadBytes ? limit - kKafkaMessageOverheadBytes : 0;
}

// The bytes a field of `payload` bytes (a message or a string in a repeated field) adds to its
// message, at most: a tag of up to 2 bytes (field numbers below 2048), the length varint, the
// payload.
constexpr size_t EncodedFieldBytes(size_t payload) {
  size_t varint = 1;
  for (size_t v = payload; v >= 0x80; v >>= 7) ++varint;
  return 2 + varint + payload;
}

}  // namespace rankwatch
