// Stage 4 of the step-time diagnosis (operators/step_time_diagnosis.h), run when a straggler
// score reaches the threshold: the culprit and its scope. Which signal names the culprit, from
// which window (all of it, or the newest steps), the culprit rank and every rank's excess in
// that window; then whether the culprit is that rank or its node.
//
// Pure functions; the results are plain values owned by the caller.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "operators/step_time/own_time.h"
#include "operators/step_time/scores.h"
#include "operators/step_time/signals.h"
#include "operators/step_time_diagnosis.h"

namespace rankwatch::step_time {

// The signal that names the culprit.
enum class CulpritSignal : uint8_t {
  kInput,    // the dataloader score
  kCompute,  // the compute score
  kOwn,      // the own-time score: the excess sits outside the phases, or in a part too small
             // to score alone
};

struct Culprit {
  CulpritSignal signal = CulpritSignal::kOwn;
  bool from_onset_window = false;  // the signal's onset score beat its full-window score
  uint32_t rank = 0;               // the worst rank of that signal in that window
  // Each rank's excess over the median rank in that window (seconds per step); NaN where the
  // rank has no value.
  RankValues excess;
  double burden = 0;  // the burden of that window (StragglerScores)
};

// Stage 4a. Input or compute when either reaches the threshold (compute when both do and its
// score is at least input's), else own time. Requires scores.any_hit().
Culprit ChooseCulprit(const StragglerScores& scores, const WindowSignals& signals,
                      const OwnTimeSignals& own_time);

struct CulpritSet {
  CulpritScope scope = CulpritScope::kRank;
  std::vector<uint32_t> ranks;  // kRank: the culprit; kNode: its node's ranks that exceed
  std::string node;             // the culprit rank's node; "" when unknown
};

// Stage 4b. The culprit's node when it has two or more ranks, two or more of them exceed
// options.straggler_warn (excess / burden), and those are at least options.node_fraction of its
// ranks; else the culprit rank. `rank_nodes[r]`: rank r's node name ("" when unknown).
CulpritSet ScopeOf(const Culprit& culprit, const std::vector<std::string>& rank_nodes,
                   const StepDiagnosisOptions& options);

}  // namespace rankwatch::step_time
