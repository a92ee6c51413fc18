#include "operators/step_time/excess_check.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <utility>

#include "operators/phase_stats.h"
#include "operators/step_time/onset.h"
#include "operators/step_time/own_time.h"

namespace rankwatch::step_time {
namespace {

// Rank `rank`'s entry in `step`, or null. Entries come in rank order from the aligner
// (StepWindow::Step): O(1) for a complete step, O(log ranks) otherwise.
const StepWindow::Entry* EntryOf(const StepWindow::Step& step, uint32_t rank) {
  const auto& e = step.entries;
  if (rank < e.size() && e[rank].rank == rank) return &e[rank];
  auto it = std::lower_bound(e.begin(), e.end(), rank,
                             [](const StepWindow::Entry& a, uint32_t r) { return a.rank < r; });
  return it != e.end() && it->rank == rank ? &*it : nullptr;
}

double Mean(const double* v, size_t n) {
  double sum = 0;
  for (size_t i = 0; i < n; ++i) sum += v[i];
  return n ? sum / static_cast<double>(n) : 0.0;
}

double Variance(const double* v, size_t n) {
  if (n < 2) return 0;
  const double m = Mean(v, n);
  double ss = 0;
  for (size_t i = 0; i < n; ++i) ss += (v[i] - m) * (v[i] - m);
  return ss / static_cast<double>(n - 1);
}

// Long-run variance of a series (the variance of its mean times its length) by batch means:
// about 10 batches when the series is long enough, else its plain variance.
double LongRunVariance(const std::vector<double>& v) {
  const size_t n = v.size();
  const size_t batch = n >= 40 ? n / 10 : (n >= 16 ? 2 : 1);
  if (batch == 1) return Variance(v.data(), n);
  std::vector<double> means;
  for (size_t i = 0; i + batch <= n; i += batch) means.push_back(Mean(v.data() + i, batch));
  if (means.size() < 4) return Variance(v.data(), n);
  return static_cast<double>(batch) * Variance(means.data(), means.size());
}

double MedianOf(std::vector<double> v) { return v.empty() ? 0.0 : MedianInPlace(v); }

// The stall steps of a series: those whose excess rises above both the series' baseline (its
// median) and its local baseline (the median of the 9 steps around it) by the stall threshold. The
// local baseline keeps a drift, whose newest steps all lie far above the series' median, from
// reading as a run of stalls.
std::vector<bool> StallSteps(const ExcessSeries& s, const SignalReference& ref, double burden,
                             const StepDiagnosisOptions& o, double* baseline) {
  *baseline = MedianOf(s.excess);
  const double threshold =
      std::max(o.pattern_stall_sigma * std::sqrt(ref.noise_var), o.pattern_stall_share * burden);
  const size_t n = s.excess.size();
  std::vector<bool> stall(n, false);
  if (threshold <= 0) return stall;
  std::vector<double> around;
  for (size_t i = 0; i < n; ++i) {
    if (s.excess[i] - *baseline < threshold) continue;
    around.assign(s.excess.begin() + static_cast<std::ptrdiff_t>(i >= 4 ? i - 4 : 0),
                  s.excess.begin() + static_cast<std::ptrdiff_t>(std::min(n, i + 5)));
    stall[i] = s.excess[i] - MedianInPlace(around) >= threshold;
  }
  return stall;
}

// The stalls of a series at positions `at`: their median gap and whether they are regular (most
// gaps within 1 step of the median gap, and that gap at least 2 steps).
struct StallTimes {
  double period = 0;
  bool regular = false;
};
StallTimes TimesOf(const ExcessSeries& s, const std::vector<size_t>& at) {
  StallTimes t;
  if (at.size() < 2) return t;
  std::vector<double> gaps;
  for (size_t k = 1; k < at.size(); ++k) {
    gaps.push_back(static_cast<double>(s.steps[at[k]] - s.steps[at[k - 1]]));
  }
  t.period = MedianOf(gaps);
  const auto near = std::count_if(gaps.begin(), gaps.end(),
                                  [&](double g) { return std::abs(g - t.period) <= 1.0; });
  t.regular = t.period >= 2 && 3 * static_cast<size_t>(near) >= 2 * gaps.size();
  return t;
}

std::vector<size_t> Positions(const std::vector<bool>& mask) {
  std::vector<size_t> at;
  for (size_t i = 0; i < mask.size(); ++i) {
    if (mask[i]) at.push_back(i);
  }
  return at;
}

// Whether the stalls are what the rank costs (they stay in its mean) rather than events (left
// out): pattern_min_stalls regular ones, or twice as many irregular ones (a loaded host stalls
// any rank now and then).
bool StallsCount(const ExcessSeries& s, const std::vector<size_t>& at,
                 const StepDiagnosisOptions& o) {
  if (at.size() >= 2 * size_t{o.pattern_min_stalls}) return true;
  return at.size() >= o.pattern_min_stalls && TimesOf(s, at).regular;
}

}  // namespace

double SignalValue(const StepWindow::Entry& e, TestSignal signal, const BlockedModel& model) {
  if (signal == TestSignal::kInput) {
    return e.Has(Phase::kDataloader) ? static_cast<double>(e.Get(Phase::kDataloader)) * 1e-9 : NAN;
  }
  std::array<double, kPhaseCount> v{};
  for (int p = 0; p < kPhaseCount; ++p) v[p] = static_cast<double>(e.ns[p]) * 1e-9;
  if (signal == TestSignal::kCompute) {
    return (e.present & kComputeMask) ? ComputeOf(v, e.present, model) : NAN;
  }
  return OwnTime(v, e.present, model, static_cast<double>(e.gc_ns) * 1e-9);
}

namespace {

// The reference ranks of a world: all of them up to kReferenceRanks, else that many evenly
// strided.
std::vector<uint32_t> ReferenceRanks(uint32_t n) {
  std::vector<uint32_t> ranks;
  if (n <= kReferenceRanks) {
    for (uint32_t r = 0; r < n; ++r) ranks.push_back(r);
  } else {
    const uint32_t stride = n / kReferenceRanks;
    for (uint32_t r = stride / 2; r < n && ranks.size() < kReferenceRanks; r += stride) {
      ranks.push_back(r);
    }
  }
  return ranks;
}

// One step's reference values of `signal`, derived once per step and model and kept with the
// step (StepWindow::Step::derived): [0] the median of the known values (NaN with fewer than 2),
// then each reference rank's value (NaN when missing or unknown).
const std::vector<double>& StepReference(const StepWindow::Step& step, TestSignal signal,
                                         const BlockedModel& model,
                                         const std::vector<uint32_t>& ranks,
                                         std::vector<double>* scratch) {
  const std::array<double, 3> key =
      signal == TestSignal::kInput
          ? std::array<double, 3>{}
          : std::array<double, 3>{static_cast<double>(model.kind), model.ratio,
                                  model.least_forward_backward};
  StepWindow::Derived& d = step.derived[static_cast<size_t>(signal)];
  if (d.valid && d.key == key) return d.values;
  d.valid = true;
  d.key = key;
  d.values.assign(ranks.size() + 1, NAN);
  scratch->clear();
  for (size_t j = 0; j < ranks.size(); ++j) {
    const StepWindow::Entry* e = EntryOf(step, ranks[j]);
    if (e == nullptr) continue;
    const double v = SignalValue(*e, signal, model);
    if (!Known(v)) continue;
    d.values[j + 1] = v;
    scratch->push_back(v);
  }
  if (scratch->size() >= 2) d.values[0] = MedianInPlace(*scratch);
  return d.values;
}

}  // namespace

SignalReference ReferenceValuesOf(const StepWindow& w, TestSignal signal,
                                  const BlockedModel& model) {
  SignalReference ref;
  const std::vector<uint32_t> ranks = ReferenceRanks(w.world_size());
  ref.reference_ranks = static_cast<uint32_t>(ranks.size());
  const auto& steps = w.steps();
  ref.steps.reserve(steps.size());
  ref.value.reserve(steps.size());
  std::vector<double> scratch;
  for (const StepWindow::Step& step : steps) {
    ref.steps.push_back(step.step);
    ref.value.push_back(StepReference(step, signal, model, ranks, &scratch)[0]);
  }
  return ref;
}

SignalReference ReferenceOf(const StepWindow& w, TestSignal signal, const BlockedModel& model) {
  SignalReference ref = ReferenceValuesOf(w, signal, model);
  MeasureNoise(w, signal, model, &ref);
  return ref;
}

void MeasureNoise(const StepWindow& w, TestSignal signal, const BlockedModel& model,
                  SignalReference* out) {
  SignalReference& ref = *out;
  const std::vector<uint32_t> ranks = ReferenceRanks(w.world_size());
  const auto& steps = w.steps();
  // Each step's derived references (kept with the step by ReferenceValuesOf): [0] the median,
  // [1 + j] reference rank j's value.
  std::vector<const double*> derived(steps.size());
  std::vector<double> scratch;
  for (size_t i = 0; i < steps.size(); ++i) {
    derived[i] = StepReference(steps[i], signal, model, ranks, &scratch).data();
  }
  // Each reference rank's excess over the step's reference, step by step (read step by step:
  // each step's values lie together).
  std::vector<std::vector<double>> excess(ranks.size());
  for (std::vector<double>& d : excess) d.reserve(steps.size());
  for (size_t i = 0; i < steps.size(); ++i) {
    const double reference = ref.value[i];
    if (!Known(reference)) continue;
    for (size_t j = 0; j < ranks.size(); ++j) {
      const double v = derived[i][j + 1];
      if (Known(v)) excess[j].push_back(v - reference);
    }
  }
  std::vector<double> vars, lrvs;
  for (const std::vector<double>& d : excess) {
    if (d.size() < 8) continue;
    vars.push_back(Variance(d.data(), d.size()));
    lrvs.push_back(LongRunVariance(d));
  }
  if (vars.size() < 2) return;
  ref.present = true;
  ref.noise_var = MedianOf(vars);
  ref.noise_lrv = MedianOf(lrvs);
}

ExcessSeries SeriesOf(const StepWindow& w, TestSignal signal, const BlockedModel& model,
                      const SignalReference& ref, uint32_t rank) {
  return std::move(SeriesOf(w, signal, model, ref, std::vector<uint32_t>{rank}).front());
}

std::vector<ExcessSeries> SeriesOf(const StepWindow& w, TestSignal signal,
                                   const BlockedModel& model, const SignalReference& ref,
                                   const std::vector<uint32_t>& ranks) {
  const auto& steps = w.steps();
  const size_t n = std::min(steps.size(), ref.value.size());
  std::vector<ExcessSeries> out(ranks.size());
  // A reference rank's values were derived with the step's references (StepReference): its
  // column there, else 0 (the value is derived here).
  const std::vector<uint32_t> reference_ranks = ReferenceRanks(w.world_size());
  std::vector<size_t> column(ranks.size(), 0);
  for (size_t k = 0; k < ranks.size(); ++k) {
    const auto at = std::lower_bound(reference_ranks.begin(), reference_ranks.end(), ranks[k]);
    if (at != reference_ranks.end() && *at == ranks[k]) {
      column[k] = 1 + static_cast<size_t>(at - reference_ranks.begin());
    }
    out[k].steps.reserve(n);
    out[k].excess.reserve(n);
  }
  std::vector<double> scratch;
  for (size_t i = 0; i < n; ++i) {
    const double reference = ref.value[i];
    if (!Known(reference)) continue;
    const double* derived = nullptr;
    for (size_t k = 0; k < ranks.size(); ++k) {
      double v;
      if (column[k] > 0) {
        if (derived == nullptr) {
          derived = StepReference(steps[i], signal, model, reference_ranks, &scratch).data();
        }
        v = derived[column[k]];
      } else {
        const StepWindow::Entry* e = EntryOf(steps[i], ranks[k]);
        if (e == nullptr) continue;
        v = SignalValue(*e, signal, model);
      }
      if (!Known(v)) continue;
      out[k].steps.push_back(steps[i].step);
      out[k].excess.push_back(v - reference);
    }
  }
  return out;
}

ExcessTestResult TestExcess(const ExcessSeries& s, const SignalReference& ref, double burden,
                            const StepDiagnosisOptions& o, uint32_t rank) {
  ExcessTestResult best;
  best.rank = rank;
  const size_t n = s.excess.size();
  if (!ref.present || burden <= 0 || n < std::max<size_t>(8, o.min_steps)) return best;
  double baseline = 0;
  const std::vector<bool> stall = StallSteps(s, ref, burden, o, &baseline);
  // A few stalls are events (a checkpoint, one GC pass), left out of the mean; regular ones, or
  // many, are what the rank costs, and stay in. The noise is never taken from the stalls.
  const bool keep_stalls = StallsCount(s, Positions(stall), o);
  std::vector<double> kept, quiet;
  best.present = true;
  for (size_t len : {size_t{16}, size_t{32}, size_t{64}, n}) {
    if (len > n) continue;
    kept.clear();
    quiet.clear();
    for (size_t i = n - len; i < n; ++i) {
      if (!stall[i]) quiet.push_back(s.excess[i]);
      if (!stall[i] || keep_stalls) kept.push_back(s.excess[i]);
    }
    if (kept.size() < 8 || quiet.size() < 2) continue;
    const double mean = Mean(kept.data(), kept.size());
    const double var =
        std::max({ref.noise_lrv, ref.noise_var, Variance(quiet.data(), quiet.size())});
    const double se = std::sqrt(var / static_cast<double>(kept.size()));
    const double z = se > 0 ? mean / se : (mean > 0 ? INFINITY : 0.0);
    const bool significant = z >= o.straggler_z && mean >= o.straggler_min_excess * burden;
    // The reported length: the significant one with the largest z, else the largest z.
    if ((significant && (!best.significant || z > best.z)) || (!best.significant && z > best.z) ||
        best.steps == 0) {
      best.significant = significant;
      best.excess = mean;
      best.noise = se;
      best.z = z;
      best.steps = static_cast<uint32_t>(len);
    }
  }
  return best;
}

bool CannotBeSignificant(const ExcessSeries& s, double burden, const StepDiagnosisOptions& o) {
  const size_t n = s.excess.size();
  if (burden <= 0 || n < std::max<size_t>(8, o.min_steps)) return true;
  // A stall step lies at least the stall threshold above the series' median, and so above its
  // least value: with a smaller spread there is none, and TestExcess keeps every step.
  const auto [lo, hi] = std::minmax_element(s.excess.begin(), s.excess.end());
  if (!(*hi - *lo < o.pattern_stall_share * burden)) return false;
  for (size_t len : {size_t{16}, size_t{32}, size_t{64}, n}) {
    if (len > n) continue;
    // As TestExcess's Mean over the same steps, in the same order.
    const double mean = Mean(s.excess.data() + (n - len), len);
    if (mean >= o.straggler_min_excess * burden) return false;
  }
  return true;
}

ExcessPattern DescribeExcess(const ExcessSeries& s, const SignalReference& ref, double burden,
                             const StepDiagnosisOptions& o) {
  ExcessPattern p;
  const size_t n = s.excess.size();
  if (n == 0) return p;
  p.since_step = s.steps.front();
  double baseline = 0;
  const std::vector<bool> stall = StallSteps(s, ref, burden, o, &baseline);
  const std::vector<size_t> at = Positions(stall);
  if (StallsCount(s, at, o)) {
    const StallTimes times = TimesOf(s, at);
    std::vector<double> lengths;
    for (size_t i : at) lengths.push_back(s.excess[i] - baseline);
    p.stalls = static_cast<uint32_t>(at.size());
    p.stall_seconds = MedianOf(lengths);
    p.period_steps = times.period;
    p.pattern = times.regular ? StragglerPattern::kPeriodic : StragglerPattern::kIntermittent;
    p.since_step = s.steps[at.front()];
    // The first stall is where the pattern began when the window had room for an earlier one.
    const double room = times.regular ? times.period + 1 : 0.5 * static_cast<double>(n);
    p.onset_in_window = static_cast<double>(s.steps[at.front()] - s.steps.front()) > room;
    return p;
  }
  // Drift or a step change, on the steps without stalls.
  std::vector<double> x, y;
  std::vector<uint64_t> step_of;
  for (size_t i = 0; i < n; ++i) {
    if (stall[i]) continue;
    x.push_back(static_cast<double>(s.steps[i] - s.steps.front()));
    y.push_back(s.excess[i]);
    step_of.push_back(s.steps[i]);
  }
  const size_t m = y.size();
  if (m < 8) return p;
  // The best single step change: two levels, split before index `split`.
  const StepChangeFit fit = FitStepChange(y);
  const double sse_flat = fit.sse_flat, sse_step = fit.sse_step;
  // The best hinge: flat until x[h], then a line (least squares of y on max(0, x - x[h])), so a
  // drift that began inside the window is fitted from its start.
  double sse_hinge = INFINITY, slope = 0, hinge_x = 0;
  for (size_t h = 0; h + 4 <= m; ++h) {
    double sf = 0, sff = 0, sfy = 0;
    for (size_t i = h + 1; i < m; ++i) {
      const double f = x[i] - x[h];
      sf += f, sff += f * f, sfy += f * y[i];
    }
    const double k = static_cast<double>(m), sy = fit.sum;
    const double var_f = sff - sf * sf / k;
    if (var_f <= 0) continue;
    const double b = (sfy - sf * sy / k) / var_f;
    const double e = sse_flat - b * b * var_f;  // residual of the regression on f
    if (e < sse_hinge) sse_hinge = e, slope = b, hinge_x = x[h];
  }
  const double rise = slope * (x.back() - hinge_x);
  const double sigma = std::sqrt(ref.noise_var);
  if (slope > 0 && sse_hinge <= o.pattern_drift_fit * sse_step &&
      rise >= o.straggler_min_excess * burden && rise >= 4 * sigma) {
    p.pattern = StragglerPattern::kDrift;
    p.drift_seconds_per_step = slope;
    p.since_step = s.steps.front() + static_cast<uint64_t>(std::llround(hinge_x));
    p.onset_in_window = hinge_x > 0;
    return p;
  }
  // Steady. Since the step change when one explains most of the variation and lifts the excess
  // from about nothing, else since the window began (or earlier).
  if (fit.lifts()) {
    p.since_step = step_of[fit.split];
    p.onset_in_window = true;
  }
  return p;
}

}  // namespace rankwatch::step_time
