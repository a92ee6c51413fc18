// StepAligner: collects one job's per-rank step records until every rank has reported a
// step (or its alignment timeout passes) and releases aligned steps in step order.
//
// Event time is the step number (ARCHITECTURE.md "Key decisions"). A step closes when all
// `world_size` ranks reported it, or `align_timeout` after its first record arrived; steps
// close strictly in ascending order, so a complete step waits behind an older incomplete one.
// Memory is bounded by `max_pending_steps * world_size` samples.
//
// Not thread-safe: owned by the job's worker thread.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "absl/status/statusor.h"
#include "operators/step_sample.h"
#include "operators/time.h"
#include "rankwatch/state/v1/job_state.pb.h"

namespace rankwatch {

struct StepAlignerOptions {
  // A step that some ranks have not reported closes this long after its first record.
  // Default: 10 s.
  Duration align_timeout = std::chrono::seconds(10);
  // At most this many steps wait for ranks; past it the oldest closes as if timed out.
  // Default: 256.
  size_t max_pending_steps = 256;
};

// A closed step: the samples of the ranks that reported it, ordered by rank.
struct AlignedStep {
  uint64_t step = 0;
  uint32_t world_size = 0;
  bool timed_out = false;  // closed with ranks missing
  std::vector<StepSample> samples;
};

enum class AlignOutcome {
  kAccepted,
  kDuplicate,       // this rank already reported this step
  kLate,            // the step had already closed without this rank
  kRankOutOfRange,  // rank >= world size
};

class StepAligner {
 public:
  StepAligner(uint32_t world_size, StepAlignerOptions options);

  // Adds one rank's record. Steps that became complete are appended to `closed`, oldest
  // first. Records for closed steps are counted as late (or duplicate) and dropped.
  AlignOutcome Add(const StepSample& sample, TimePoint now, std::vector<AlignedStep>* closed);

  // Closes the steps whose alignment timeout has passed at `now`, appending them to `closed`.
  void Expire(TimePoint now, std::vector<AlignedStep>* closed);
  // Moves the alignment timeout of every open step `by` later: time in which the daemon could
  // not read the missing records (a restored state waiting for its partition) does not count.
  void Delay(Duration by);

  uint32_t world_size() const { return world_size_; }
  size_t pending_steps() const { return pending_.size(); }
  bool has_closed() const { return has_closed_; }
  // Valid when has_closed().
  uint64_t last_closed_step() const { return last_closed_step_; }
  // Highest step `rank` reported, or -1 when it reported nothing yet.
  int64_t last_step_of(uint32_t rank) const { return last_step_by_rank_[rank]; }
  // Ranks that reported at least one step.
  uint32_t ranks_seen() const { return ranks_seen_; }

  // The durable form of the aligner: pending steps with their first-seen times as wall clock
  // (`now` on the steady clock is `wall_now_unix_ns` on the wall clock).
  state::v1::AlignerState ExportState(TimePoint now, int64_t wall_now_unix_ns) const;
  // Rebuilds an aligner from ExportState's output; a damaged state is DataLoss.
  static absl::StatusOr<std::unique_ptr<StepAligner>> FromState(
      const state::v1::AlignerState& state, StepAlignerOptions options, TimePoint now,
      int64_t wall_now_unix_ns);

 private:
  struct Pending {
    std::vector<StepSample> by_rank;  // indexed by rank; valid where seen[rank]
    std::vector<bool> seen;
    uint32_t count = 0;
    TimePoint first_seen;
  };

  void CloseFront(bool timed_out, std::vector<AlignedStep>* closed);
  void Drain(TimePoint now, std::vector<AlignedStep>* closed);

  const uint32_t world_size_;
  const StepAlignerOptions options_;
  std::map<uint64_t, Pending> pending_;
  std::map<uint64_t, Pending>::iterator hint_ = pending_.end();
  std::vector<int64_t> last_step_by_rank_;
  uint32_t ranks_seen_ = 0;
  bool has_closed_ = false;
  uint64_t last_closed_step_ = 0;
};

}  // namespace rankwatch
