#include "operators/step_time/own_time.h"

#include <algorithm>
#include <cmath>

#include "operators/phase_stats.h"

namespace rankwatch {
namespace step_time {

double LessGc(double phase, double gc) { return phase - std::min(std::max(0.0, gc), phase / 2); }

// ComputeOf and OutsideOf, with internal linkage so that the per-rank loops below inline them
// (NewestSteps runs LocalCompute for every rank of the newest steps: 131,072 calls at 16,384
// ranks).
namespace {

constexpr size_t kOnsetSample = 2048;  // NewestSteps: the sample of ranks a median is taken from

double LocalCompute(const std::array<double, kPhaseCount>& m, uint32_t present,
                    const BlockedModel& model) {
  auto has = [present](Phase p) { return (present & PhaseBit(p)) != 0; };
  auto get = [&](Phase p) { return has(p) ? m[PhaseIndex(p)] : 0.0; };
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

double Outside(const std::array<double, kPhaseCount>& m, uint32_t present, double own,
               double compute) {
  if (!Known(own)) return NAN;
  const double dl =
      (present & PhaseBit(Phase::kDataloader)) ? m[PhaseIndex(Phase::kDataloader)] : 0.0;
  return std::max(0.0, own - dl - (Known(compute) ? compute : 0.0));
}

}  // namespace

double ComputeOf(const std::array<double, kPhaseCount>& v, uint32_t present,
                 const BlockedModel& model) {
  return LocalCompute(v, present, model);
}

double OutsideOf(const std::array<double, kPhaseCount>& v, uint32_t present, double own,
                 double compute) {
  return Outside(v, present, own, compute);
}

double InnerStepSkew(const StepWindow& w) {
  const auto& steps = w.steps();
  const bool trim = steps.size() >= 4;
  std::vector<int64_t> sum(w.world_size(), 0);
  std::vector<uint32_t> count(w.world_size(), 0);
  for (uint32_t r = 0; r < w.world_size(); ++r) {
    sum[r] = w.totals()[r].sum_ns[PhaseIndex(Phase::kStep)];
    count[r] = w.totals()[r].count[PhaseIndex(Phase::kStep)];
  }
  if (trim) {
    for (const StepWindow::Step* edge : {&steps.front(), &steps.back()}) {
      for (const StepWindow::Entry& e : edge->entries) {
        if (!e.Has(Phase::kStep)) continue;
        sum[e.rank] -= e.Get(Phase::kStep);
        --count[e.rank];
      }
    }
  }
  std::vector<double> means;
  double worst = 0;
  for (uint32_t r = 0; r < w.world_size(); ++r) {
    if (count[r] == 0) continue;
    means.push_back(static_cast<double>(sum[r]) / count[r]);
    worst = std::max(worst, means.back());
  }
  if (means.size() < 2) return 0;
  const double median = MedianInPlace(means);
  return median > 0 ? (worst - median) / median : 0;
}

OwnTimeSignals ModelOwnTime(const StepWindow& w, const WindowSignals& s,
                            const StepDiagnosisOptions& o, bool sharded) {
  OwnTimeSignals t;
  const PhaseStat& step = s.step();
  t.synchronized = step.present && step.ranks > 1 && InnerStepSkew(w) <= o.sync_max_step_skew;
  t.blocked = BlockedModelOf(w, t.synchronized, sharded);
  const size_t n = s.present.size();
  t.compute.assign(n, NAN);
  t.own.assign(n, NAN);
  t.outside.assign(n, NAN);
  std::array<double, kPhaseCount> mean{};
  for (size_t r = 0; r < n; ++r) {
    const uint32_t present = s.present[r];
    for (int p = 0; p < kPhaseCount; ++p) mean[p] = (present >> p) & 1 ? s.phase[p][r] : 0.0;
    if (present & kComputeMask) t.compute[r] = LocalCompute(mean, present, t.blocked);
    t.own[r] = OwnTime(mean, present, t.blocked, Known(s.gc[r]) ? s.gc[r] : 0.0);
    t.outside[r] = Outside(mean, present, t.own[r], t.compute[r]);
  }
  t.compute_evidence = EvidenceOf(t.compute);
  t.own_evidence = EvidenceOf(t.own);
  t.outside_evidence = EvidenceOf(t.outside);
  return t;
}

namespace {

// One step's values of the three onset signals, rank by rank (NaN: unknown).
struct OnsetValues {
  double dl = NAN, compute = NAN, own = NAN;
};
OnsetValues OnsetValuesOf(const StepWindow::Entry& e, const BlockedModel& model) {
  std::array<double, kPhaseCount> v{};
  for (int p = 0; p < kPhaseCount; ++p) v[p] = static_cast<double>(e.ns[p]) * 1e-9;
  OnsetValues o;
  if (e.Has(Phase::kDataloader)) o.dl = v[PhaseIndex(Phase::kDataloader)];
  if (e.present & kComputeMask) o.compute = LocalCompute(v, e.present, model);
  o.own = OwnTime(v, e.present, model, static_cast<double>(e.gc_ns) * 1e-9);
  return o;
}

// One step's median rank of `values` (the known ones). Above kOnsetSample ranks, from an evenly
// strided sample of them: its error (~1.25 sigma / sqrt(sample)) is far below the 10 %
// threshold, and 24 exact medians of 16,384 values would take half the evaluation.
double OnsetMedian(const std::vector<double>& values, std::vector<double>* scratch) {
  const size_t n = values.size();
  if (n <= 2 * kOnsetSample) {
    scratch->assign(values.begin(), values.end());
  } else {
    scratch->clear();
    const size_t stride = n / kOnsetSample;
    for (size_t j = stride / 2; j < n; j += stride) scratch->push_back(values[j]);
  }
  return MedianInPlace(*scratch);
}

// One step's medians of the three signals (NaN: no rank knows it), derived once per step and
// model and kept with the step (StepWindow::Step::derived, slot kOnsetSlot).
constexpr size_t kOnsetSlot = 3;
const std::vector<double>& OnsetMedians(const StepWindow::Step& step, const BlockedModel& model,
                                        std::vector<double>* scratch) {
  const std::array<double, 3> key{static_cast<double>(model.kind), model.ratio,
                                  model.least_forward_backward};
  StepWindow::Derived& d = step.derived[kOnsetSlot];
  if (d.valid && d.key == key) return d.values;
  std::vector<double> dl, compute, own;
  for (const StepWindow::Entry& e : step.entries) {
    const OnsetValues v = OnsetValuesOf(e, model);
    if (Known(v.dl)) dl.push_back(v.dl);
    if (Known(v.compute)) compute.push_back(v.compute);
    if (Known(v.own)) own.push_back(v.own);
  }
  d.valid = true;
  d.key = key;
  d.values.assign(3, NAN);
  if (!dl.empty()) d.values[0] = OnsetMedian(dl, scratch);
  if (!compute.empty()) d.values[1] = OnsetMedian(compute, scratch);
  if (!own.empty()) d.values[2] = OnsetMedian(own, scratch);
  return d.values;
}

}  // namespace

OnsetSignals NewestSteps(const StepWindow& w, uint32_t k, const BlockedModel& model) {
  const uint32_t n = w.world_size();
  const auto& steps = w.steps();
  const size_t first = steps.size() > k ? steps.size() - k : 0;
  OnsetSignals s;
  s.dl_excess.assign(n, INFINITY);
  s.compute_excess.assign(n, INFINITY);
  s.own_excess.assign(n, INFINITY);
  std::vector<double> dl_medians, compute_medians, scratch;
  for (size_t i = first; i < steps.size(); ++i) {
    const std::vector<double>& median = OnsetMedians(steps[i], model, &scratch);
    if (Known(median[0])) dl_medians.push_back(median[0]);
    if (Known(median[1])) compute_medians.push_back(median[1]);
    for (const StepWindow::Entry& e : steps[i].entries) {
      const OnsetValues v = OnsetValuesOf(e, model);
      if (Known(v.dl)) s.dl_excess[e.rank] = std::min(s.dl_excess[e.rank], v.dl - median[0]);
      if (Known(v.compute)) {
        s.compute_excess[e.rank] = std::min(s.compute_excess[e.rank], v.compute - median[1]);
      }
      if (Known(v.own)) s.own_excess[e.rank] = std::min(s.own_excess[e.rank], v.own - median[2]);
    }
  }
  for (RankValues* excess : {&s.dl_excess, &s.compute_excess, &s.own_excess}) {
    for (double& x : *excess) x = std::isinf(x) ? NAN : x;
  }
  if (!dl_medians.empty()) s.burden += MedianInPlace(dl_medians);
  if (!compute_medians.empty()) s.burden += MedianInPlace(compute_medians);
  return s;
}

}  // namespace step_time

// The public pieces of stage 2 (step_time_diagnosis.h).

using step_time::Known;
using step_time::LessGc;
using step_time::PhaseBit;
using step_time::PhaseIndex;

double WindowMean(const StepWindow::RankTotals& t, Phase p) {
  const uint32_t n = t.count[PhaseIndex(p)];
  if (n == 0) return NAN;
  return static_cast<double>(t.sum_ns[PhaseIndex(p)]) /
         std::max(n, t.count[PhaseIndex(Phase::kStep)]) * 1e-9;
}

double WindowGcMean(const StepWindow::RankTotals& t) {
  if (t.gc_steps == 0) return NAN;
  return static_cast<double>(t.gc_sum_ns) /
         std::max(t.gc_steps, t.count[PhaseIndex(Phase::kStep)]) * 1e-9;
}

double WindowGcCollections(const StepWindow::RankTotals& t) {
  if (t.gc_steps == 0) return NAN;
  return static_cast<double>(t.gc_collections) /
         std::max(t.gc_steps, t.count[PhaseIndex(Phase::kStep)]);
}

BlockedModel BlockedModelOf(const StepWindow& w, bool synchronized, bool sharded) {
  BlockedModel m;
  if (!synchronized) return m;  // kNone
  double least_ratio = INFINITY, least_fb = INFINITY, least_b = INFINITY;
  bool collective = false, forward = false;
  // GC pauses are never waiting: each calibration takes the rank's GC time out of the phase that
  // absorbs the waiting (docs/diagnoses.md, "GC pauses"), as OwnTime does.
  for (const StepWindow::RankTotals& t : w.totals()) {
    if (t.count[PhaseIndex(Phase::kCollective)] > 0) collective = true;
    const double f = WindowMean(t, Phase::kForward), b = WindowMean(t, Phase::kBackward);
    const double fb = WindowMean(t, Phase::kForwardBackward);
    const double gc = Known(WindowGcMean(t)) ? WindowGcMean(t) : 0.0;
    if (Known(f) && f > 0) forward = true;
    if (Known(f) && Known(b) && f > 0) least_ratio = std::min(least_ratio, LessGc(b, gc) / f);
    if (Known(f) || Known(b) || Known(fb)) {
      const double sum = (Known(f) ? f : 0) + (Known(b) ? b : 0) + (Known(fb) ? fb : 0);
      least_fb = std::min(least_fb, LessGc(sum, gc));
    }
    if (Known(b) || Known(fb)) {
      least_b = std::min(least_b, LessGc((Known(b) ? b : 0) + (Known(fb) ? fb : 0), gc));
    }
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
  uint32_t ranks = 0;
  for (const StepWindow::RankTotals& t : w.totals()) ranks += t.count[PhaseIndex(Phase::kStep)] > 0;
  const bool synchronized = ranks >= 2 && step_time::InnerStepSkew(w) <= o.sync_max_step_skew;
  return BlockedModelOf(w, synchronized, sharded);
}

double OwnTime(const std::array<double, kPhaseCount>& v, uint32_t present,
               const BlockedModel& model, double gc) {
  auto has = [present](Phase p) { return (present & PhaseBit(p)) != 0; };
  if (!has(Phase::kStep)) return NAN;
  double blocked = 0;
  switch (model.kind) {
    case BlockedModel::Kind::kNone: break;
    case BlockedModel::Kind::kUnknown: return NAN;
    case BlockedModel::Kind::kCollective:
      if (!has(Phase::kCollective)) return NAN;
      blocked = v[PhaseIndex(Phase::kCollective)];
      break;
    case BlockedModel::Kind::kBackward:
      if (!has(Phase::kForward) || !has(Phase::kBackward)) return NAN;
      blocked = std::max(0.0, LessGc(v[PhaseIndex(Phase::kBackward)], gc) -
                                  v[PhaseIndex(Phase::kForward)] * model.ratio);
      break;
    case BlockedModel::Kind::kSharded: {
      double fb = 0;
      for (Phase p : {Phase::kForward, Phase::kBackward, Phase::kForwardBackward}) {
        if (has(p)) fb += v[PhaseIndex(p)];
      }
      blocked = std::max(0.0, LessGc(fb, gc) - model.least_forward_backward);
      break;
    }
    case BlockedModel::Kind::kLeastBackward: {
      if (!has(Phase::kBackward) && !has(Phase::kForwardBackward)) return NAN;
      const double b = (has(Phase::kBackward) ? v[PhaseIndex(Phase::kBackward)] : 0) +
                       (has(Phase::kForwardBackward) ? v[PhaseIndex(Phase::kForwardBackward)] : 0);
      blocked = std::max(0.0, LessGc(b, gc) - model.least_forward_backward);
      break;
    }
  }
  return std::max(0.0, v[PhaseIndex(Phase::kStep)] - blocked);
}

}  // namespace rankwatch
