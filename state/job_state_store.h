// The layout of the jobs' durable state in the StateStore: the one file that builds and parses
// the keys of the `jobs` and `alerts` families. A job's metadata, its window's steps, its alert
// lifecycle state and a pipeline job's what-if ops, and the alert log, are written into a
// Checkpoint and read back through the functions below; nothing else knows these keys (the
// outbound deliveries' keys are state/outbound_state.h's, the node records' fleet/node_ledger.h's).
//
// Keys of the `jobs` family (StateFamily::kJobs), one group per training job:
//   "m" job                        -> state::v1::JobMeta (carries the job's telemetry partition)
//   "s" job '\0' big-endian step   -> state::v1::StoredStep (in step order)
//   "a" job                        -> state::v1::AlertTrackerState
//   "w" job '\0' big-endian step   -> state::v1::WhatIfStepOps (a pipeline job's what-if: the
//                                     ops of each step in its window, in step order)
// Keys of the `alerts` family (StateFamily::kAlerts):
//   big-endian sequence            -> rankwatch.v1.Alert (the alert log, in sequence order)
// Offsets (StateFamily::kOffsets) are the StateStore's own (Checkpoint::SetOffset).
//
// Stateless functions; thread-safe as the StateStore they read.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "rankwatch/state/v1/job_state.pb.h"
#include "rankwatch/v1/service.pb.h"
#include "state/state_store.h"

namespace rankwatch::job_state {

// ---- Writing a job (into a checkpoint; values of metadata and steps are serialised later,
// by whoever commits the checkpoint) ----

// Stores the job's metadata and its newly aligned steps, and deletes its stored steps before
// `keep_from_step` (no window needs them any more).
void PutJob(const std::string& job, state::v1::JobMeta meta,
            std::vector<state::v1::StoredStep> new_steps, uint64_t keep_from_step, Checkpoint* out);

// Stores the ops of the steps a pipeline job's what-if analysed since the previous checkpoint,
// and deletes its stored ones before `keep_from_step` (out of the what-if's window; 0 deletes
// nothing).
void PutWhatIfSteps(const std::string& job, std::vector<state::v1::WhatIfStepOps> new_steps,
                    uint64_t keep_from_step, Checkpoint* out);

// Stores the job's alert lifecycle state.
void PutJobAlerts(const std::string& job, const state::v1::AlertTrackerState& alerts,
                  Checkpoint* out);

// Deletes everything stored of the job.
void DeleteJob(const std::string& job, Checkpoint* out);

// ---- Reading jobs ----

// A job as stored.
struct StoredJob {
  state::v1::JobMeta meta;
  std::vector<state::v1::StoredStep> steps;  // in step order
  std::optional<state::v1::AlertTrackerState> alerts;
  std::vector<state::v1::WhatIfStepOps> whatif_steps;  // in step order
};

// Reads every stored job, or those of telemetry `partition` (jobs whose metadata names it).
// Unreadable state is DataLoss naming what could not be read.
absl::StatusOr<std::vector<StoredJob>> ReadJobs(const StateStore& store,
                                                std::optional<int32_t> partition = std::nullopt);

// The stored steps of one job from `first` to `last` (inclusive), in step order, and the range
// of every step stored for it (both 0 when none is).
struct StoredSteps {
  std::vector<state::v1::StoredStep> steps;
  uint64_t stored_first = 0;
  uint64_t stored_last = 0;
};
// Unreadable steps are DataLoss naming the job.
absl::StatusOr<StoredSteps> ReadSteps(const StateStore& store, const std::string& job,
                                      uint64_t first, uint64_t last);
// The stored steps of one job from `first` to `last` only: the read starts at `first` (the
// range of every step stored is not known, left 0). Unreadable steps are DataLoss.
absl::StatusOr<std::vector<state::v1::StoredStep>> ReadStepRange(const StateStore& store,
                                                                 const std::string& job,
                                                                 uint64_t first, uint64_t last);

// Adds every stored key and value of `jobs` to `out` as puts (a full snapshot of them, for the
// changelog). Jobs not stored are skipped.
absl::Status CopyJobs(const StateStore& store, const std::vector<std::string>& jobs,
                      Checkpoint* out);

// Adds to `out` the deletion of every stored job of telemetry `partition` (before another
// instance's state of the partition replaces it).
absl::Status DeletePartition(const StateStore& store, int32_t partition, Checkpoint* out);

// ---- The alert log ----

// Stores `alert` under its sequence number.
void PutAlert(const v1::Alert& alert, Checkpoint* out);

// Deletes the stored alerts with a sequence below `first_kept`.
void TrimAlertLog(uint64_t first_kept, Checkpoint* out);

// The newest stored alert's sequence, 0 when none is stored.
absl::StatusOr<uint64_t> LastAlertSequence(const StateStore& store);

// Calls `fn(sequence, value)` for the stored alerts from sequence `from` on, in order, until
// `fn` returns false.
absl::Status ScanAlerts(const StateStore& store, uint64_t from,
                        const std::function<bool(uint64_t, std::string_view)>& fn);

}  // namespace rankwatch::job_state
