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

// Per-step compute of one rank's phases. `ratio` > 0 selects the synchronised estimate
// forward x (1 + ratio) + optimizer, which leaves out the backward pass that absorbs waiting.
double ComputeOf(const std::array<double, kPhaseCount>& m, uint32_t present, double ratio) {
  auto has = [present](Phase p) { return present & (1u << P(p)); };
  auto get = [&](Phase p) { return has(p) ? m[P(p)] : 0.0; };
  if (ratio > 0 && has(Phase::kForward)) {
    return get(Phase::kForward) * (1 + ratio) + get(Phase::kOptimizer);
  }
  const double c = get(Phase::kForward) + get(Phase::kBackward) + get(Phase::kOptimizer) +
                   get(Phase::kForwardBackward) - get(Phase::kCollective);
  return std::max(0.0, c);
}

constexpr uint32_t kComputeMask = (1u << P(Phase::kForward)) | (1u << P(Phase::kBackward)) |
                                  (1u << P(Phase::kOptimizer)) | (1u << P(Phase::kForwardBackward));

// Per-rank signals over some steps of the window.
struct Signals {
  std::array<RankValues, kPhaseCount> phase;
  RankValues compute;
};

Signals FullWindowSignals(const StepWindow& w, double sync_ratio) {
  const uint32_t n = w.world_size();
  Signals s;
  for (auto& v : s.phase) v.assign(n, NAN);
  s.compute.assign(n, NAN);
  for (uint32_t r = 0; r < n; ++r) {
    const StepWindow::RankTotals& t = w.totals()[r];
    std::array<double, kPhaseCount> mean{};
    uint32_t present = 0;
    for (int p = 0; p < kPhaseCount; ++p) {
      if (t.count[p] == 0) continue;
      mean[p] = static_cast<double>(t.sum_ns[p]) / t.count[p] * 1e-9;
      s.phase[p][r] = mean[p];
      present |= 1u << p;
    }
    if (present & kComputeMask) s.compute[r] = ComputeOf(mean, present, sync_ratio);
  }
  return s;
}

// The newest `k` steps (fast onset): per rank, its consistent excess, the least, over those
// steps, by which its dataloader (compute) time exceeded that step's median rank; and the
// typical burden, the medians over those steps of each step's median rank. A rank that became
// slow exceeds the median in every step. Ranks that merely take turns being slow do not: under
// CPU contention a rank's per-step compute varies by +-50 %, so per-rank medians of 8 steps of
// equal ranks differ by 20 % while no rank is slower in all 8.
struct OnsetSignals {
  RankValues dl_excess, compute_excess;  // NaN where the rank has no value
  double burden = 0;
};

OnsetSignals NewestSteps(const StepWindow& w, uint32_t k, double sync_ratio) {
  const uint32_t n = w.world_size();
  const auto& steps = w.steps();
  const size_t first = steps.size() > k ? steps.size() - k : 0;
  OnsetSignals s;
  s.dl_excess.assign(n, INFINITY);
  s.compute_excess.assign(n, INFINITY);
  // One step's values and their ranks, and a copy to select the median from.
  std::vector<double> dl, comp, scratch;
  std::vector<uint32_t> dl_rank, comp_rank;
  std::vector<double> dl_medians, comp_medians;
  auto excess_of_step = [&scratch](const std::vector<double>& values,
                                   const std::vector<uint32_t>& ranks, RankValues& excess,
                                   std::vector<double>& medians) {
    if (values.empty()) return;
    scratch.assign(values.begin(), values.end());
    const double median = MedianInPlace(scratch);
    medians.push_back(median);
    for (size_t j = 0; j < values.size(); ++j) {
      excess[ranks[j]] = std::min(excess[ranks[j]], values[j] - median);
    }
  };
  for (size_t i = first; i < steps.size(); ++i) {
    dl.clear(), comp.clear(), dl_rank.clear(), comp_rank.clear();
    for (const StepWindow::Entry& e : steps[i].entries) {
      if (e.Has(Phase::kDataloader)) {
        dl.push_back(static_cast<double>(e.Get(Phase::kDataloader)) * 1e-9);
        dl_rank.push_back(e.rank);
      }
      if (e.present & kComputeMask) {
        std::array<double, kPhaseCount> v{};
        for (int p = 0; p < kPhaseCount; ++p) v[p] = static_cast<double>(e.ns[p]) * 1e-9;
        comp.push_back(ComputeOf(v, e.present, sync_ratio));
        comp_rank.push_back(e.rank);
      }
    }
    excess_of_step(dl, dl_rank, s.dl_excess, dl_medians);
    excess_of_step(comp, comp_rank, s.compute_excess, comp_medians);
  }
  for (RankValues* excess : {&s.dl_excess, &s.compute_excess}) {
    for (double& x : *excess) x = std::isinf(x) ? NAN : x;
  }
  if (!dl_medians.empty()) s.burden += MedianInPlace(dl_medians);
  if (!comp_medians.empty()) s.burden += MedianInPlace(comp_medians);
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

std::string_view NextStep(StepLabel label) {
  switch (label) {
    case StepLabel::kNoData: return "wait for more aligned steps";
    case StepLabel::kHang:
      return "dump the stacks of the suspect ranks (py-spy dump) and check their collectives";
    case StepLabel::kStraggler: return "inspect both input and compute unevenness";
    case StepLabel::kInputStraggler: return "inspect the input path on the worst rank";
    case StepLabel::kComputeStraggler: return "inspect the compute path on the worst rank";
    case StepLabel::kInputBound: return "inspect dataloader workers, preprocessing, storage";
    case StepLabel::kWaitHeavy: return "inspect sync points and uneven progress";
    case StepLabel::kComputeBound: return "inspect forward/backward/optimizer cost";
    case StepLabel::kBalanced: return "nothing to do";
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
  }
  return "unknown";
}

StepDiagnosis DiagnoseStepTime(const StepWindow& w, const std::vector<std::string>& rank_nodes,
                               const HangInput& hang, const StepDiagnosisOptions& o) {
  StepDiagnosis d;
  d.window_steps = static_cast<uint32_t>(w.size());
  d.seconds_since_last_aligned = hang.seconds_since_last_aligned;
  auto finish = [&](StepLabel label, Severity severity, std::string note) {
    d.label = label;
    d.severity = severity;
    d.note = std::move(note);
    d.next_step = std::string(NextStep(label));
    return d;
  };
  if (w.empty()) return finish(StepLabel::kNoData, Severity::kInfo, "no aligned steps yet");

  // Phase statistics over the full window, then the synchronisation test.
  Signals full = FullWindowSignals(w, 0);
  for (int p = 0; p < kPhaseCount; ++p) d.phases[p] = Evidence(full.phase[p]);
  const PhaseStat& step = d.phases[P(Phase::kStep)].stat;
  d.collective_reported = d.phases[P(Phase::kCollective)].stat.present;
  d.synchronized = step.present && step.ranks > 1 && step.skew <= o.sync_max_step_skew;

  // Under synchronisation without collective times, backward hides the waiting: estimate
  // compute from forward, calibrated by the backward/forward ratio of the rank with the most
  // forward + optimizer time (the slowest rank absorbs no waiting).
  double sync_ratio = 0;
  const SignalEvidence& fwd = d.phases[P(Phase::kForward)];
  if (d.synchronized && !d.collective_reported && fwd.stat.present &&
      d.phases[P(Phase::kBackward)].stat.present) {
    const uint32_t s = fwd.stat.worst_rank;
    const double f = full.phase[P(Phase::kForward)][s];
    const double b = full.phase[P(Phase::kBackward)][s];
    if (f > 0 && Known(b)) sync_ratio = b / f;
    if (sync_ratio > 0) full = FullWindowSignals(w, sync_ratio);
  }
  d.compute = Evidence(full.compute);

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

  // Straggler scores (beyond: per-rank compute, collective removed; fast onset). The burden
  // is the typical local work: dataloader + compute, so waiting does not dilute the score.
  const SignalEvidence& dl = d.phases[P(Phase::kDataloader)];
  const double burden = median(Phase::kDataloader) + d.compute.stat.median_seconds;
  const OnsetSignals onset = NewestSteps(w, o.onset_steps, sync_ratio);
  const double onset_burden = onset.burden;
  const Excess onset_dl = Largest(onset.dl_excess), onset_compute = Largest(onset.compute_excess);
  // Until the window holds twice the onset steps (or is full), its means are no steadier than
  // the newest steps, so only a consistent excess names a straggler.
  const bool full_counts = w.size() >= std::min<size_t>(2 * size_t{o.onset_steps}, w.capacity());
  const double input_full = full_counts ? Score(dl, burden) : 0;
  const double input_onset = onset_burden > 0 ? onset_dl.seconds / onset_burden : 0;
  const double comp_full = full_counts ? Score(d.compute, burden) : 0;
  const double comp_onset = onset_burden > 0 ? onset_compute.seconds / onset_burden : 0;
  d.input_score = std::max(input_full, input_onset);
  d.compute_score = std::max(comp_full, comp_onset);
  const bool input_hit = d.input_score >= o.straggler_warn;
  const bool compute_hit = d.compute_score >= o.straggler_warn;

  if (input_hit || compute_hit) {
    const bool by_compute = compute_hit && (!input_hit || d.compute_score >= d.input_score);
    const bool onset_won = by_compute ? comp_onset > comp_full : input_onset > input_full;
    d.from_onset_window = onset_won;
    // Each rank's excess over the median rank (seconds per step) in the winning window.
    RankValues excess;
    uint32_t worst = 0;
    if (onset_won) {
      excess = by_compute ? onset.compute_excess : onset.dl_excess;
      worst = (by_compute ? onset_compute : onset_dl).rank;
    } else {
      const SignalEvidence& ev = by_compute ? d.compute : dl;
      excess = by_compute ? full.compute : full.phase[P(Phase::kDataloader)];
      for (double& x : excess) x -= ev.stat.median_seconds;
      worst = ev.stat.worst_rank;
    }
    const double b = onset_won ? onset_burden : burden;
    // Scope: most ranks of the worst rank's node above the threshold -> the node.
    const std::string& node = worst < rank_nodes.size() ? rank_nodes[worst] : "";
    std::vector<uint32_t> node_ranks, node_hits;
    for (uint32_t r = 0; r < excess.size(); ++r) {
      if (node.empty() || r >= rank_nodes.size() || rank_nodes[r] != node) continue;
      node_ranks.push_back(r);
      if (Known(excess[r]) && excess[r] / b >= o.straggler_warn) {
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
    // The phase in which the culprit stands out most, relative to the median rank.
    d.culprit_phase = Phase::kDataloader;
    if (by_compute) {
      double best = -1;
      for (Phase p :
           {Phase::kForward, Phase::kBackward, Phase::kOptimizer, Phase::kForwardBackward}) {
        const double v = full.phase[P(p)][worst];
        const double m = median(p);
        if (!Known(v) || m <= 0) continue;
        if ((v - m) / m > best) {
          best = (v - m) / m;
          d.culprit_phase = p;
        }
      }
    }
    const double m = median(d.culprit_phase);
    const double pct = m > 0 ? (full.phase[P(d.culprit_phase)][worst] - m) / m * 100 : 0;
    const std::string who =
        d.scope == CulpritScope::kNode
            ? fmt::format("node {} (ranks {})", node, RankList(d.culprit_ranks))
            : fmt::format("rank {}{}", worst, node.empty() ? "" : " on " + node);
    const std::string note = fmt::format("{} spends {:.0f}% more time in {} than the median rank",
                                         who, pct, PhaseName(d.culprit_phase));
    StepLabel label = input_hit && compute_hit ? StepLabel::kStraggler
                      : input_hit              ? StepLabel::kInputStraggler
                                               : StepLabel::kComputeStraggler;
    const double score = std::max(input_hit ? d.input_score : 0, compute_hit ? d.compute_score : 0);
    return finish(label, score >= o.straggler_crit ? Severity::kCrit : Severity::kWarn, note);
  }

  const uint32_t ranks = step.ranks;
  if (d.input_share >= o.input_share_warn && (ranks == 1 || dl.stat.skew <= o.bound_max_skew)) {
    return finish(
        StepLabel::kInputBound,
        d.input_share >= o.input_share_crit ? Severity::kCrit : Severity::kWarn,
        fmt::format("the input pipeline takes {:.0f}% of the typical step", d.input_share * 100));
  }
  if (d.wait_share >= o.wait_share_warn) {
    return finish(StepLabel::kWaitHeavy,
                  d.wait_share >= o.wait_share_crit ? Severity::kCrit : Severity::kWarn,
                  fmt::format("ranks wait {:.0f}% of the typical step outside input and compute",
                              d.wait_share * 100));
  }
  if (d.compute_share >= o.compute_share_warn && d.input_share < o.input_share_warn &&
      d.wait_share < o.wait_share_warn && (ranks == 1 || d.compute.stat.skew <= o.bound_max_skew)) {
    return finish(StepLabel::kComputeBound,
                  d.compute_share >= o.compute_share_crit ? Severity::kCrit : Severity::kWarn,
                  fmt::format("compute takes {:.0f}% of the typical step", d.compute_share * 100));
  }
  return finish(
      StepLabel::kBalanced, Severity::kInfo,
      fmt::format("no straggler, input or wait bottleneck over the last {} steps", w.size()));
}

}  // namespace rankwatch
