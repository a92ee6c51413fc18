// Step-time diagnosis (docs/spec/step-diagnosis.md section 3, with its "beyond" parts): from the
// rolling window of one job, says whether the job is a straggler, input-bound, wait-heavy,
// compute-bound, balanced or incompletely instrumented, names the culprit rank or node by its
// own time (step time less the time it spent blocked on other ranks) wherever its time goes,
// and carries the evidence.
//
// Pure: a function of the window, the ranks' nodes, the hang input, the options and whether the
// job is sharded. It runs as named stages, each in its own file of operators/step_time/:
// signals.h (per-rank window means, missing phases), own_time.h (the blocked model, own time;
// WindowMean, BlockedModelOf and OwnTime below are defined there), scores.h, culprit.h (culprit
// and scope), cause.h, note.h.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "operators/phase_stats.h"
#include "operators/severity.h"
#include "operators/step_window.h"
#include "operators/time.h"

namespace rankwatch {

enum class StepLabel : uint8_t {
  kNoData,
  kHang,
  kStraggler,
  kInputStraggler,
  kComputeStraggler,
  kInputBound,
  kWaitHeavy,
  kComputeBound,
  kBalanced,
  // Some ranks do not report a phase the diagnosis needs, and nothing else fired: unknown, not
  // waiting (StepDiagnosis::missing names the phases and ranks).
  kIncompleteData,
};
inline constexpr int kStepLabelCount = 10;
// Metric label value: "no_data", "hang", "straggler", ..., "incomplete_data".
std::string_view StepLabelName(StepLabel label);

enum class CulpritScope : uint8_t { kNone, kRank, kNode };

// Where a straggler's excess sits. kOutside: time outside every measured phase (host code
// between phases, a custom autograd op after the model's output, work after the optimizer).
// kGc: garbage-collection pauses, wherever they fell (step_time/cause.h, GcExplains).
// The numbers are the wire's StragglerCause values.
enum class StragglerCause : uint8_t { kNone, kInput, kCompute, kBoth, kOutside, kGc };
std::string_view StragglerCauseName(StragglerCause cause);  // "input", "compute", ..., "gc"

// How a straggler's excess is spread over the window's steps (docs/diagnoses.md, "Patterns").
enum class StragglerPattern : uint8_t {
  kSteady,        // about the same excess every step
  kPeriodic,      // stalls at a regular period (a GC pass, a checkpoint, a log flush)
  kDrift,         // the excess rises step over step
  kIntermittent,  // stalls at irregular steps
};
std::string_view StragglerPatternName(StragglerPattern pattern);  // "steady", "periodic", ...

// Thresholds of the spec, with TraceML 0.3.5's share defaults (docs/diagnoses.md), and those of
// the statistical test (step_time/excess_check.h), measured with accuracy_benchmark and the real
// jobs of tests/collectors (benchmarks/README.md).
struct StepDiagnosisOptions {
  uint32_t min_steps = 8;        // fewer aligned steps -> no_data
  double straggler_warn = 0.10;  // input / compute / own-time straggler score
  double straggler_crit = 0.20;
  double input_share_warn = 0.10;
  double input_share_crit = 0.20;
  double wait_share_warn = 0.10;
  double wait_share_crit = 0.20;
  double compute_share_warn = 0.90;
  double compute_share_crit = 0.95;
  double bound_max_skew = 0.06;  // "bound" diagnoses need skew at most this
  // Fast onset (beyond): scores are also computed on the newest `onset_steps` steps, from
  // the least excess of a rank over the median rank in any of them, so a rank that became
  // slow is named within a few steps, while one slow step of a rank (a checkpoint, a GC
  // pause) or equal ranks taking turns being slow (CPU contention) name nobody.
  uint32_t onset_steps = 8;
  // Ranks whose step times differ by at most this skew run synchronised (data parallel).
  double sync_max_step_skew = 0.02;
  // A node is the culprit when at least this fraction of its ranks exceed the threshold.
  double node_fraction = 0.5;
  // Statistical detection: a rank whose mean excess over the median rank, over the newest 16,
  // 32, 64 or all steps of the window, is at least straggler_z standard errors of the
  // step-to-step noise and at least straggler_min_excess of the step's burden is a straggler,
  // whatever its share.
  bool statistical = true;
  double straggler_z = 6.0;
  double straggler_min_excess = 0.03;
  // Severity by cost: crit when the culprit costs the job at least this many ranks' worth of
  // time (lost rank-seconds a step / the median step), or its share reaches straggler_crit.
  double straggler_crit_lost_ranks = 8.0;
  // Patterns: a stall is a step whose excess rises above the rank's own baseline by at least
  // pattern_stall_sigma x the noise and pattern_stall_share of the burden; with at least
  // pattern_min_stalls of them the excess is periodic (most gaps within 1 step of the median
  // gap) or intermittent. Drift: a line fits the excess with at most pattern_drift_fit x the
  // squared error of the best single step change, and rises by at least straggler_min_excess of
  // the burden across the window.
  double pattern_stall_sigma = 6.0;
  double pattern_stall_share = 0.25;
  uint32_t pattern_min_stalls = 3;
  double pattern_drift_fit = 0.7;
  // Hang: no step aligned for max(hang_timeout_steps x median step time, hang_timeout_min).
  double hang_timeout_steps = 5;
  Duration hang_timeout_min = std::chrono::seconds(30);
};

struct RankExcess {
  uint32_t rank = 0;
  double excess_seconds = 0;  // per-step time above the median rank
};

// Cross-rank statistics of one per-rank signal (a phase, or compute) over the window.
struct SignalEvidence {
  PhaseStat stat;
  std::vector<RankExcess> top;  // at most 3 ranks above the median, largest excess first
};

// Garbage-collection pauses over the window (StepRecord gc_ns, gc_count; the ranks whose collector
// watches GC), per step.
struct GcEvidence {
  SignalEvidence time;            // per-rank GC time; not present when no rank reports GC
  double median_collections = 0;  // the median over the ranks reporting GC
  // The culprit rank when a straggler is named, else the rank with the most GC time; its GC time
  // and collections a step.
  uint32_t rank = 0;
  double rank_seconds = 0;
  double rank_collections = 0;
};

// Which clock the window's phases were timed with (docs/diagnoses.md, "Which clock").
enum class TimingClock : uint8_t {
  kHost,    // no rank-step of the window was timed on the device
  kDevice,  // every rank-step came with device timing on (a few may have had their events late)
  kMixed,   // some rank-steps were timed on the device, others by collectors timing on the host
};
std::string_view TimingClockName(TimingClock clock);  // "host", "device", "mixed"

// The window's rank-steps by clock (StepWindow::clock_steps; wire: TimingEvidence).
struct TimingEvidence {
  TimingClock clock = TimingClock::kHost;
  uint64_t device_steps = 0;  // timed on the device (StepRecord.clock STEP_CLOCK_DEVICE)
  uint64_t host_steps = 0;    // host times
  // Of host_steps: device timing was on, but the step's events were too late.
  uint64_t device_missing_steps = 0;
};
TimingEvidence TimingOf(const StepWindow& window);

// What the caller knows about progress, for the hang diagnosis.
struct HangInput {
  double seconds_since_last_aligned = 0;   // since a step last aligned (or the job appeared)
  std::vector<int64_t> last_step_by_rank;  // highest step each rank reported; -1 = none
};

// A phase the diagnosis needs that some ranks of the window do not report.
struct MissingSignal {
  Phase phase = Phase::kDataloader;
  uint32_t reporting = 0;  // ranks that report it
  // Ranks in the window (those that report a step time); for Phase::kStep, the world size
  // (ranks silent for the whole window).
  uint32_t ranks = 0;
  std::vector<uint32_t> missing_ranks;  // the first ranks that do not (<= 16)
};

// How the time a rank spent blocked waiting for other ranks is known, per rank and step.
struct BlockedModel {
  enum class Kind : uint8_t {
    kNone,           // ranks run independently: nothing is blocked time
    kUnknown,        // synchronised, but nothing measures or estimates the waiting
    kCollective,     // the reported collective time
    kBackward,       // synchronised, no collective: backward - forward x ratio
    kSharded,        // sharded, no collective: (forward + backward) - the least rank's
    kLeastBackward,  // synchronised, no collective, no forward: backward - the least rank's
  };
  // The estimated kinds (kBackward, kSharded, kLeastBackward) never count a GC pause as waiting:
  // they take each rank's GC time out of the phase that absorbs the waiting first (LessGc,
  // step_time/own_time.h), in the calibration below and in OwnTime.
  Kind kind = Kind::kNone;
  // kBackward: the least backward/forward ratio of any rank, the rank that waits least.
  double ratio = 0;
  // kSharded: the least per-step forward + backward (+ forward_backward) of any rank;
  // kLeastBackward: the least per-step backward (+ forward_backward).
  double least_forward_backward = 0;
};

// The evidence of a straggler verdict (wire: StragglerEvidence).
struct StragglerTest {
  bool present = false;
  uint32_t rank = 0;          // the rank tested: the culprit (for a node, its worst rank)
  double excess_seconds = 0;  // its mean excess over the median rank in the steps tested
  double noise_seconds = 0;   // the standard error of that mean
  double z = 0;
  uint32_t steps = 0;
  double lost_rank_seconds_per_step = 0;
  // Where the culprit's pattern began (ExcessPattern); when no window showed it
  // (onset_in_window false), the first step of the earliest window that named it: it held at
  // least that long. With an OnsetHold (DiagnoseStepTime), an onset an earlier window showed is
  // kept while the same culprit holds, also once it left the window: onset_in_window then
  // means "a window showed it".
  uint64_t since_step = 0;
  bool onset_in_window = false;
  StragglerPattern pattern = StragglerPattern::kSteady;
  double period_steps = 0;
  double stall_seconds = 0;
  uint32_t stalls = 0;
  double drift_seconds_per_step = 0;
};

struct StepDiagnosis {
  StepLabel label = StepLabel::kNoData;
  Severity severity = Severity::kInfo;
  uint32_t window_steps = 0;
  std::array<SignalEvidence, kPhaseCount> phases;
  // compute = forward + backward + optimizer (+ forward_backward) less the blocked time the
  // BlockedModel finds in them, per rank (e.g. - collective; without collective times under
  // synchronisation, a forward-calibrated estimate).
  SignalEvidence compute;
  // own = step time - blocked waiting (BlockedModel); outside = own - dataloader - compute, the
  // time outside every measured phase. Absent when the blocked time is unknown.
  SignalEvidence own, outside;
  GcEvidence gc;
  BlockedModel blocked;
  double input_share = 0, wait_share = 0, compute_share = 0;
  double input_score = 0, compute_score = 0, own_score = 0;
  StragglerCause cause = StragglerCause::kNone;  // straggler labels: where the excess sits
  std::vector<MissingSignal> missing;
  bool sharded = false;
  bool synchronized = false;  // step times equal across ranks (data parallel)
  bool collective_reported = false;
  bool from_onset_window = false;      // the straggler score came from the newest steps
  bool from_statistical_test = false;  // named by the statistical test, not by a share score
  StragglerTest straggler;             // straggler labels: the test, cost, since and pattern
  CulpritScope scope = CulpritScope::kNone;
  std::vector<uint32_t> culprit_ranks;
  std::string culprit_node;
  Phase culprit_phase = Phase::kStep;  // meaningless when cause is kOutside or kGc
  // Hang evidence.
  double hang_timeout_seconds = 0;
  double seconds_since_last_aligned = 0;
  std::vector<uint32_t> hang_suspects;  // ranks whose last reported step is lowest (<= 16)
  bool whole_job_stalled = false;
  int64_t lowest_last_step = -1;
  TimingEvidence timing;  // which clock the window's phases rest on
  std::string note;       // one line in plain words
  std::string next_step;  // the suggested next action
};

// A straggler verdict that names a culprit on device-timed steps says so: appends " (device
// time)" (" (device and host time)" on a mixed window) to the note. Nothing otherwise.
void NoteTiming(StepDiagnosis* d);

namespace step_time {
class OnsetHold;
}

// Diagnoses `window`. `rank_nodes[r]` is rank r's node name ("" when unknown). `sharded`: the
// job shards its parameters (forward waits for other ranks too). `onset` (optional): the
// straggler onset held from the job's previous evaluations (step_time/onset.h), consulted and
// updated when a straggler is named.
StepDiagnosis DiagnoseStepTime(const StepWindow& window, const std::vector<std::string>& rank_nodes,
                               const HangInput& hang, const StepDiagnosisOptions& options,
                               bool sharded = false, step_time::OnsetHold* onset = nullptr);

// Per-step mean of phase `p` of one rank over the window: a phase reported on some steps only
// (the optimizer under gradient accumulation) is averaged over every step the rank reported.
// NaN when the rank never reported it.
double WindowMean(const StepWindow::RankTotals& totals, Phase p);
// The same for GC pauses: time (seconds) and collections per step; NaN when the rank never
// reported GC.
double WindowGcMean(const StepWindow::RankTotals& totals);
double WindowGcCollections(const StepWindow::RankTotals& totals);

// The blocked model of a window (see BlockedModel), from its per-rank means.
BlockedModel BlockedModelOf(const StepWindow& window, bool synchronized, bool sharded);
// The same, with the synchronisation test of the diagnosis (step-time skew over the window at
// most options.sync_max_step_skew). O(ranks).
BlockedModel BlockedModelOf(const StepWindow& window, const StepDiagnosisOptions& options,
                            bool sharded);

// One rank's own time in one step (or over the window, from its means), or NaN when unknown.
// `v` holds the phases in any one unit (the result is in it); `present` is the phase bit set;
// `gc` the rank's GC pause time in that unit (0 when not reported): where the model estimates
// the blocked time from a phase that absorbs waiting, the GC in it is not waiting (LessGc).
double OwnTime(const std::array<double, kPhaseCount>& v, uint32_t present,
               const BlockedModel& model, double gc = 0);

}  // namespace rankwatch
