// The pipeline-parallel part of the accuracy benchmark (issue #34, acceptance 4): simulated
// data x pipeline x tensor parallel jobs (`FleetModel` with --parallel) with one slow worker,
// an imbalanced stage, sequence imbalance or GC pauses at a given slowdown of the job, and
// balanced ones; each step's records go to the daemon's per-job operators, and what they say
// after every aligned step is compared with the injected fault.
//
// Magnitude: the fault's parameter (a factor, a spread, a pause) is calibrated per run so that
// the slowdown S it causes is 1 + magnitude — S as the what-if study defines it (the job's mean
// step over that of the job with every op at its kind's mean duration), computed from the
// noiseless simulation over the fault's steps. Culprits (worker, stage, GC rank) vary with the
// seed, over every stage and tensor rank.
//
// Used only by accuracy_benchmark's main(); single-threaded.
#pragma once

#include <string>
#include <vector>

namespace rankwatch::accuracy {

struct PipelineAccuracyOptions {
  int seeds = 3;                   // fault runs per cell; balanced runs per layout: 3 x seeds
  std::vector<std::string> kinds;  // empty: every kind (slow-worker, stage-imbalance,
                                   // sequence-imbalance, gc)
  // Empty: every layout: 1F1B dp4-pp4-tp2, dp2-pp4-tp1, dp8-pp2-tp2; torch's schedules
  // dp4-pp4-tp2-interleaved, dp2-pp4-zbh1, dp2-pp4-zb1p, dp2-pp4-zbv, dp4-pp4-dualpipev.
  std::vector<std::string> layouts;
};

// Whether `name` is one of this part's kinds, or layouts.
bool IsPipelineKind(const std::string& name);
bool IsPipelineLayout(const std::string& name);

// Runs the matrix; prints a table per reader, the label distributions and one JSON line.
void RunPipelineAccuracy(const PipelineAccuracyOptions& options);

}  // namespace rankwatch::accuracy
