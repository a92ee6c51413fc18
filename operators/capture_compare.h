// Captures compared: a profiled culprit rank against a typical (reference) rank, operator by
// operator (issue #17). A capture is the torch.profiler (or Kineto) events of a few steps of one
// rank, sent by its collector on request (control.proto).
//
// Per rank, the events of each thread are nested by time (an event that holds another whole is
// its parent; the profiler's ranges nest that way) and each event's self time is its duration
// minus its direct children's, so that time is counted once: aten::linear's time is mostly
// aten::addmm's, and only aten::addmm shows it. Each event is given the training phase of the
// innermost range around it that names one (torch's own range names: "enumerate(DataLoader)#...",
// "DistributedDataParallel.forward", "autograd::engine::evaluate_function: ...",
// "Optimizer.step#...", collectives by name), or its own name's phase.
//
// Pure functions, no state.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace rankwatch {

enum class CapturePhase : int {
  kOther = 0,  // none of the ranges below (e.g. the loss, host code between phases)
  kDataloader,
  kForward,
  kBackward,
  kOptimizer,
  kCollective,
};
const char* CapturePhaseName(CapturePhase phase);

// The phase a range's name declares, or kOther when it declares none.
CapturePhase PhaseOfRangeName(const std::string& name);

// One captured event of one rank.
struct CapturedEvent {
  std::string name;
  std::string category;  // "cpu_op", "kernel", "user_annotation", ...
  int64_t ts_ns = 0;
  int64_t dur_ns = 0;
  uint64_t tid = 0;   // CPU thread (or GPU stream); events nest within one
  int64_t step = -1;  // training step; events without one are left out
};

struct OpTotals {
  double self_ns = 0;   // summed over the steps
  double total_ns = 0;  // inclusive, summed over the steps
  uint64_t calls = 0;
};

// An operator in a phase: aten::mm in forward and aten::mm in backward are two rows, so that
// an extra matrix multiplication in the forward pass shows where it is.
using OpKey = std::pair<std::string, CapturePhase>;

struct CaptureProfile {
  uint32_t steps = 0;             // distinct steps among the events
  uint64_t events = 0;            // events with a step
  double self_ns = 0;             // all self time
  std::map<OpKey, OpTotals> ops;  // by operator / kernel name and phase
};

CaptureProfile BuildCaptureProfile(std::vector<CapturedEvent> events);

struct OpComparison {
  std::string name;
  CapturePhase phase = CapturePhase::kOther;
  double culprit_seconds_per_step = 0;  // self time
  double reference_seconds_per_step = 0;
  double excess_seconds_per_step = 0;  // culprit - reference
  double culprit_calls_per_step = 0;
  double reference_calls_per_step = 0;
};

// Per name and phase, self time per step on each rank and the difference, the largest excess
// first (a row on one side only counts 0 on the other), the collectives' rows after all others:
// a collective's self time is mostly its rank waiting for the peers, which the rank's own work
// and the profiler's overhead on it move either way (on torch 2.13 the profiled culprit's
// gloo:all_reduce came out 6.8 ms a step above the reference's, over its 4.4-ms extra matrix
// product). At most `limit` rows. Empty when either profile has no steps.
std::vector<OpComparison> CompareCaptures(const CaptureProfile& culprit,
                                          const CaptureProfile& reference, size_t limit);

}  // namespace rankwatch
