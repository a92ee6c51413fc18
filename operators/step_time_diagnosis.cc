#include "operators/step_time_diagnosis.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <optional>
#include <utility>

#include "operators/step_time/cause.h"
#include "operators/step_time/culprit.h"
#include "operators/step_time/excess_check.h"
#include "operators/step_time/note.h"
#include "operators/step_time/onset.h"
#include "operators/step_time/own_time.h"
#include "operators/step_time/scores.h"
#include "operators/step_time/signals.h"

// DiagnoseStepTime runs the stages of operators/step_time/ in order: signals (signals.h), own
// time and the blocked model (own_time.h), the straggler scores (scores.h) and the statistical
// test of the candidate ranks (excess_check.h); when a score reaches the threshold or a test is
// significant, the culprit and its scope (culprit.h), the cause (cause.h), the note (note.h) and
// the culprit's pattern (excess_check.h); else the "bound" labels. The first label that applies
// ends the diagnosis; every stage that ran leaves its evidence in the StepDiagnosis.

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

// The ranks with the largest values, at most `k`, largest first (NaN and values <= 0 skipped).
std::vector<uint32_t> TopRanks(const RankValues& values, size_t k) {
  std::vector<uint32_t> top;
  for (uint32_t r = 0; r < values.size(); ++r) {
    if (!Known(values[r]) || values[r] <= 0) continue;
    top.push_back(r);
    std::sort(top.begin(), top.end(), [&](uint32_t a, uint32_t b) {
      return values[a] > values[b] || (values[a] == values[b] && a < b);
    });
    if (top.size() > k) top.pop_back();
  }
  return top;
}

// Stage 3b for one signal: its references and the test of its candidates, the best significant
// one (else the one with the largest z). When no candidate can be significant
// (CannotBeSignificant), `best` is not significant and the rest is left empty.
struct SignalTest {
  TestSignal signal = TestSignal::kOwn;
  SignalReference reference;
  ExcessTestResult best;
};

SignalTest TestSignalCandidates(const StepWindow& w, TestSignal signal, const BlockedModel& model,
                                const SignalEvidence& window_evidence,
                                const RankValues& onset_excess, double burden,
                                const StepDiagnosisOptions& o) {
  SignalTest t;
  t.signal = signal;
  if (!window_evidence.stat.present || window_evidence.stat.ranks < 2) return t;
  std::vector<uint32_t> candidates;
  for (const RankExcess& e : window_evidence.top) candidates.push_back(e.rank);
  for (uint32_t r : TopRanks(onset_excess, 3)) {
    if (std::find(candidates.begin(), candidates.end(), r) == candidates.end()) {
      candidates.push_back(r);
    }
  }
  if (candidates.empty()) return t;
  // The noise is measured, and the full test run, only when some candidate could be
  // significant: the rest of the diagnosis reads a signal's test only when it is.
  t.reference = ReferenceValuesOf(w, signal, model);
  const std::vector<ExcessSeries> series = SeriesOf(w, signal, model, t.reference, candidates);
  if (std::all_of(series.begin(), series.end(),
                  [&](const ExcessSeries& s) { return CannotBeSignificant(s, burden, o); })) {
    return t;
  }
  MeasureNoise(w, signal, model, &t.reference);
  if (!t.reference.present) return t;
  for (size_t i = 0; i < candidates.size(); ++i) {
    const uint32_t r = candidates[i];
    const ExcessTestResult x = TestExcess(series[i], t.reference, burden, o, r);
    if (!x.present) continue;
    if (!t.best.present || (x.significant && !t.best.significant) ||
        (x.significant == t.best.significant && x.z > t.best.z)) {
      t.best = x;
    }
  }
  return t;
}

// Stage 3b: the statistical test of each signal, as the share scores of stage 3 define them
// (compute only when its phases are reported alike).
struct StatisticalTests {
  SignalTest input, compute, own;
  bool input_hit() const { return input.best.significant; }
  bool compute_hit() const { return compute.best.significant; }
  bool own_hit() const { return own.best.significant; }
  bool any_hit() const { return input_hit() || compute_hit() || own_hit(); }
};

StatisticalTests TestStatistically(const StepWindow& w, const WindowSignals& s,
                                   const OwnTimeSignals& t, const StragglerScores& x,
                                   const StepDiagnosisOptions& o) {
  StatisticalTests st;
  if (!o.statistical || w.size() < o.min_steps || x.burden <= 0) return st;
  st.input = TestSignalCandidates(w, TestSignal::kInput, t.blocked,
                                  s.evidence[PhaseIndex(Phase::kDataloader)], x.onset.dl_excess,
                                  x.burden, o);
  if (s.ComputeConsistent()) {
    st.compute = TestSignalCandidates(w, TestSignal::kCompute, t.blocked, t.compute_evidence,
                                      x.onset.compute_excess, x.burden, o);
  }
  st.own = TestSignalCandidates(w, TestSignal::kOwn, t.blocked, t.own_evidence, x.onset.own_excess,
                                x.burden, o);
  return st;
}

TestSignal TestSignalOf(CulpritSignal signal) {
  return signal == CulpritSignal::kInput     ? TestSignal::kInput
         : signal == CulpritSignal::kCompute ? TestSignal::kCompute
                                             : TestSignal::kOwn;
}

// Who a straggler verdict names, as the onset hold keys it: its node, or its ranks.
std::string CulpritKey(const StepDiagnosis& d) {
  if (d.scope == CulpritScope::kNode) return "node:" + d.culprit_node;
  std::string key = "rank:";
  for (size_t i = 0; i < d.culprit_ranks.size(); ++i) {
    if (i > 0) key += ',';
    key += std::to_string(d.culprit_ranks[i]);
  }
  return key;
}

// The culprit's evidence (d.straggler): its test on the signal that named it (`reference` when
// stage 3b computed it, else computed here), what it costs (at least `named_excess`, the excess
// that named it, a step), its pattern and since when.
void RecordStragglerTest(const StepWindow& w, const OwnTimeSignals& t, TestSignal signal,
                         double named_excess, uint32_t rank, const SignalReference* reference,
                         double burden, const StepDiagnosisOptions& o, OnsetHold* onset,
                         StepDiagnosis& d) {
  SignalReference own_reference;
  if (reference == nullptr || !reference->present) {
    own_reference = ReferenceOf(w, signal, t.blocked);
    reference = &own_reference;
  }
  StragglerTest& st = d.straggler;
  st.present = true;
  st.rank = rank;
  const ExcessSeries series = SeriesOf(w, signal, t.blocked, *reference, rank);
  const ExcessTestResult test = TestExcess(series, *reference, burden, o, rank);
  st.excess_seconds = test.excess;
  st.noise_seconds = test.noise;
  st.z = test.z;
  st.steps = test.steps;
  const ExcessPattern pattern = DescribeExcess(series, *reference, burden, o);
  st.pattern = pattern.pattern;
  st.since_step = pattern.since_step;
  st.onset_in_window = pattern.onset_in_window;
  if (onset != nullptr && !w.empty()) {
    // The onset an earlier window showed, while the same culprit holds (step_time/onset.h).
    const Onset held = onset->Apply(CulpritKey(d), {pattern.since_step, pattern.onset_in_window},
                                    w.first_step(), w.last_step());
    st.since_step = held.since_step;
    st.onset_in_window = held.known;
  }
  st.period_steps = pattern.period_steps;
  st.stall_seconds = pattern.stall_seconds;
  st.stalls = pattern.stalls;
  st.drift_seconds_per_step = pattern.drift_seconds_per_step;
  // Under synchronisation every rank of the step waits for the culprit; otherwise only the
  // culprit ranks lose their own excess.
  // The excess that costs is the larger of the test's and the one that named the culprit (a
  // share score's window excess, a GC excess): the test leaves a few stalls out.
  const double ranks = t.synchronized
                           ? static_cast<double>(w.last_ranks_present())
                           : static_cast<double>(std::max<size_t>(1, d.culprit_ranks.size()));
  st.lost_rank_seconds_per_step = std::max({0.0, test.excess, named_excess}) * ranks;
}

// Severity by share (the spec's straggler_crit) or by cost (straggler_crit_lost_ranks).
Severity StragglerSeverity(double score, const StepDiagnosis& d, double step_median,
                           const StepDiagnosisOptions& o) {
  const double lost_ranks =
      step_median > 0 ? d.straggler.lost_rank_seconds_per_step / step_median : 0.0;
  return AtLeast(score, o.straggler_crit) || lost_ranks >= o.straggler_crit_lost_ranks
             ? Severity::kCrit
             : Severity::kWarn;
}

// The pattern, since-step and cost of the note.
std::string PatternText(const StepDiagnosis& d, double step_median) {
  const StragglerTest& st = d.straggler;
  if (!st.present) return "";
  std::string out;
  switch (st.pattern) {
    case StragglerPattern::kPeriodic:
      out = fmt::format("; it stalls {:.0f} ms every {:.0f} steps ({} stalls in the last {})",
                        st.stall_seconds * 1e3, st.period_steps, st.stalls, d.window_steps);
      break;
    case StragglerPattern::kIntermittent:
      out = fmt::format("; it stalls {:.0f} ms at irregular steps ({} stalls in the last {})",
                        st.stall_seconds * 1e3, st.stalls, d.window_steps);
      break;
    case StragglerPattern::kDrift:
      out = fmt::format("; its excess grows {:.2f} ms every step", st.drift_seconds_per_step * 1e3);
      break;
    case StragglerPattern::kSteady: break;
  }
  out += st.onset_in_window
             ? fmt::format("; since step {}", st.since_step)
             : fmt::format("; through the whole window (since step {} or earlier)", st.since_step);
  if (step_median > 0 && st.lost_rank_seconds_per_step > 0) {
    out += fmt::format("; the job loses {:.1f} ranks' worth of time to it",
                       st.lost_rank_seconds_per_step / step_median);
  }
  return out;
}

// Stages 5 and 6 for a culprit and its scope: its cause (Attribute), the note, the culprit in
// `d`; returns the straggler label its cause gives.
StepLabel RecordCulprit(const Culprit& culprit, CulpritSet set, const StragglerScores& scores,
                        const WindowSignals& signals, const OwnTimeSignals& own_time,
                        StepDiagnosis& d, std::string* note) {
  const Attribution why = Attribute(culprit, scores, signals, own_time);
  *note = StragglerNote(culprit, set, why, signals, own_time);
  d.cause = why.cause;
  d.scope = set.scope;
  d.culprit_ranks = std::move(set.ranks);
  d.culprit_node = std::move(set.node);
  d.culprit_phase = why.phase.phase;
  SetGcRank(signals, culprit.rank, d.gc);
  return d.cause == StragglerCause::kInput     ? StepLabel::kInputStraggler
         : d.cause == StragglerCause::kCompute ? StepLabel::kComputeStraggler
                                               : StepLabel::kStraggler;
}

// Stages 4 to 6, once a straggler score reached the threshold: the culprit and its scope, the
// cause, the note. Records the culprit.
Verdict StragglerVerdict(const StepWindow& w, const StragglerScores& scores,
                         const WindowSignals& signals, const OwnTimeSignals& own_time,
                         const std::vector<std::string>& rank_nodes, const StepDiagnosisOptions& o,
                         OnsetHold* onset, StepDiagnosis& d) {
  const Culprit culprit = ChooseCulprit(scores, signals, own_time);
  CulpritSet set = ScopeOf(culprit, rank_nodes, o);
  d.from_onset_window = culprit.from_onset_window;
  std::string note;
  const StepLabel label =
      RecordCulprit(culprit, std::move(set), scores, signals, own_time, d, &note);
  const double score = culprit.signal == CulpritSignal::kOwn
                           ? scores.own.score()
                           : std::max(scores.input_hit ? scores.input.score() : 0,
                                      scores.compute_hit ? scores.compute.score() : 0);
  const double named_excess =
      culprit.rank < culprit.excess.size() && Known(culprit.excess[culprit.rank])
          ? culprit.excess[culprit.rank]
          : 0.0;
  RecordStragglerTest(w, own_time, TestSignalOf(culprit.signal), named_excess, culprit.rank,
                      nullptr, scores.burden, o, onset, d);
  const double step_median = signals.step().median_seconds;
  note += PatternText(d, step_median);
  return {label, StragglerSeverity(score, d, step_median, o), std::move(note)};
}

// No share score reached the threshold, but the statistical test found a rank (or node) whose
// excess holds against the noise: the same stages 4 to 6 on the test's culprit.
Verdict StatisticalVerdict(const StepWindow& w, StragglerScores scores, const StatisticalTests& st,
                           const WindowSignals& signals, const OwnTimeSignals& own_time,
                           const std::vector<std::string>& rank_nodes,
                           const StepDiagnosisOptions& o, OnsetHold* onset, StepDiagnosis& d) {
  scores.input_hit = st.input_hit();
  scores.compute_hit = st.compute_hit();
  scores.own_hit = st.own_hit();
  auto share = [&](const SignalTest& t) { return t.best.excess / scores.burden; };
  const SignalTest& named =
      st.input_hit() || st.compute_hit()
          ? (st.compute_hit() && (!st.input_hit() || share(st.compute) >= share(st.input))
                 ? st.compute
                 : st.input)
          : st.own;
  Culprit culprit;
  culprit.signal = named.signal == TestSignal::kInput     ? CulpritSignal::kInput
                   : named.signal == TestSignal::kCompute ? CulpritSignal::kCompute
                                                          : CulpritSignal::kOwn;
  culprit.rank = named.best.rank;
  culprit.burden = scores.burden;
  const SignalEvidence& ev = named.signal == TestSignal::kInput
                                 ? signals.evidence[PhaseIndex(Phase::kDataloader)]
                             : named.signal == TestSignal::kCompute ? own_time.compute_evidence
                                                                    : own_time.own_evidence;
  culprit.excess = named.signal == TestSignal::kInput
                       ? signals.phase[PhaseIndex(Phase::kDataloader)]
                   : named.signal == TestSignal::kCompute ? own_time.compute
                                                          : own_time.own;
  for (double& v : culprit.excess) v -= ev.stat.median_seconds;
  // Scope: the culprit's node when enough of its ranks pass the same test.
  CulpritSet set;
  set.node = culprit.rank < rank_nodes.size() ? rank_nodes[culprit.rank] : "";
  set.ranks = {culprit.rank};
  if (!set.node.empty()) {
    std::vector<uint32_t> node_ranks, hits;
    // At most kReferenceRanks of the node's ranks are tested (a node named for a whole job
    // would otherwise make this O(ranks x steps)); the share of them that pass decides.
    for (uint32_t r = 0; r < rank_nodes.size() && r < w.world_size(); ++r) {
      if (rank_nodes[r] != set.node) continue;
      if (node_ranks.size() == kReferenceRanks) break;
      node_ranks.push_back(r);
      const ExcessTestResult x =
          TestExcess(SeriesOf(w, named.signal, own_time.blocked, named.reference, r),
                     named.reference, scores.burden, o, r);
      if (x.significant) hits.push_back(r);
    }
    if (node_ranks.size() >= 2 && hits.size() >= 2 &&
        hits.size() >= o.node_fraction * node_ranks.size()) {
      set.scope = CulpritScope::kNode;
      set.ranks = std::move(hits);
    }
  }
  d.from_statistical_test = true;
  std::string note;
  const StepLabel label =
      RecordCulprit(culprit, std::move(set), scores, signals, own_time, d, &note);
  RecordStragglerTest(w, own_time, named.signal, named.best.excess, culprit.rank, &named.reference,
                      scores.burden, o, onset, d);
  const double step_median = signals.step().median_seconds;
  note += PatternText(d, step_median);
  return {label, StragglerSeverity(share(named), d, step_median, o), std::move(note)};
}

// No own-time, input or compute straggler, but one rank pauses in garbage collection more than
// the median rank by at least the straggler threshold of the typical step's burden: a GC pause is
// the rank's own work by definition, never waiting, so its excess is a floor under the rank's own
// time excess even where the blocked model misses it (a pause at the end of a step, while the
// others' wait falls in their next step where no collective timer sees it).
std::optional<Verdict> GcVerdict(const StepWindow& w, const StragglerScores& scores,
                                 const WindowSignals& s, const OwnTimeSignals& own_time,
                                 const std::vector<std::string>& rank_nodes,
                                 const StepDiagnosisOptions& o, OnsetHold* onset,
                                 StepDiagnosis& d) {
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
  RecordStragglerTest(w, own_time, TestSignal::kOwn, excess, rank, nullptr, scores.burden, o, onset,
                      d);
  const double step_median = s.step().median_seconds;
  return Verdict{StepLabel::kStraggler, StragglerSeverity(score, d, step_median, o),
                 StragglerNote(culprit, set, why, s, none) + PatternText(d, step_median)};
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
                  OnsetHold* onset, StepDiagnosis& d) {
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
  if (scores.any_hit()) {
    return StragglerVerdict(w, scores, signals, own_time, rank_nodes, o, onset, d);
  }
  if (std::optional<Verdict> gc =
          GcVerdict(w, scores, signals, own_time, rank_nodes, o, onset, d)) {
    return *gc;
  }
  const StatisticalTests tests = TestStatistically(w, signals, own_time, scores, o);
  if (tests.any_hit()) {
    return StatisticalVerdict(w, scores, tests, signals, own_time, rank_nodes, o, onset, d);
  }
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

std::string_view StragglerPatternName(StragglerPattern pattern) {
  switch (pattern) {
    case StragglerPattern::kSteady: return "steady";
    case StragglerPattern::kPeriodic: return "periodic";
    case StragglerPattern::kDrift: return "drift";
    case StragglerPattern::kIntermittent: return "intermittent";
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

std::string_view TimingClockName(TimingClock clock) {
  switch (clock) {
    case TimingClock::kHost: return "host";
    case TimingClock::kDevice: return "device";
    case TimingClock::kMixed: return "mixed";
  }
  return "unknown";
}

TimingEvidence TimingOf(const StepWindow& w) {
  const StepWindow::ClockSteps& c = w.clock_steps();
  TimingEvidence t;
  t.device_steps = c.device;
  t.host_steps = c.host;
  t.device_missing_steps = c.device_missing;
  if (c.device == 0) {
    t.clock = TimingClock::kHost;
  } else if (c.host == c.device_missing) {
    t.clock = TimingClock::kDevice;
  } else {
    t.clock = TimingClock::kMixed;
  }
  return t;
}

void NoteTiming(StepDiagnosis* d) {
  const bool straggler = d->label == StepLabel::kStraggler ||
                         d->label == StepLabel::kInputStraggler ||
                         d->label == StepLabel::kComputeStraggler;
  if (!straggler || d->culprit_ranks.empty()) return;
  switch (d->timing.clock) {
    case TimingClock::kHost: break;
    case TimingClock::kDevice: d->note += " (device time)"; break;
    case TimingClock::kMixed: d->note += " (device and host time)"; break;
  }
}

StepDiagnosis DiagnoseStepTime(const StepWindow& w, const std::vector<std::string>& rank_nodes,
                               const HangInput& hang, const StepDiagnosisOptions& o, bool sharded,
                               step_time::OnsetHold* onset) {
  StepDiagnosis d;
  d.window_steps = static_cast<uint32_t>(w.size());
  d.seconds_since_last_aligned = hang.seconds_since_last_aligned;
  d.sharded = sharded;
  d.timing = TimingOf(w);
  step_time::Verdict verdict = step_time::RunStages(w, rank_nodes, hang, o, sharded, onset, d);
  // A judged window without a straggler: the held onset's episode may have ended (a hang, or
  // too few steps, says nothing about it).
  if (onset != nullptr && !d.straggler.present && verdict.label != StepLabel::kNoData &&
      verdict.label != StepLabel::kHang) {
    onset->Absent();
  }
  d.label = verdict.label;
  d.severity = verdict.severity;
  d.note = std::move(verdict.note);
  d.next_step = std::string(step_time::NextStep(d.label, d.cause));
  NoteTiming(&d);
  return d;
}

}  // namespace rankwatch
