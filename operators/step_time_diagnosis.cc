#include "operators/step_time_diagnosis.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace rankwatch {
namespace {

constexpr int P(Phase p) { return static_cast<int>(p); }

// One value per rank (seconds per step); NaN where the rank has none.
using RankValues = std::vector<double>;

bool Known(double v) { return !std::isnan(v); }

SignalEvidence Evidence(const RankValues& v) {
  SignalEvidence e;
  std::vector<double> present;
  present.reserve(v.size());
  for (uint32_t r = 0; r < v.size(); ++r) {
    if (!Known(v[r])) continue;
    if (present.empty() || v[r] > e.stat.worst_seconds) {
      e.stat.worst_seconds = v[r];
      e.stat.worst_rank = r;
    }
    present.push_back(v[r]);
  }
  if (present.empty()) return e;
  e.stat.present = true;
  e.stat.ranks = static_cast<uint32_t>(present.size());
  e.stat.median_seconds = e.stat.ranks == 1 ? e.stat.worst_seconds : MedianInPlace(present);
  e.stat.skew = (e.stat.ranks > 1 && e.stat.median_seconds > 0)
                    ? (e.stat.worst_seconds - e.stat.median_seconds) / e.stat.median_seconds
                    : 0.0;
  for (uint32_t r = 0; r < v.size(); ++r) {
    if (!Known(v[r]) || v[r] <= e.stat.median_seconds) continue;
    RankExcess x{r, v[r] - e.stat.median_seconds};
    auto less = [](const RankExcess& a, const RankExcess& b) {
      return a.excess_seconds > b.excess_seconds;
    };
    e.top.insert(std::upper_bound(e.top.begin(), e.top.end(), x, less), x);
    if (e.top.size() > 3) e.top.pop_back();
  }
  return e;
}

double Score(const SignalEvidence& e, double burden) {
  if (!e.stat.present || e.stat.ranks < 2 || burden <= 0) return 0;
  return std::max(0.0, e.stat.worst_seconds - e.stat.median_seconds) / burden;
}

constexpr uint32_t Bit(Phase p) { return 1u << P(p); }
constexpr uint32_t kComputeMask = Bit(Phase::kForward) | Bit(Phase::kBackward) |
                                  Bit(Phase::kOptimizer) | Bit(Phase::kForwardBackward);

// Per-step local compute of one rank: forward + backward + optimizer (+ forward_backward) less
// the part of them the rank spent blocked on other ranks, as the blocked model says.
double ComputeOf(const std::array<double, kPhaseCount>& m, uint32_t present,
                 const BlockedModel& model) {
  auto has = [present](Phase p) { return (present & Bit(p)) != 0; };
  auto get = [&](Phase p) { return has(p) ? m[P(p)] : 0.0; };
  const double sum = get(Phase::kForward) + get(Phase::kBackward) + get(Phase::kOptimizer) +
                     get(Phase::kForwardBackward);
  switch (model.kind) {
    case BlockedModel::Kind::kBackward:
      // Synchronised without collective times: backward absorbs the waiting, so local compute
      // is estimated from forward, calibrated by the backward/forward ratio of the rank that
      // waits least.
      if (has(Phase::kForward)) {
        return get(Phase::kForward) * (1 + model.ratio) + get(Phase::kOptimizer);
      }
      break;
    case BlockedModel::Kind::kSharded: {
      const double fb = sum - get(Phase::kOptimizer);
      return std::max(0.0, std::min(fb, model.least_forward_backward)) + get(Phase::kOptimizer);
    }
    case BlockedModel::Kind::kLeastBackward: {
      const double b = get(Phase::kBackward) + get(Phase::kForwardBackward);
      return std::max(0.0, sum - b + std::min(b, model.least_forward_backward));
    }
    case BlockedModel::Kind::kUnknown:
      // Synchronised, and nothing tells the waiting apart: backward absorbs it, so only forward
      // and optimizer count; unknown when neither is reported.
      if (!has(Phase::kForward) && !has(Phase::kOptimizer)) return NAN;
      return get(Phase::kForward) + get(Phase::kOptimizer);
    default: break;
  }
  return std::max(0.0, sum - get(Phase::kCollective));
}

// Per-rank signals over some steps of the window.
struct Signals {
  std::array<RankValues, kPhaseCount> phase;
  RankValues compute, own, outside;
};

// A rank's outside time: own - dataloader - compute (each 0 when unknown), at least 0.
double OutsideOf(const std::array<double, kPhaseCount>& m, uint32_t present, double own,
                 double compute) {
  if (!Known(own)) return NAN;
  const double dl = (present & Bit(Phase::kDataloader)) ? m[P(Phase::kDataloader)] : 0.0;
  return std::max(0.0, own - dl - (Known(compute) ? compute : 0.0));
}

// Per-rank window means of every phase (NaN where not reported) and the phase bits present.
Signals WindowMeans(const StepWindow& w, std::vector<uint32_t>* present) {
  const uint32_t n = w.world_size();
  Signals s;
  for (auto& v : s.phase) v.assign(n, NAN);
  present->assign(n, 0);
  for (uint32_t r = 0; r < n; ++r) {
    const StepWindow::RankTotals& t = w.totals()[r];
    for (int p = 0; p < kPhaseCount; ++p) {
      const double m = WindowMean(t, static_cast<Phase>(p));
      if (!Known(m)) continue;
      s.phase[p][r] = m;
      (*present)[r] |= 1u << p;
    }
  }
  return s;
}

// Fills each rank's compute, own and outside time from its means, as `model` says.
void DeriveSignals(const std::vector<uint32_t>& present, const BlockedModel& model, Signals* s) {
  const size_t n = present.size();
  s->compute.assign(n, NAN);
  s->own.assign(n, NAN);
  s->outside.assign(n, NAN);
  std::array<double, kPhaseCount> mean{};
  for (size_t r = 0; r < n; ++r) {
    for (int p = 0; p < kPhaseCount; ++p) mean[p] = (present[r] >> p) & 1 ? s->phase[p][r] : 0.0;
    if (present[r] & kComputeMask) s->compute[r] = ComputeOf(mean, present[r], model);
    s->own[r] = OwnTime(mean, present[r], model);
    s->outside[r] = OutsideOf(mean, present[r], s->own[r], s->compute[r]);
  }
}

constexpr size_t kOnsetSample = 2048;

// The newest `k` steps (fast onset): per rank, its consistent excess, the least, over those
// steps, by which its dataloader (compute, own) time exceeded that step's median rank; and the
// typical burden, the medians over those steps of each step's median rank. A rank that became
// slow exceeds the median in every step. Ranks that merely take turns being slow do not: under
// CPU contention a rank's per-step compute varies by +-50 %, so per-rank medians of 8 steps of
// equal ranks differ by 20 % while no rank is slower in all 8.
struct OnsetSignals {
  RankValues dl_excess, compute_excess, own_excess;  // NaN where the rank has no value
  double burden = 0;
};

OnsetSignals NewestSteps(const StepWindow& w, uint32_t k, const BlockedModel& model) {
  const uint32_t n = w.world_size();
  const auto& steps = w.steps();
  const size_t first = steps.size() > k ? steps.size() - k : 0;
  OnsetSignals s;
  s.dl_excess.assign(n, INFINITY);
  s.compute_excess.assign(n, INFINITY);
  s.own_excess.assign(n, INFINITY);
  // One step's values and their ranks, and a copy to select the median from.
  struct Series {
    std::vector<double> values;
    std::vector<uint32_t> ranks;
    std::vector<double> medians;  // one per step
    void Add(double v, uint32_t r) {
      if (Known(v)) values.push_back(v), ranks.push_back(r);
    }
  } dl, comp, own;
  std::vector<double> scratch;
  auto excess_of_step = [&scratch](Series& series, RankValues& excess) {
    if (!series.values.empty()) {
      // One step's median rank. Above kOnsetSample ranks, from an evenly strided sample of
      // them: its error (~1.25 sigma / sqrt(sample)) is far below the 10 % threshold, and 24
      // exact medians of 16,384 values would take half the evaluation.
      const size_t n = series.values.size();
      if (n <= 2 * kOnsetSample) {
        scratch.assign(series.values.begin(), series.values.end());
      } else {
        scratch.clear();
        const size_t stride = n / kOnsetSample;
        for (size_t j = stride / 2; j < n; j += stride) scratch.push_back(series.values[j]);
      }
      const double median = MedianInPlace(scratch);
      series.medians.push_back(median);
      for (size_t j = 0; j < series.values.size(); ++j) {
        excess[series.ranks[j]] = std::min(excess[series.ranks[j]], series.values[j] - median);
      }
    }
    series.values.clear();
    series.ranks.clear();
  };
  for (size_t i = first; i < steps.size(); ++i) {
    for (const StepWindow::Entry& e : steps[i].entries) {
      std::array<double, kPhaseCount> v{};
      for (int p = 0; p < kPhaseCount; ++p) v[p] = static_cast<double>(e.ns[p]) * 1e-9;
      if (e.Has(Phase::kDataloader)) dl.Add(v[P(Phase::kDataloader)], e.rank);
      if (e.present & kComputeMask) comp.Add(ComputeOf(v, e.present, model), e.rank);
      own.Add(OwnTime(v, e.present, model), e.rank);
    }
    excess_of_step(dl, s.dl_excess);
    excess_of_step(comp, s.compute_excess);
    excess_of_step(own, s.own_excess);
  }
  for (RankValues* excess : {&s.dl_excess, &s.compute_excess, &s.own_excess}) {
    for (double& x : *excess) x = std::isinf(x) ? NAN : x;
  }
  if (!dl.medians.empty()) s.burden += MedianInPlace(dl.medians);
  if (!comp.medians.empty()) s.burden += MedianInPlace(comp.medians);
  return s;
}

// The rank with the largest excess (seconds per step) and that excess, at least 0.
struct Excess {
  uint32_t rank = 0;
  double seconds = 0;
};
Excess Largest(const RankValues& excess) {
  Excess best;
  for (uint32_t r = 0; r < excess.size(); ++r) {
    if (Known(excess[r]) && excess[r] > best.seconds) best = {r, excess[r]};
  }
  return best;
}

// The phases some ranks of the window do not report, among those the diagnosis needs
// (forward and backward are covered by forward_backward).
std::vector<MissingSignal> MissingSignals(const StepWindow& w) {
  std::vector<uint32_t> ranks;
  for (uint32_t r = 0; r < w.world_size(); ++r) {
    if (w.totals()[r].count[P(Phase::kStep)] > 0) ranks.push_back(r);
  }
  std::vector<MissingSignal> out;
  if (ranks.size() < w.world_size()) {  // ranks silent for the whole window
    MissingSignal m;
    m.phase = Phase::kStep;
    m.ranks = w.world_size();
    m.reporting = static_cast<uint32_t>(ranks.size());
    for (uint32_t r = 0, i = 0; r < w.world_size() && m.missing_ranks.size() < 16; ++r) {
      if (i < ranks.size() && ranks[i] == r) {
        ++i;
      } else {
        m.missing_ranks.push_back(r);
      }
    }
    out.push_back(std::move(m));
  }
  for (Phase p : {Phase::kDataloader, Phase::kForward, Phase::kBackward, Phase::kOptimizer}) {
    MissingSignal m;
    m.phase = p;
    m.ranks = static_cast<uint32_t>(ranks.size());
    for (uint32_t r : ranks) {
      const auto& c = w.totals()[r].count;
      const bool has = c[P(p)] > 0 || ((p == Phase::kForward || p == Phase::kBackward) &&
                                       c[P(Phase::kForwardBackward)] > 0);
      if (has) {
        ++m.reporting;
      } else if (m.missing_ranks.size() < 16) {
        m.missing_ranks.push_back(r);
      }
    }
    if (m.reporting < m.ranks) out.push_back(std::move(m));
  }
  return out;
}

bool IsMissing(const std::vector<MissingSignal>& missing, Phase p) {
  return std::any_of(missing.begin(), missing.end(),
                     [p](const MissingSignal& m) { return m.phase == p; });
}

// Each compute phase is reported by every rank of the window or by none: per-rank compute
// totals are comparable.
bool ComputeConsistent(const std::vector<MissingSignal>& missing) {
  for (const MissingSignal& m : missing) {
    if (m.phase != Phase::kDataloader && m.phase != Phase::kStep && m.reporting > 0) return false;
  }
  return true;
}

std::string MissingText(const std::vector<MissingSignal>& missing) {
  std::string out;
  for (const MissingSignal& m : missing) {
    if (!out.empty()) out += "; ";
    out += fmt::format("{} ({}/{} ranks report it", PhaseName(m.phase), m.reporting, m.ranks);
    if (m.reporting > 0 && !m.missing_ranks.empty()) {
      out += "; not ranks ";
      for (size_t i = 0; i < m.missing_ranks.size(); ++i) {
        out += (i ? "," : "") + std::to_string(m.missing_ranks[i]);
      }
      if (m.ranks - m.reporting > m.missing_ranks.size()) out += ",...";
    }
    out += ")";
  }
  return out;
}

double Ms(double seconds) { return seconds * 1e3; }

// `value` reaches `threshold`, allowing for rounding: 10 ms of a 100 ms step is a share of
// 0.09999999999999999, and it is at the 0.10 threshold.
bool AtLeast(double value, double threshold) { return value >= threshold - 1e-9; }

std::string_view NextStep(StepLabel label, StragglerCause cause) {
  switch (label) {
    case StepLabel::kNoData: return "wait for more aligned steps";
    case StepLabel::kHang:
      return "dump the stacks of the suspect ranks (py-spy dump) and check their collectives";
    case StepLabel::kStraggler:
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

std::string RankList(const std::vector<uint32_t>& ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i == 8) return out + fmt::format(" and {} more", ranks.size() - 8);
    out += (i ? "," : "") + std::to_string(ranks[i]);
  }
  return out;
}

}  // namespace

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
  }
  return "unknown";
}

double WindowMean(const StepWindow::RankTotals& t, Phase p) {
  const uint32_t n = t.count[P(p)];
  if (n == 0) return NAN;
  return static_cast<double>(t.sum_ns[P(p)]) / std::max(n, t.count[P(Phase::kStep)]) * 1e-9;
}

BlockedModel BlockedModelOf(const StepWindow& w, bool synchronized, bool sharded) {
  BlockedModel m;
  if (!synchronized) return m;  // kNone
  double least_ratio = INFINITY, least_fb = INFINITY, least_b = INFINITY;
  bool collective = false, forward = false;
  for (const StepWindow::RankTotals& t : w.totals()) {
    if (t.count[P(Phase::kCollective)] > 0) collective = true;
    const double f = WindowMean(t, Phase::kForward), b = WindowMean(t, Phase::kBackward);
    const double fb = WindowMean(t, Phase::kForwardBackward);
    if (Known(f) && f > 0) forward = true;
    if (Known(f) && Known(b) && f > 0) least_ratio = std::min(least_ratio, b / f);
    if (Known(f) || Known(b) || Known(fb)) {
      least_fb = std::min(least_fb, (Known(f) ? f : 0) + (Known(b) ? b : 0) + (Known(fb) ? fb : 0));
    }
    if (Known(b) || Known(fb))
      least_b = std::min(least_b, (Known(b) ? b : 0) + (Known(fb) ? fb : 0));
  }
  if (collective) {
    m.kind = BlockedModel::Kind::kCollective;
  } else if (sharded && std::isfinite(least_fb)) {
    m.kind = BlockedModel::Kind::kSharded;
    m.least_forward_backward = least_fb;
  } else if (!sharded && std::isfinite(least_ratio) && least_ratio > 0) {
    m.kind = BlockedModel::Kind::kBackward;
    m.ratio = least_ratio;
  } else if (!sharded && !forward && std::isfinite(least_b)) {
    // No forward to calibrate with: under synchronisation every rank's backward ends with the
    // allreduce, so a longer backward is waiting (the reference tool's assumption too).
    m.kind = BlockedModel::Kind::kLeastBackward;
    m.least_forward_backward = least_b;
  } else {
    m.kind = BlockedModel::Kind::kUnknown;
  }
  return m;
}

BlockedModel BlockedModelOf(const StepWindow& w, const StepDiagnosisOptions& o, bool sharded) {
  std::vector<double> steps;
  steps.reserve(w.world_size());
  double worst = 0;
  for (const StepWindow::RankTotals& t : w.totals()) {
    const double m = WindowMean(t, Phase::kStep);
    if (!Known(m)) continue;
    steps.push_back(m);
    worst = std::max(worst, m);
  }
  if (steps.size() < 2) return BlockedModelOf(w, false, sharded);
  const double median = MedianInPlace(steps);
  const bool synchronized = median > 0 && (worst - median) / median <= o.sync_max_step_skew;
  return BlockedModelOf(w, synchronized, sharded);
}

double OwnTime(const std::array<double, kPhaseCount>& v, uint32_t present,
               const BlockedModel& model) {
  auto has = [present](Phase p) { return (present & Bit(p)) != 0; };
  if (!has(Phase::kStep)) return NAN;
  double blocked = 0;
  switch (model.kind) {
    case BlockedModel::Kind::kNone: break;
    case BlockedModel::Kind::kUnknown: return NAN;
    case BlockedModel::Kind::kCollective:
      if (!has(Phase::kCollective)) return NAN;
      blocked = v[P(Phase::kCollective)];
      break;
    case BlockedModel::Kind::kBackward:
      if (!has(Phase::kForward) || !has(Phase::kBackward)) return NAN;
      blocked = std::max(0.0, v[P(Phase::kBackward)] - v[P(Phase::kForward)] * model.ratio);
      break;
    case BlockedModel::Kind::kSharded: {
      double fb = 0;
      for (Phase p : {Phase::kForward, Phase::kBackward, Phase::kForwardBackward}) {
        if (has(p)) fb += v[P(p)];
      }
      blocked = std::max(0.0, fb - model.least_forward_backward);
      break;
    }
    case BlockedModel::Kind::kLeastBackward: {
      if (!has(Phase::kBackward) && !has(Phase::kForwardBackward)) return NAN;
      const double b = (has(Phase::kBackward) ? v[P(Phase::kBackward)] : 0) +
                       (has(Phase::kForwardBackward) ? v[P(Phase::kForwardBackward)] : 0);
      blocked = std::max(0.0, b - model.least_forward_backward);
      break;
    }
  }
  return std::max(0.0, v[P(Phase::kStep)] - blocked);
}

StepDiagnosis DiagnoseStepTime(const StepWindow& w, const std::vector<std::string>& rank_nodes,
                               const HangInput& hang, const StepDiagnosisOptions& o, bool sharded) {
  StepDiagnosis d;
  d.window_steps = static_cast<uint32_t>(w.size());
  d.seconds_since_last_aligned = hang.seconds_since_last_aligned;
  d.sharded = sharded;
  auto finish = [&](StepLabel label, Severity severity, std::string note) {
    d.label = label;
    d.severity = severity;
    d.note = std::move(note);
    d.next_step = std::string(NextStep(label, d.cause));
    return d;
  };
  if (w.empty()) return finish(StepLabel::kNoData, Severity::kInfo, "no aligned steps yet");

  // Phase statistics over the full window, then the synchronisation test and how each rank's
  // blocked time is known.
  std::vector<uint32_t> present;
  Signals full = WindowMeans(w, &present);
  for (int p = 0; p < kPhaseCount; ++p) d.phases[p] = Evidence(full.phase[p]);
  const PhaseStat& step = d.phases[P(Phase::kStep)].stat;
  d.collective_reported = d.phases[P(Phase::kCollective)].stat.present;
  d.synchronized = step.present && step.ranks > 1 && step.skew <= o.sync_max_step_skew;
  d.blocked = BlockedModelOf(w, d.synchronized, sharded);
  DeriveSignals(present, d.blocked, &full);
  d.missing = MissingSignals(w);
  const bool compute_consistent = ComputeConsistent(d.missing);
  d.compute = Evidence(full.compute);
  d.own = Evidence(full.own);
  d.outside = Evidence(full.outside);

  if (w.size() < o.min_steps) {
    return finish(
        StepLabel::kNoData, Severity::kInfo,
        fmt::format("{} aligned steps so far; the diagnosis needs {}", w.size(), o.min_steps));
  }
  if (!step.present || step.median_seconds <= 0) {
    return finish(StepLabel::kNoData, Severity::kInfo, "no rank reports its step time");
  }

  // Hang (beyond).
  d.hang_timeout_seconds = std::max(o.hang_timeout_steps * step.median_seconds,
                                    std::chrono::duration<double>(o.hang_timeout_min).count());
  if (hang.seconds_since_last_aligned > d.hang_timeout_seconds) {
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
    return finish(StepLabel::kHang, Severity::kCrit,
                  d.whole_job_stalled
                      ? fmt::format("no step has aligned for {:.0f} s (timeout {:.0f} s): every "
                                    "rank stopped after step {}",
                                    hang.seconds_since_last_aligned, d.hang_timeout_seconds, lowest)
                      : fmt::format("no step has aligned for {:.0f} s (timeout {:.0f} s): rank(s) "
                                    "{} stopped after step {} while others went on to step {}",
                                    hang.seconds_since_last_aligned, d.hang_timeout_seconds,
                                    RankList(d.hang_suspects), lowest, highest));
  }

  const auto median = [&](Phase p) {
    return d.phases[P(p)].stat.present ? d.phases[P(p)].stat.median_seconds : 0.0;
  };
  const double step_median = step.median_seconds;
  d.input_share = median(Phase::kDataloader) / step_median;
  d.wait_share = median(Phase::kWait) / step_median;
  d.compute_share = (median(Phase::kForward) + median(Phase::kBackward) +
                     median(Phase::kOptimizer) + median(Phase::kForwardBackward)) /
                    step_median;

  // Straggler scores (beyond: per-rank compute, blocked time removed; own time; fast onset).
  // The burden is the typical local work: dataloader + compute, so waiting does not dilute the
  // score; the step time when no compute phase is reported.
  const SignalEvidence& dl = d.phases[P(Phase::kDataloader)];
  const double burden = d.compute.stat.present
                            ? median(Phase::kDataloader) + d.compute.stat.median_seconds
                            : step_median;
  const OnsetSignals onset = NewestSteps(w, o.onset_steps, d.blocked);
  const double onset_burden = d.compute.stat.present ? onset.burden : step_median;
  // Until the window holds twice the onset steps (or is full), its means are no steadier than
  // the newest steps, so only a consistent excess names a straggler.
  const bool full_counts = w.size() >= std::min<size_t>(2 * size_t{o.onset_steps}, w.capacity());
  struct Signal {
    double full = 0, onset = 0;
    double score() const { return std::max(full, onset); }
  };
  Signal input, compute, own;
  const Excess onset_dl = Largest(onset.dl_excess), onset_compute = Largest(onset.compute_excess),
               onset_own = Largest(onset.own_excess);
  input.full = full_counts ? Score(dl, burden) : 0;
  input.onset = onset_burden > 0 ? onset_dl.seconds / onset_burden : 0;
  if (compute_consistent) {
    compute.full = full_counts ? Score(d.compute, burden) : 0;
    compute.onset = onset_burden > 0 ? onset_compute.seconds / onset_burden : 0;
  }
  own.full = full_counts ? Score(d.own, burden) : 0;
  own.onset = onset_burden > 0 ? onset_own.seconds / onset_burden : 0;
  d.input_score = input.score();
  d.compute_score = compute.score();
  d.own_score = own.score();
  const bool input_hit = AtLeast(d.input_score, o.straggler_warn);
  const bool compute_hit = AtLeast(d.compute_score, o.straggler_warn);
  const bool own_hit = AtLeast(d.own_score, o.straggler_warn);

  if (input_hit || compute_hit || own_hit) {
    // The signal that names the culprit: input or compute when either holds the excess, else
    // own time (the excess sits outside the phases, or in a part too small to score alone).
    enum {
      kByInput,
      kByCompute,
      kByOwn
    } by = (input_hit || compute_hit)
               ? (compute_hit && (!input_hit || d.compute_score >= d.input_score) ? kByCompute
                                                                                  : kByInput)
               : kByOwn;
    const Signal& sig = by == kByInput ? input : by == kByCompute ? compute : own;
    const bool onset_won = sig.onset > sig.full;
    d.from_onset_window = onset_won;
    // Each rank's excess over the median rank (seconds per step) in the winning window.
    RankValues excess;
    uint32_t worst = 0;
    if (onset_won) {
      excess = by == kByInput     ? onset.dl_excess
               : by == kByCompute ? onset.compute_excess
                                  : onset.own_excess;
      worst = (by == kByInput ? onset_dl : by == kByCompute ? onset_compute : onset_own).rank;
    } else {
      const SignalEvidence& ev = by == kByInput ? dl : by == kByCompute ? d.compute : d.own;
      excess = by == kByInput     ? full.phase[P(Phase::kDataloader)]
               : by == kByCompute ? full.compute
                                  : full.own;
      for (double& x : excess) x -= ev.stat.median_seconds;
      worst = ev.stat.worst_rank;
    }
    const double b = onset_won ? onset_burden : burden;
    // Where the culprit's own-time excess sits: dataloader, compute or outside every phase.
    auto excess_of = [&](const RankValues& v, const SignalEvidence& ev) {
      return Known(v[worst]) && ev.stat.present ? v[worst] - ev.stat.median_seconds : 0.0;
    };
    // A part some ranks do not report has no median to compare with: it counts for nothing,
    // and an excess no part holds is unattributed.
    const double dl_x = IsMissing(d.missing, Phase::kDataloader)
                            ? 0.0
                            : excess_of(full.phase[P(Phase::kDataloader)], dl);
    const double compute_x = compute_consistent ? excess_of(full.compute, d.compute) : 0.0;
    const double outside_x = d.missing.empty() ? excess_of(full.outside, d.outside) : 0.0;
    if (by == kByInput) {
      d.cause = compute_hit ? StragglerCause::kBoth : StragglerCause::kInput;
    } else if (by == kByCompute) {
      d.cause = input_hit ? StragglerCause::kBoth : StragglerCause::kCompute;
    } else if (compute_x <= 0 && dl_x <= 0 && outside_x <= 0) {
      d.cause = StragglerCause::kNone;  // e.g. sharded without collective times: unattributed
    } else {
      d.cause = outside_x >= dl_x && outside_x >= compute_x ? StragglerCause::kOutside
                : dl_x >= compute_x                         ? StragglerCause::kInput
                                                            : StragglerCause::kCompute;
    }
    // Scope: most ranks of the worst rank's node above the threshold -> the node.
    const std::string& node = worst < rank_nodes.size() ? rank_nodes[worst] : "";
    std::vector<uint32_t> node_ranks, node_hits;
    for (uint32_t r = 0; r < excess.size(); ++r) {
      if (node.empty() || r >= rank_nodes.size() || rank_nodes[r] != node) continue;
      node_ranks.push_back(r);
      if (Known(excess[r]) && AtLeast(excess[r] / b, o.straggler_warn)) {
        node_hits.push_back(r);
      }
    }
    if (node_ranks.size() >= 2 && node_hits.size() >= 2 &&
        node_hits.size() >= o.node_fraction * node_ranks.size()) {
      d.scope = CulpritScope::kNode;
      d.culprit_ranks = node_hits;
    } else {
      d.scope = CulpritScope::kRank;
      d.culprit_ranks = {worst};
    }
    d.culprit_node = node;
    // The phase in which the culprit stands out most: the largest excess over the median rank,
    // in time per step, of its local phases (backward less the time spent blocked in it).
    d.culprit_phase = Phase::kDataloader;
    const bool has_backward = d.phases[P(Phase::kBackward)].stat.present;
    auto local = [&](Phase p, uint32_t r) {
      double v = full.phase[P(p)][r];
      const bool absorbs_wait =
          p == Phase::kBackward || (p == Phase::kForwardBackward && !has_backward);
      if (absorbs_wait && Known(v) && Known(full.own[r])) {
        v = std::max(0.0, v - (full.phase[P(Phase::kStep)][r] - full.own[r]));  // less blocked
      }
      return v;
    };
    double culprit_excess = dl_x, culprit_median = median(Phase::kDataloader);
    if (d.cause == StragglerCause::kCompute || (by == kByCompute)) {
      double best = -INFINITY;
      std::vector<double> values;
      for (Phase p :
           {Phase::kForward, Phase::kBackward, Phase::kOptimizer, Phase::kForwardBackward}) {
        const double v = local(p, worst);
        if (!Known(v)) continue;
        values.clear();
        for (uint32_t r = 0; r < w.world_size(); ++r) {
          if (const double x = local(p, r); Known(x)) values.push_back(x);
        }
        const double m = MedianInPlace(values);
        if (v - m > best) {
          best = v - m;
          d.culprit_phase = p;
          culprit_excess = v - m;
          culprit_median = m;
        }
      }
    } else if (d.cause == StragglerCause::kOutside || d.cause == StragglerCause::kNone) {
      d.culprit_phase = Phase::kWait;  // the wire says PHASE_OUTSIDE for kOutside
    }
    const std::string who =
        d.scope == CulpritScope::kNode
            ? fmt::format("node {} (ranks {})", node, RankList(d.culprit_ranks))
            : fmt::format("rank {}{}", worst, node.empty() ? "" : " on " + node);
    // How much longer the other ranks wait for the culprit, where that is measured.
    const double waits = d.collective_reported && Known(full.phase[P(Phase::kCollective)][worst])
                             ? median(Phase::kCollective) - full.phase[P(Phase::kCollective)][worst]
                             : NAN;
    const std::string wait_text =
        Known(waits) && waits > 0
            ? fmt::format("; the other ranks wait {:.1f} ms a step longer than it in collectives",
                          Ms(waits))
            : "";
    std::string note;
    if (by == kByOwn && d.cause == StragglerCause::kOutside) {
      note = fmt::format(
          "{} spends {:.1f} ms more per step outside the measured phases (not in dataloader, "
          "forward, backward or optimizer: host code between them, a custom autograd op after "
          "the model's output, or CPU contention){}",
          who, Ms(outside_x), wait_text);
    } else if (by == kByOwn && d.cause == StragglerCause::kNone) {
      note = fmt::format(
          "{}'s own time (step time less time blocked on other ranks) is {:.1f} ms a step above "
          "the median rank's; where the excess sits is unknown ({})",
          who, Ms(excess_of(full.own, d.own)),
          d.blocked.kind == BlockedModel::Kind::kSharded
              ? "the job is sharded and reports no collective times"
              : "missing " + MissingText(d.missing));
    } else if (culprit_median > 0) {
      note = fmt::format(
          "{} spends {:.0f}% more time in {} than the median rank ({:.1f} ms more "
          "per step){}",
          who, culprit_excess / culprit_median * 100, PhaseName(d.culprit_phase),
          Ms(culprit_excess), wait_text);
    } else {
      note = fmt::format(
          "{} spends {:.1f} ms more per step in {} than the median rank, which "
          "spends none{}",
          who, Ms(culprit_excess), PhaseName(d.culprit_phase), wait_text);
    }
    StepLabel label = d.cause == StragglerCause::kInput     ? StepLabel::kInputStraggler
                      : d.cause == StragglerCause::kCompute ? StepLabel::kComputeStraggler
                                                            : StepLabel::kStraggler;
    const double score =
        by == kByOwn ? d.own_score
                     : std::max(input_hit ? d.input_score : 0, compute_hit ? d.compute_score : 0);
    return finish(label, AtLeast(score, o.straggler_crit) ? Severity::kCrit : Severity::kWarn,
                  note);
  }

  // The "bound" diagnoses need their phases on every rank: a phase that is not reported is
  // unknown, not waiting.
  const bool dl_known = !IsMissing(d.missing, Phase::kDataloader);
  const bool compute_known = !IsMissing(d.missing, Phase::kForward) &&
                             !IsMissing(d.missing, Phase::kBackward) &&
                             !IsMissing(d.missing, Phase::kOptimizer);
  const uint32_t ranks = step.ranks;
  if (dl_known && AtLeast(d.input_share, o.input_share_warn) &&
      (ranks == 1 || dl.stat.skew <= o.bound_max_skew)) {
    return finish(
        StepLabel::kInputBound,
        AtLeast(d.input_share, o.input_share_crit) ? Severity::kCrit : Severity::kWarn,
        fmt::format("the input pipeline takes {:.0f}% of the typical step", d.input_share * 100));
  }
  if (dl_known && compute_known && AtLeast(d.wait_share, o.wait_share_warn)) {
    return finish(StepLabel::kWaitHeavy,
                  AtLeast(d.wait_share, o.wait_share_crit) ? Severity::kCrit : Severity::kWarn,
                  fmt::format("ranks wait {:.0f}% of the typical step outside input and compute",
                              d.wait_share * 100));
  }
  if (compute_known && AtLeast(d.compute_share, o.compute_share_warn) &&
      !AtLeast(d.input_share, o.input_share_warn) && !AtLeast(d.wait_share, o.wait_share_warn) &&
      (ranks == 1 || d.compute.stat.skew <= o.bound_max_skew)) {
    return finish(
        StepLabel::kComputeBound,
        AtLeast(d.compute_share, o.compute_share_crit) ? Severity::kCrit : Severity::kWarn,
        fmt::format("compute takes {:.0f}% of the typical step", d.compute_share * 100));
  }
  if (!d.missing.empty()) {
    return finish(StepLabel::kIncompleteData, Severity::kInfo,
                  fmt::format("no straggler over the last {} steps; the rest cannot be diagnosed: "
                              "missing {}",
                              w.size(), MissingText(d.missing)));
  }
  return finish(
      StepLabel::kBalanced, Severity::kInfo,
      fmt::format("no straggler, input or wait bottleneck over the last {} steps", w.size()));
}

}  // namespace rankwatch
