// Stage 6 of the step-time diagnosis (operators/step_time_diagnosis.h): the note, one line in
// plain words that names the culprit and says where its time goes; and the lists the other
// labels' notes share.
//
// Pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "operators/step_time/cause.h"
#include "operators/step_time/culprit.h"
#include "operators/step_time/own_time.h"
#include "operators/step_time/signals.h"
#include "operators/step_time_diagnosis.h"

namespace rankwatch::step_time {

// The note of a straggler: who (the rank and its node, or the node and its ranks), how much
// more time per step it spends where (a phase against the median rank, outside every phase, in
// GC pauses with their count and length, or its own time when the excess is unattributed, saying
// why), and how much longer the other
// ranks wait for it in collectives where that is measured.
std::string StragglerNote(const Culprit& culprit, const CulpritSet& set,
                          const Attribution& attribution, const WindowSignals& signals,
                          const OwnTimeSignals& own_time);

// "3,5,7"; past 8 ranks "0,1,2,3,4,5,6,7 and N more".
std::string RankList(const std::vector<uint32_t>& ranks);

// "forward (0/4 ranks report it); optimizer (3/4 ranks report it; not ranks 3)".
std::string MissingText(const std::vector<MissingSignal>& missing);

}  // namespace rankwatch::step_time
