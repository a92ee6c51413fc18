// Where a straggler's episode began (StragglerTest::since_step; a pipeline job's what-if
// finding, WhatIfSnapshot::since_step), held from one evaluation to the next.
//
// A window shows an onset only while the onset is in it: once it slides out, the window alone
// says "since its first step, or earlier", and after a restart nothing older than the restored
// window is known. An OnsetHold keeps what earlier windows showed: while evaluations keep naming
// the same culprit, the onset a window showed is kept after it left the window; a window that
// shows an onset of its own (the excess stepped up inside it) replaces it. The episode breaks
// when another culprit is named, or when an evaluation named none (Absent) and the next window
// that names the culprit does not reach back to the last one that did: how often a daemon
// evaluates (a backlog after a restart is caught up in few evaluations) does not break it. Its
// state is checkpointed with the job (OnsetState), so a restarted or moved job reports the onset
// a daemon that ran through reports.
//
// Plain values; not thread-safe (owned by the job's pipeline or what-if).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "rankwatch/state/v1/job_state.pb.h"

namespace rankwatch::step_time {

struct Onset {
  uint64_t since_step = 0;
  bool known = false;  // a window showed it (else: since since_step or earlier)
  bool operator==(const Onset&) const = default;
};

// The best single step change of `values` (least squares: two levels, at least two values on
// each side), as DescribeExcess and StepChangeOnset fit it. With fewer than eight values, or no
// change better than flat, split is 0.
struct StepChangeFit {
  size_t split = 0;              // the change comes before values[split]
  double sum = 0;                // of every value
  double sse_flat = 0;           // residual around the mean
  double sse_step = 0;           // residual around the two levels (sse_flat when split is 0)
  double before = 0, after = 0;  // the levels
  // The change lifts the values from about nothing and explains most of the variation:
  // after > 0, after - before >= half of after, sse_step at most half of sse_flat.
  bool lifts() const {
    return split > 0 && after > 0 && after - before >= 0.5 * after && sse_step <= 0.5 * sse_flat;
  }
};
StepChangeFit FitStepChange(const std::vector<double>& values);

// The onset a series shows: the step where one step change lifts `values` (one per step of
// `steps`, oldest first) from about nothing, when it explains most of the variation (the
// steady case of step_time::DescribeExcess: after - before >= half of after, the change's
// residual at most half the flat one's, at least two values on each side, eight in all); else
// the first step, not known.
Onset StepChangeOnset(const std::vector<uint64_t>& steps, const std::vector<double>& values);

class OnsetHold {
 public:
  // An evaluation over the window [first, last] names `culprit` ("rank:3", "node:n1", ...),
  // whose onset the window shows as `shown`. Returns the onset to report:
  //  - `shown` when it is known (the window shows where the excess stepped up), or when the
  //    culprit was not held or its episode broke (Absent since, and the last window that named
  //    it ended before `first` - 1);
  //  - else the onset held: the culprit held through, and the window cannot show where it
  //    began.
  Onset Apply(const std::string& culprit, const Onset& shown, uint64_t first, uint64_t last);
  // An evaluation of a judged window named no culprit (the straggler may have ended).
  void Absent() { absent_ = !culprit_.empty(); }

  // The held culprit ("" none) and its onset.
  const std::string& culprit() const { return culprit_; }
  const Onset& onset() const { return onset_; }

  void Export(state::v1::OnsetState* out) const;
  void Import(const state::v1::OnsetState& in);

 private:
  std::string culprit_;
  Onset onset_;
  uint64_t confirmed_through_ = 0;
  bool absent_ = false;  // an evaluation named no culprit since the last that named it
};

}  // namespace rankwatch::step_time
