// Reads the per-op Chrome traces of the OSDI'25 what-if study ("Understanding Stragglers in
// Large Model Training Using What-if Analysis"; tests/fixtures/whatif-stragglers/README.md)
// into the what-if analyzer's input: the parallel layout and, per step, every worker's ops.
//
// The trace (`timeline-<name>.json` or `.json.gz`, a JSON array of events or an object with
// `traceEvents`): `pid` = data-parallel rank; `M` thread_name events name each thread
// "PP rank <stage>, TP rank <t>, <lane>"; each `X` event's `name` is its op type
// (whatif::OpKindFromName), `ts`/`dur` in µs, `args` {step, mb_id, model_chunk, seq_id}
// (-1 = none). Only TP rank 0's threads are read (a worker's tensor ranks move in lockstep).
// The layout comes from `meta-<name>.yaml` next to the trace when there is one (dp_size,
// pp_size, tp_size, vpp_size, dsp_size, world_size, trial_name), else it is inferred: dp = the
// highest pid + 1, pp = the highest PP rank + 1, tp = the highest TP rank + 1, vpp = the
// highest model chunk + 1.
//
// A WhatifTrace is a plain value owned by the caller; not thread-safe to mutate.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "operators/whatif/whatif.h"

namespace rankwatch {

struct WhatifTrace {
  std::filesystem::path file;
  std::filesystem::path meta_file;  // empty when the layout was inferred from the trace
  std::string trial_name;           // the meta file's, else the file name's <name>
  whatif::Layout layout;
  uint32_t context_parallel = 1;  // the meta file's dsp_size (informational)
  // Ascending step numbers. Each worker's ops (index stage * dp + data rank) sorted by
  // (ts, seq_id, kind); start_us is the trace's own µs time base, common to every worker, so
  // the absolute timestamps a replay publishes are start_us as written.
  std::vector<whatif::StepOps> steps;
  uint64_t events = 0;              // X events read (TP rank 0)
  uint64_t other_tp_events = 0;     // X events of TP ranks other than 0, skipped
  uint64_t negative_durations = 0;  // X events with dur < 0 (clock noise), read as 0
};

// Reads a trace file, or a directory holding exactly one `timeline-*.json[.gz]`. Errors are
// one line starting with the file name: NotFound for a missing file, InvalidArgument for
// malformed JSON, an event without pid/tid/ts/dur/args.step, an unknown op name, a thread
// without a well-formed name, ranks outside the meta file's layout, a
// malformed meta file, or a step missing a worker.
absl::StatusOr<WhatifTrace> ReadWhatifChromeTrace(const std::filesystem::path& path);

// Parses trace JSON already in memory (`json` with simdjson::SIMDJSON_PADDING readable bytes
// after its end). `meta_yaml` is the meta file's text, empty to infer the layout. `file` names
// the source in messages.
absl::StatusOr<WhatifTrace> ParseWhatifChromeTrace(std::string_view json,
                                                   std::string_view meta_yaml,
                                                   const std::filesystem::path& file);

// One op of one worker with its step, for a replay that publishes a worker's ops in time order.
struct WhatifWorkerOp {
  uint64_t step = 0;
  whatif::Op op;  // start_us absolute (the trace's time base)
};

// The ops of `worker` (stage * dp + data rank) over every step, in time order.
std::vector<WhatifWorkerOp> WhatifWorkerTimeline(const WhatifTrace& trace, uint32_t worker);

}  // namespace rankwatch
