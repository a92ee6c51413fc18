// Stage 5 of the step-time diagnosis (operators/step_time_diagnosis.h): the cause. Where the
// culprit's excess over the median rank sits (dataloader, compute, outside every measured
// phase) and whether GC pauses explain most of it, the StragglerCause that follows, and the
// phase in which the culprit stands out most.
//
// Pure functions; the results are plain values owned by the caller.
#pragma once

#include <cstdint>

#include "operators/step_time/culprit.h"
#include "operators/step_time/own_time.h"
#include "operators/step_time/scores.h"
#include "operators/step_time/signals.h"
#include "operators/step_time_diagnosis.h"

namespace rankwatch::step_time {

// One rank's excess over the median rank over the window (seconds per step), in its own time
// and in its parts. A part counts 0 where its median is unknown: the dataloader when some ranks
// do not report it, compute when the compute phases are not reported alike
// (WindowSignals::ComputeConsistent), outside when any needed phase is missing; so an excess
// no part holds is unattributed.
//
// `gc` is the rank's GC pause time over the median rank's (ranks reporting GC; 0 when the rank
// does not report it). It is not a fourth part: a pause lengthens the part it fell in.
struct ExcessParts {
  double own = 0;
  double dataloader = 0;
  double compute = 0;
  double outside = 0;
  double gc = 0;
};
ExcessParts ExcessPartsOf(uint32_t rank, const WindowSignals& signals,
                          const OwnTimeSignals& own_time);

// Stage 5a. Input or compute culprit signals: kBoth when the other signal reaches the threshold
// too. Own time: the largest part (outside on a tie, then the dataloader), kNone when no part
// exceeds the median (e.g. a sharded job without collective times).
StragglerCause CauseOf(CulpritSignal signal, bool input_hit, bool compute_hit,
                       const ExcessParts& parts);

// Stage 5a, GC (docs/diagnoses.md, "GC pauses"). Whether GC pauses explain the largest part of
// the culprit's excess `named` (its excess in the signal that named it) or own time, whichever is
// larger. The GC excess is taken out of the parts it most plausibly fell in, the largest excess
// first, each down to 0; what no part held comes out of the unattributed rest (the excess no part
// holds). GC explains when its excess is above 0 and at least each remaining part and the rest.
// When it does, the cause is kGc whatever CauseOf says.
bool GcExplains(const ExcessParts& parts, double named);

// The phase in which the culprit stands out most, with its excess over the median rank and that
// median (seconds per step).
struct CulpritPhase {
  // Phase::kWait stands for "outside every phase" (the wire's PHASE_OUTSIDE) and for an
  // unattributed excess.
  Phase phase = Phase::kDataloader;
  double excess = 0;
  double median = 0;
};

// Stage 5b. Compute causes (or the compute signal): the compute phase with the largest excess
// over the median rank, backward (or forward_backward without backward) less the rank's blocked
// time; the dataloader when the rank reports no compute phase. kOutside, kGc and kNone: kWait.
// Otherwise the dataloader.
CulpritPhase CulpritPhaseOf(StragglerCause cause, CulpritSignal signal, uint32_t rank,
                            const ExcessParts& parts, const WindowSignals& signals,
                            const OwnTimeSignals& own_time);

// What stage 5 finds.
struct Attribution {
  ExcessParts parts;  // of the culprit rank
  StragglerCause cause = StragglerCause::kNone;
  CulpritPhase phase;
};

// Stage 5: ExcessPartsOf, GcExplains (else CauseOf) and CulpritPhaseOf for `culprit`.
Attribution Attribute(const Culprit& culprit, const StragglerScores& scores,
                      const WindowSignals& signals, const OwnTimeSignals& own_time);

}  // namespace rankwatch::step_time
