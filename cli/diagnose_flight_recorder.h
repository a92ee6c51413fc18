// `rankwatch diagnose`'s Flight Recorder section: the verdict of a hung job's PyTorch Flight
// Recorder dumps (Diagnosis.flight_recorder), culprits first, then one table per rank that
// merges the rank's stack (from the hang stacks, when the daemon has them) with its last
// operation in each of its process groups.
//
// Pure printing to stdout; no state.
#pragma once

#include <string>

#include "rankwatch/v1/service.pb.h"

namespace rankwatch {

// Prints nothing when the verdict is empty (no dump came).
void PrintFlightRecorder(const v1::FlightRecorderVerdict& v, const v1::HangStacks& stacks);

// "all_to_all #45265", "send (peer 8) #14147".
std::string FlightRecorderOpText(const v1::FlightRecorderOp& op);

}  // namespace rankwatch
