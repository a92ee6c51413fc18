#include "flight_recorder/fr_dump.h"

namespace rankwatch::fr {

const char* FrStateName(FrState s) {
  switch (s) {
    case FrState::kScheduled: return "scheduled";
    case FrState::kStarted: return "started";
    case FrState::kCompleted: return "completed";
    case FrState::kUnknown: return "unknown";
  }
  return "unknown";
}

}  // namespace rankwatch::fr
