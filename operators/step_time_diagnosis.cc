#include "operators/step_time_diagnosis.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <optional>
#include <utility>

#include "operators/step_time/cause.h"
#include "operators/step_time/culprit.h"
#include "operators/step_time/note.h"
#include "operators/step_time/own_time.h"
#include "operators/step_time/scores.h"
#include "operators/step_time/signals.h"

// DiagnoseStepTime runs the stages of operators/step_time/ in order: signals (signals.h), own
// time and the blocked model (own_time.h), the straggler scores (scores.h); when a score reaches
// the threshold, the culprit and its scope (culprit.h), the cause (cause.h) and the note
// (note.h); else the "bound" labels. The first label that applies ends the diagnosis; every
// stage that ran leaves its evidence in the StepDiagnosis.

namespace rankwatch::step_time {
namespace {

// A diagnosis' conclusion.
struct Verdict {
  StepLabel label;
  Severity severity;
  std::string note;
};

std::string_view NextStep(StepLabel label, StragglerCause cause) {
  switch (label) {
    case StepLabel::kNoData: return "wait for more aligned steps";
    case StepLabel::kHang:
      return "dump the stacks of the suspect ranks (py-spy dump) and check their collectives";
    case StepLabel::kStraggler:
      if (cause == StragglerCause::kGc) {
        return "cut or align the worst rank's garbage collection: gc.freeze() after the model "
               "and data are set up, higher gc.set_threshold() limits, or gc.disable() with a "
               "gc.collect() at the same step on every rank; break the reference cycles its "
               "step creates (gc.set_debug(gc.DEBUG_SAVEALL) shows them)";
      }
      return cause == StragglerCause::kOutside
                 ? "profile the worst rank's host code between the timed phases (loss, custom "
                   "autograd functions, logging, checkpoints, CPU contention on its host)"
                 : "inspect both input and compute unevenness";
    case StepLabel::kInputStraggler: return "inspect the input path on the worst rank";
    case StepLabel::kComputeStraggler: return "inspect the compute path on the worst rank";
    case StepLabel::kInputBound: return "inspect dataloader workers, preprocessing, storage";
    case StepLabel::kWaitHeavy: return "inspect sync points and uneven progress";
    case StepLabel::kComputeBound: return "inspect forward/backward/optimizer cost";
    case StepLabel::kBalanced: return "nothing to do";
    case StepLabel::kIncompleteData:
      return "instrument the missing phases on every rank (rw.dataloader, instrument_module, "
             "instrument_optimizer) to restore coverage";
  }
  return "";
}

// `rank`'s GC time and collections a step into `gc` (0 where it reports no GC).
void SetGcRank(const WindowSignals& s, uint32_t rank, GcEvidence& gc) {
  if (!gc.time.stat.present || rank >= s.gc.size()) return;
  gc.rank = rank;
  gc.rank_seconds = Known(s.gc[rank]) ? s.gc[rank] : 0.0;
  gc.rank_collections = Known(s.gc_collections[rank]) ? s.gc_collections[rank] : 0.0;
}

// The evidence of stages 1 and 2.
void RecordSignals(const WindowSignals& s, const OwnTimeSignals& t, StepDiagnosis& d) {
  d.phases = s.evidence;
  d.collective_reported = s.evidence[PhaseIndex(Phase::kCollective)].stat.present;
  d.synchronized = t.synchronized;
  d.blocked = t.blocked;
  d.missing = s.missing;
  d.compute = t.compute_evidence;
  d.own = t.own_evidence;
  d.outside = t.outside_evidence;
  d.gc.time = s.gc_evidence;
  d.gc.median_collections = s.gc_median_collections;
  SetGcRank(s, s.gc_evidence.stat.worst_rank, d.gc);
}

// Hang (beyond): no step aligned for longer than d.hang_timeout_seconds. Records the suspects.
Verdict HangVerdict(const HangInput& hang, StepDiagnosis& d) {
  int64_t lowest = INT64_MAX, highest = -1;
  for (int64_t s : hang.last_step_by_rank) {
    lowest = std::min(lowest, s);
    highest = std::max(highest, s);
  }
  d.lowest_last_step = hang.last_step_by_rank.empty() ? -1 : lowest;
  for (uint32_t r = 0; r < hang.last_step_by_rank.size() && d.hang_suspects.size() < 16; ++r) {
    if (hang.last_step_by_rank[r] == lowest) d.hang_suspects.push_back(r);
  }
  d.whole_job_stalled = lowest == highest;
  d.scope = CulpritScope::kRank;
  d.culprit_ranks = d.whole_job_stalled ? std::vector<uint32_t>{} : d.hang_suspects;
  return {StepLabel::kHang, Severity::kCrit,
          d.whole_job_stalled
              ? fmt::format("no step has aligned for {:.0f} s (timeout {:.0f} s): every "
                            "rank stopped after step {}",
                            hang.seconds_since_last_aligned, d.hang_timeout_seconds, lowest)
              : fmt::format("no step has aligned for {:.0f} s (timeout {:.0f} s): rank(s) "
                            "{} stopped after step {} while others went on to step {}",
                            hang.seconds_since_last_aligned, d.hang_timeout_seconds,
                            RankList(d.hang_suspects), lowest, highest)};
}

// Stages 4 to 6, once a straggler score reached the threshold: the culprit and its scope, the
// cause, the note. Records the culprit.
Verdict StragglerVerdict(const StragglerScores& scores, const WindowSignals& signals,
                         const OwnTimeSignals& own_time, const std::vector<std::string>& rank_nodes,
                         const StepDiagnosisOptions& o, StepDiagnosis& d) {
  const Culprit culprit = ChooseCulprit(scores, signals, own_time);
  CulpritSet set = ScopeOf(culprit, rank_nodes, o);
  const Attribution why = Attribute(culprit, scores, signals, own_time);
  std::string note = StragglerNote(culprit, set, why, signals, own_time);
  d.from_onset_window = culprit.from_onset_window;
  d.cause = why.cause;
  d.scope = set.scope;
  d.culprit_ranks = std::move(set.ranks);
  d.culprit_node = std::move(set.node);
  d.culprit_phase = why.phase.phase;
  SetGcRank(signals, culprit.rank, d.gc);
  const StepLabel label = d.cause == StragglerCause::kInput     ? StepLabel::kInputStraggler
                          : d.cause == StragglerCause::kCompute ? StepLabel::kComputeStraggler
                                                                : StepLabel::kStraggler;
  const double score = culprit.signal == CulpritSignal::kOwn
                           ? scores.own.score()
                           : std::max(scores.input_hit ? scores.input.score() : 0,
                                      scores.compute_hit ? scores.compute.score() : 0);
  return {label, AtLeast(score, o.straggler_crit) ? Severity::kCrit : Severity::kWarn,
          std::move(note)};
}

// No own-time, input or compute straggler, but one rank pauses in garbage collection more than
// the median rank by at least the straggler threshold of the typical step's burden: a GC pause is
// the rank's own work by definition, never waiting, so its excess is a floor under the rank's own
// time excess even where the blocked model misses it (a pause at the end of a step, while the
// others' wait falls in their next step where no collective timer sees it).
std::optional<Verdict> GcVerdict(const StragglerScores& scores, const WindowSignals& s,
                                 const std::vector<std::string>& rank_nodes,
                                 const StepDiagnosisOptions& o, StepDiagnosis& d) {
  const SignalEvidence& gc = s.gc_evidence;
  if (!gc.stat.present || gc.stat.ranks < 2 || scores.burden <= 0) return std::nullopt;
  const double excess = gc.stat.worst_seconds - gc.stat.median_seconds;
  const double score = excess / scores.burden;
  if (!AtLeast(score, o.straggler_warn)) return std::nullopt;
  const uint32_t rank = gc.stat.worst_rank;
  Culprit culprit;
  culprit.rank = rank;
  culprit.signal = CulpritSignal::kOwn;
  CulpritSet set;
  set.scope = CulpritScope::kRank;
  set.ranks = {rank};
  set.node = rank < rank_nodes.size() ? rank_nodes[rank] : "";
  Attribution why;
  why.cause = StragglerCause::kGc;
  why.parts.gc = excess;
  why.phase = {Phase::kWait, excess, gc.stat.median_seconds};
  OwnTimeSignals none;
  d.cause = StragglerCause::kGc;
  d.scope = CulpritScope::kRank;
  d.culprit_ranks = {rank};
  d.culprit_node = set.node;
  d.culprit_phase = Phase::kWait;
  d.own_score = std::max(d.own_score, score);
  SetGcRank(s, rank, d.gc);
  return Verdict{StepLabel::kStraggler,
                 AtLeast(score, o.straggler_crit) ? Severity::kCrit : Severity::kWarn,
                 StragglerNote(culprit, set, why, s, none)};
}

// No straggler: input-bound, wait-heavy, compute-bound, incomplete data or balanced. The
// "bound" diagnoses need their phases on every rank: a phase that is not reported is unknown,
// not waiting.
Verdict BoundVerdict(const StepWindow& w, const WindowSignals& s, const StepDiagnosis& d,
                     const StepDiagnosisOptions& o) {
  const bool dl_known = !s.IsMissing(Phase::kDataloader);
  const bool compute_known = !s.IsMissing(Phase::kForward) && !s.IsMissing(Phase::kBackward) &&
                             !s.IsMissing(Phase::kOptimizer);
  const uint32_t ranks = s.step().ranks;
  if (dl_known && AtLeast(d.input_share, o.input_share_warn) &&
      (ranks == 1 || s.evidence[PhaseIndex(Phase::kDataloader)].stat.skew <= o.bound_max_skew)) {
    return {
        StepLabel::kInputBound,
        AtLeast(d.input_share, o.input_share_crit) ? Severity::kCrit : Severity::kWarn,
        fmt::format("the input pipeline takes {:.0f}% of the typical step", d.input_share * 100)};
  }
  if (dl_known && compute_known && AtLeast(d.wait_share, o.wait_share_warn)) {
    return {StepLabel::kWaitHeavy,
            AtLeast(d.wait_share, o.wait_share_crit) ? Severity::kCrit : Severity::kWarn,
            fmt::format("ranks wait {:.0f}% of the typical step outside input and compute",
                        d.wait_share * 100)};
  }
  if (compute_known && AtLeast(d.compute_share, o.compute_share_warn) &&
      !AtLeast(d.input_share, o.input_share_warn) && !AtLeast(d.wait_share, o.wait_share_warn) &&
      (ranks == 1 || d.compute.stat.skew <= o.bound_max_skew)) {
    return {StepLabel::kComputeBound,
            AtLeast(d.compute_share, o.compute_share_crit) ? Severity::kCrit : Severity::kWarn,
            fmt::format("compute takes {:.0f}% of the typical step", d.compute_share * 100)};
  }
  if (!s.missing.empty()) {
    return {StepLabel::kIncompleteData, Severity::kInfo,
            fmt::format("no straggler over the last {} steps; the rest cannot be diagnosed: "
                        "missing {}",
                        w.size(), MissingText(s.missing))};
  }
  return {StepLabel::kBalanced, Severity::kInfo,
          fmt::format("no straggler, input or wait bottleneck over the last {} steps", w.size())};
}

// Runs the stages in order, recording the evidence of each in `d`; returns the first verdict.
Verdict RunStages(const StepWindow& w, const std::vector<std::string>& rank_nodes,
                  const HangInput& hang, const StepDiagnosisOptions& o, bool sharded,
                  StepDiagnosis& d) {
  if (w.empty()) return {StepLabel::kNoData, Severity::kInfo, "no aligned steps yet"};
  const WindowSignals signals = MeasureWindow(w);
  const OwnTimeSignals own_time = ModelOwnTime(w, signals, o, sharded);
  RecordSignals(signals, own_time, d);
  const PhaseStat& step = signals.step();
  if (w.size() < o.min_steps) {
    return {StepLabel::kNoData, Severity::kInfo,
            fmt::format("{} aligned steps so far; the diagnosis needs {}", w.size(), o.min_steps)};
  }
  if (!step.present || step.median_seconds <= 0) {
    return {StepLabel::kNoData, Severity::kInfo, "no rank reports its step time"};
  }
  d.hang_timeout_seconds = std::max(o.hang_timeout_steps * step.median_seconds,
                                    std::chrono::duration<double>(o.hang_timeout_min).count());
  if (hang.seconds_since_last_aligned > d.hang_timeout_seconds) return HangVerdict(hang, d);

  d.input_share = signals.Median(Phase::kDataloader) / step.median_seconds;
  d.wait_share = signals.Median(Phase::kWait) / step.median_seconds;
  d.compute_share = (signals.Median(Phase::kForward) + signals.Median(Phase::kBackward) +
                     signals.Median(Phase::kOptimizer) + signals.Median(Phase::kForwardBackward)) /
                    step.median_seconds;
  const StragglerScores scores = ScoreStragglers(w, signals, own_time, o);
  d.input_score = scores.input.score();
  d.compute_score = scores.compute.score();
  d.own_score = scores.own.score();
  if (scores.any_hit()) return StragglerVerdict(scores, signals, own_time, rank_nodes, o, d);
  if (std::optional<Verdict> gc = GcVerdict(scores, signals, rank_nodes, o, d)) return *gc;
  return BoundVerdict(w, signals, d, o);
}

}  // namespace
}  // namespace rankwatch::step_time

namespace rankwatch {

std::string_view StepLabelName(StepLabel label) {
  switch (label) {
    case StepLabel::kNoData: return "no_data";
    case StepLabel::kHang: return "hang";
    case StepLabel::kStraggler: return "straggler";
    case StepLabel::kInputStraggler: return "input_straggler";
    case StepLabel::kComputeStraggler: return "compute_straggler";
    case StepLabel::kInputBound: return "input_bound";
    case StepLabel::kWaitHeavy: return "wait_heavy";
    case StepLabel::kComputeBound: return "compute_bound";
    case StepLabel::kBalanced: return "balanced";
    case StepLabel::kIncompleteData: return "incomplete_data";
  }
  return "unknown";
}

std::string_view StragglerCauseName(StragglerCause cause) {
  switch (cause) {
    case StragglerCause::kNone: return "none";
    case StragglerCause::kInput: return "input";
    case StragglerCause::kCompute: return "compute";
    case StragglerCause::kBoth: return "both";
    case StragglerCause::kOutside: return "outside";
    case StragglerCause::kGc: return "gc";
  }
  return "unknown";
}

StepDiagnosis DiagnoseStepTime(const StepWindow& w, const std::vector<std::string>& rank_nodes,
                               const HangInput& hang, const StepDiagnosisOptions& o, bool sharded) {
  StepDiagnosis d;
  d.window_steps = static_cast<uint32_t>(w.size());
  d.seconds_since_last_aligned = hang.seconds_since_last_aligned;
  d.sharded = sharded;
  step_time::Verdict verdict = step_time::RunStages(w, rank_nodes, hang, o, sharded, d);
  d.label = verdict.label;
  d.severity = verdict.severity;
  d.note = std::move(verdict.note);
  d.next_step = std::string(step_time::NextStep(d.label, d.cause));
  return d;
}

}  // namespace rankwatch
