// Turns Kineto (PyTorch profiler) trace files into the telemetry batches of one training job,
// as a collector streaming kernel events would send them: one source rank per trace (the rank
// of its distributedInfo), each event tagged with its ProfilerStep (the step of the corrected
// mode's windows: the launch's step for GPU ops), batches of bounded size (at most `max_bytes`
// serialized: a Kafka message of max_message_bytes holds each), ranks interleaved
// step by step. The last batch of each rank ends the file (`trace.end_of_file`: the daemon
// closes its steps) and, for a replay of a finished job, is final. Events outside every step
// are not sent (the live path analyses per-step windows). Used by `rankwatch replay` and by
// the node agent for the traces a profiler writes while the job runs.
//
// Not thread-safe; a plain function of its input files.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "rankwatch/v1/telemetry.pb.h"
#include "wire/schema.h"

namespace rankwatch {

struct KinetoReplayOptions {
  std::string training_job;
  uint32_t world_size = 0;     // default (0): the highest rank found + 1
  size_t max_events = 20'000;  // kernel events per batch (default 20,000)
  // Serialized bytes per batch, at most (a batch holds one event at least). Default: what a
  // Kafka message of 1,000,000 bytes holds, MaxBatchPayloadBytes(kDefaultMaxMessageBytes);
  // callers pass their publisher's max_batch_bytes().
  size_t max_bytes = MaxBatchPayloadBytes(kDefaultMaxMessageBytes);
  size_t max_string_bytes = 4096;              // longer names are cut (the daemon's limit)
  int64_t created_unix_ns = 0;                 // stamped on every batch
  std::string node;                            // default: none
  std::string collector = "rankwatch-replay";  // the batches' `source.collector`
  // The last batch of each rank is `final` (the job ended). Default: true; false for traces of
  // a job that goes on (the node agent).
  bool final = true;
};

struct KinetoReplayStats {
  size_t files = 0, ranks = 0;
  uint32_t world_size = 0;
  // events and batches: those `publish` took (a failed publish stops the replay)
  uint64_t events = 0, steps = 0, batches = 0, unstepped = 0, truncated_names = 0;
};

// Reads `files` and hands each batch to `publish`, in order; stops at the first error (a bad
// file: InvalidArgument naming it; or `publish`'s error).
absl::Status ReplayKinetoTraces(const std::vector<std::filesystem::path>& files,
                                const KinetoReplayOptions& options,
                                const std::function<absl::Status(const v1::Batch&)>& publish,
                                KinetoReplayStats* stats);

}  // namespace rankwatch
