#include "operators/whatif/whatif.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <deque>
#include <limits>
#include <span>
#include <string>
#include <utility>

#include "operators/whatif/schedule_replay.h"
#include "operators/whatif/step_binding.h"
#include "operators/whatif/step_model.h"

namespace rankwatch::whatif {

using internal::BoundStep;
using internal::StepModel;
using internal::Typical;

namespace {

constexpr size_t kModelCacheSize = 8;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// The decomposition's op groups: a pipeline's sends and receives by direction, every other
// modelled kind on its own.
struct OpGroups {
  std::vector<std::string_view> names;
  std::array<int, kOpKindCount> of_kind{};
};

const OpGroups& Groups() {
  static const OpGroups groups = [] {
    OpGroups g;
    g.of_kind.fill(-1);
    for (int k = 0; k < kOpKindCount; ++k) {
      const auto kind = static_cast<OpKind>(k);
      if (!IsModelled(kind)) continue;
      const std::string_view name = OpGroupName(kind);
      const auto it = std::find(g.names.begin(), g.names.end(), name);
      g.of_kind[k] = static_cast<int>(it - g.names.begin());
      if (it == g.names.end()) g.names.push_back(name);
    }
    return g;
  }();
  return groups;
}

bool Close(const Typical& a, const Typical& b, double tolerance) {
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::abs(a[i] - b[i]) > tolerance * std::max(std::abs(a[i]), std::abs(b[i]))) {
      return false;
    }
  }
  return true;
}

// Doubles mapped to unsigned integers of the same order.
uint64_t OrderKey(double x) {
  const auto u = std::bit_cast<uint64_t>(x);
  return (u >> 63) != 0 ? ~u : u | (uint64_t{1} << 63);
}
double FromOrderKey(uint64_t k) {
  return std::bit_cast<double>((k >> 63) != 0 ? k & ~(uint64_t{1} << 63) : ~k);
}

// The rank-th smallest (from 0) of the union of sorted arrays: the least value with more than
// `rank` values at or below it, found by bisecting the doubles' order.
double Select(std::span<const std::vector<double>* const> arrays, uint64_t rank) {
  uint64_t lo = UINT64_MAX, hi = 0;
  for (const std::vector<double>* a : arrays) {
    if (a->empty()) continue;
    lo = std::min(lo, OrderKey(a->front()));
    hi = std::max(hi, OrderKey(a->back()));
  }
  while (lo < hi) {
    const uint64_t mid = lo + (hi - lo) / 2;
    const double x = FromOrderKey(mid);
    uint64_t at_or_below = 0;
    for (const std::vector<double>* a : arrays) {
      at_or_below += static_cast<uint64_t>(std::upper_bound(a->begin(), a->end(), x) - a->begin());
    }
    if (at_or_below > rank) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  return FromOrderKey(lo);
}

// The median of the union of sorted arrays, as pandas takes it: the mean of the two middle
// values of an even count.
double Median(std::span<const std::vector<double>* const> arrays) {
  uint64_t n = 0;
  for (const std::vector<double>* a : arrays) n += a->size();
  if (n % 2 == 1) return Select(arrays, n / 2);
  return (Select(arrays, n / 2 - 1) + Select(arrays, n / 2)) / 2;
}

// A set of (node, data rank) entries of a step's duration array.
struct Selection {
  enum Type : uint8_t { kDpRank, kStage, kOpGroup, kWorker } type;
  uint32_t a = 0;  // data rank, stage, op group, or worker's stage
  uint32_t b = 0;  // the worker's data rank
};

// Calls fn(begin, end) for the index ranges of `sel` in a node-major duration array.
template <typename Fn>
void ForRanges(const StepModel& m, const Selection& sel, Fn&& fn) {
  const size_t dp = m.layout.dp;
  switch (sel.type) {
    case Selection::kDpRank:
      for (size_t v = 0; v < m.nodes; ++v) fn(v * dp + sel.a, v * dp + sel.a + 1);
      return;
    case Selection::kStage: {
      const internal::StageModel& st = m.stages[sel.a];
      fn(size_t{st.first} * dp, size_t{st.first + st.count} * dp);
      return;
    }
    case Selection::kOpGroup: {
      const auto& of_kind = Groups().of_kind;
      for (size_t v = 0; v < m.nodes; ++v) {
        if (of_kind[static_cast<size_t>(m.kind[v])] == static_cast<int>(sel.a)) {
          fn(v * dp, (v + 1) * dp);
        }
      }
      return;
    }
    case Selection::kWorker: {
      const internal::StageModel& st = m.stages[sel.a];
      for (size_t v = st.first; v < st.first + st.count; ++v)
        fn(v * dp + sel.b, v * dp + sel.b + 1);
      return;
    }
  }
}

struct StepEntry {
  BoundStep bound;
  double actual_us = 0;
  // Re-simulations, cached while the typical durations stay within the tolerance of `typical`.
  bool cached = false;
  Typical typical{};
  std::vector<double> dp_t, stage_t, group_t;            // NaN = not simulated yet
  std::vector<std::pair<uint32_t, double>> worker_t;     // worker -> ideal but that worker
  std::vector<std::pair<uint32_t, double>> stage_rem_t;  // stage -> actual but that stage ideal
  std::vector<uint32_t> rem_workers;                     // M_W's workers of rem_workers_t
  double rem_workers_t = kNaN;

  void ResetCache(const Typical& t, const Layout& layout) {
    cached = true;
    typical = t;
    dp_t.assign(layout.dp, kNaN);
    stage_t.assign(layout.pp, kNaN);
    group_t.assign(Groups().names.size(), kNaN);
    worker_t.clear();
    stage_rem_t.clear();
    rem_workers.clear();
    rem_workers_t = kNaN;
  }
};

template <typename Cache>
auto* Find(Cache& cache, uint32_t key) {
  decltype(&cache.front().second) found = nullptr;
  for (auto& entry : cache) {
    if (entry.first == key) found = &entry.second;
  }
  return found;
}

// The ideal run of each step model of the window: every node at its kind's typical duration,
// one replay per model.
class IdealRuns {
 public:
  struct Ideal {
    const StepModel* model;
    std::vector<double> dur;  // node-major, a duration per (node, data rank)
    double t;                 // the step's time
  };

  IdealRuns(internal::ScheduleReplay* replay, const Typical& typical, uint32_t dp)
      : replay_(replay), typical_(typical), dp_(dp) {}

  const Ideal& Of(const StepModel& m) {
    for (const Ideal& i : ideals_) {
      if (i.model == &m) return i;
    }
    Ideal i{&m, std::vector<double>(size_t{m.nodes} * dp_), 0};
    for (size_t v = 0; v < m.nodes; ++v) {
      std::fill_n(i.dur.begin() + static_cast<std::ptrdiff_t>(v * dp_), dp_,
                  typical_[m.typical[v]]);
    }
    i.t = replay_->Run(m, i.dur.data());
    ideals_.push_back(std::move(i));
    return ideals_.back();
  }

 private:
  internal::ScheduleReplay* replay_;
  const Typical& typical_;
  uint32_t dp_;
  std::deque<Ideal> ideals_;  // references stay valid as it grows
};

// The mean over the window's `n` steps of value_of(step index).
template <typename ValueOf>
double MeanOverSteps(size_t n, ValueOf&& value_of) {
  double sum = 0;
  for (size_t i = 0; i < n; ++i) sum += value_of(i);
  return sum / n;
}

// Orders (key, value) pairs by value, highest first.
struct HighestValueFirst {
  template <typename Pair>
  bool operator()(const Pair& a, const Pair& b) const {
    return a.second > b.second;
  }
};

// The window's totals: measured, actual and ideal mean step time, each stage's compute, S, and
// each step's own.
WindowResult MeasureWindow(const std::deque<StepEntry>& window, const Typical& typical,
                           const Layout& layout, IdealRuns* ideals) {
  WindowResult r;
  const uint32_t dp = layout.dp, pp = layout.pp;
  const size_t n = window.size();
  r.steps = static_cast<uint32_t>(n);
  r.first_step = window.front().bound.step;
  r.last_step = window.back().bound.step;
  r.stage_compute_us.assign(pp, 0.0);
  for (size_t i = 0; i < n; ++i) {
    const StepEntry& e = window[i];
    const double ideal_t = ideals->Of(*e.bound.model).t;
    r.measured_us += e.bound.measured_us;
    r.actual_us += e.actual_us;
    r.ideal_us += ideal_t;
    for (uint32_t s = 0; s < pp; ++s) r.stage_compute_us[s] += e.bound.stage_compute_us[s];
    StepResult sr;
    sr.step = e.bound.step;
    sr.measured_us = e.bound.measured_us;
    sr.actual_us = e.actual_us;
    sr.ideal_us = ideal_t;
    sr.slowdown = ideal_t > 0 ? e.actual_us / ideal_t : 1.0;
    r.per_step.push_back(std::move(sr));
  }
  r.measured_us /= n;
  r.actual_us /= n;
  r.ideal_us /= n;
  for (double& c : r.stage_compute_us) c /= static_cast<double>(n) * dp;
  r.slowdown = r.ideal_us > 0 ? r.actual_us / r.ideal_us : 1.0;
  std::copy_n(typical.begin(), kOpKindCount, r.typical_us.begin());
  return r;
}

// Which op groups the window has.
std::vector<bool> GroupsPresent(const std::deque<StepEntry>& window) {
  const OpGroups& groups = Groups();
  std::vector<bool> present(groups.names.size(), false);
  for (const StepEntry& e : window) {
    for (int k = 0; k < kOpKindCount; ++k) {
      if (e.bound.ops[k] > 0 && groups.of_kind[k] >= 0) present[groups.of_kind[k]] = true;
    }
  }
  return present;
}

// S by data rank, by stage and by op group (the ideal with that part measured), over the
// window; op groups highest first.
void DecomposeWindow(const std::deque<StepEntry>& window, const std::vector<bool>& present,
                     const Layout& layout, WindowResult* r) {
  const OpGroups& groups = Groups();
  const size_t n = window.size();
  Decomposition& dec = r->decomposition;
  dec.by_dp_rank.resize(layout.dp);
  dec.by_stage.resize(layout.pp);
  for (uint32_t d = 0; d < layout.dp; ++d) {
    dec.by_dp_rank[d] = MeanOverSteps(n, [&](size_t i) { return window[i].dp_t[d]; }) / r->ideal_us;
  }
  for (uint32_t s = 0; s < layout.pp; ++s) {
    dec.by_stage[s] =
        MeanOverSteps(n, [&](size_t i) { return window[i].stage_t[s]; }) / r->ideal_us;
  }
  for (uint32_t g = 0; g < groups.names.size(); ++g) {
    if (!present[g]) continue;
    dec.by_op_group.emplace_back(std::string(groups.names[g]), MeanOverSteps(n, [&](size_t i) {
                                                                 return window[i].group_t[g];
                                                               }) / r->ideal_us);
  }
  std::stable_sort(dec.by_op_group.begin(), dec.by_op_group.end(), HighestValueFirst{});
}

// M_W's workers: the top workers by score = min(S by data rank, S by stage), ties the lower
// index first; M_S's stage: the worst (the lowest index on ties).
void PickWorstParts(const Layout& layout, const Options& opt, WindowResult* r) {
  const Decomposition& dec = r->decomposition;
  const uint32_t dp = layout.dp, workers = layout.workers();
  std::vector<std::pair<uint32_t, double>> scores(workers);
  for (uint32_t w = 0; w < workers; ++w) {
    scores[w] = {w, std::min(dec.by_dp_rank[w % dp], dec.by_stage[w / dp])};
  }
  std::stable_sort(scores.begin(), scores.end(), HighestValueFirst{});
  const auto top =
      static_cast<size_t>(std::max(1.0, std::ceil(opt.top_worker_fraction * workers - 1e-9)));
  for (size_t i = 0; i < std::min<size_t>(top, workers); ++i)
    r->m_w_workers.push_back(scores[i].first);
  r->m_s_stage = static_cast<uint32_t>(std::max_element(dec.by_stage.begin(), dec.by_stage.end()) -
                                       dec.by_stage.begin());
}

// S by each of M_W's workers, and M_W, M_S and M_S of the last stage: the share of the loss
// that typical durations on the worst workers, the worst stage or the last stage take back.
void ExplainByWorstParts(const std::deque<StepEntry>& window, const Layout& layout,
                         WindowResult* r) {
  const size_t n = window.size();
  const uint32_t last_stage = layout.pp - 1;
  for (uint32_t w : r->m_w_workers) {
    r->decomposition.by_worker.emplace_back(
        w, MeanOverSteps(n, [&](size_t i) { return *Find(window[i].worker_t, w); }) / r->ideal_us);
  }
  const double lost = r->actual_us - r->ideal_us;
  auto explained = [&](double rem) { return std::abs(lost) > 0 ? (r->actual_us - rem) / lost : 0; };
  r->m_w = explained(MeanOverSteps(n, [&](size_t i) { return window[i].rem_workers_t; }));
  r->m_s = explained(
      MeanOverSteps(n, [&](size_t i) { return *Find(window[i].stage_rem_t, r->m_s_stage); }));
  r->m_s_last = explained(
      MeanOverSteps(n, [&](size_t i) { return *Find(window[i].stage_rem_t, last_stage); }));
}

// Each step's own decomposition, against its own ideal time.
void DecomposeEachStep(const std::deque<StepEntry>& window, const std::vector<bool>& present,
                       WindowResult* r) {
  const OpGroups& groups = Groups();
  for (size_t i = 0; i < window.size(); ++i) {
    const StepEntry& e = window[i];
    Decomposition& pd = r->per_step[i].decomposition;
    const double it = r->per_step[i].ideal_us;
    for (double t : e.dp_t) pd.by_dp_rank.push_back(t / it);
    for (double t : e.stage_t) pd.by_stage.push_back(t / it);
    for (uint32_t g = 0; g < groups.names.size(); ++g) {
      if (present[g]) pd.by_op_group.emplace_back(std::string(groups.names[g]), e.group_t[g] / it);
    }
    std::stable_sort(pd.by_op_group.begin(), pd.by_op_group.end(), HighestValueFirst{});
    for (uint32_t w : r->m_w_workers) {
      pd.by_worker.emplace_back(w, *Find(e.worker_t, w) / it);
    }
  }
}

}  // namespace

struct Analyzer::Impl {
  Options options;
  std::deque<StepEntry> window;
  std::vector<std::shared_ptr<const StepModel>> models;  // most recently used first
  std::vector<internal::WorkerIndex> index;
  internal::BindScratch bind;
  internal::ScheduleReplay replay;
  std::vector<double> buf;

  Typical ComputeTypical() const;
  // Pass 1: re-simulates each step with one data rank, stage or op group measured (the groups
  // in `present`), where its cache does not hold the result for `typical` already.
  void SimulatePartsMeasured(const Typical& typical, const std::vector<bool>& present,
                             const Layout& layout, IdealRuns* ideals);
  // Pass 2: each of M_W's workers measured alone in the ideal step, and the actual step with
  // M_W's workers, then M_S's stage and the last stage, at their ideal durations.
  void SimulateWorstParts(const WindowResult& r, const Layout& layout, IdealRuns* ideals);
  // Replays the schedule with `base` everywhere but `sels`, which take `over`. `buf` keeps `base`
  // between calls, so a run of calls on one base copies it once.
  double RunWith(const StepModel& m, std::span<const Selection> sels, const double* over,
                 const std::vector<double>& base) {
    if (loaded != base.data()) {
      buf = base;
      loaded = base.data();
    }
    for (const Selection& sel : sels) {
      ForRanges(m, sel, [&](size_t b, size_t e) { std::copy(over + b, over + e, buf.data() + b); });
    }
    const double t = replay.Run(m, buf.data());
    for (const Selection& sel : sels) {
      ForRanges(m, sel, [&](size_t b, size_t e) {
        std::copy(base.data() + b, base.data() + e, buf.data() + b);
      });
    }
    return t;
  }
  const double* loaded = nullptr;  // whose values `buf` holds
};

Typical Analyzer::Impl::ComputeTypical() const {
  Typical t{};
  std::array<double, internal::kTypicalCount> sum{};
  std::array<uint64_t, internal::kTypicalCount> count{};
  for (const StepEntry& e : window) {
    for (int k = 0; k < internal::kTypicalCount; ++k) {
      sum[k] += e.bound.mean_sum[k];
      count[k] += e.bound.mean_count[k];
    }
  }
  for (int k = 0; k < kOpKindCount; ++k) {
    if (!IsCommunication(static_cast<OpKind>(k)) && count[k] > 0) t[k] = sum[k] / count[k];
  }
  // A full backward is ideally a typical input-gradient backward and a typical weight-gradient
  // op (not the mean of the full ones: one stage may hold them all, slow or not).
  const auto b = static_cast<size_t>(OpKind::kBackwardCompute);
  const auto w = static_cast<size_t>(OpKind::kBackwardWeightCompute);
  constexpr auto f = static_cast<size_t>(internal::kFullBackwardTypical);
  if (count[b] > 0 && count[w] > 0) {
    t[f] = t[b] + t[w];
  } else if (count[f] > 0) {
    t[f] = sum[f] / count[f];
  }
  std::vector<const std::vector<double>*> arrays;
  for (int k = 0; k < kOpKindCount; ++k) {
    if (!IsCommunication(static_cast<OpKind>(k))) continue;
    arrays.clear();
    for (const StepEntry& e : window) {
      if (!e.bound.sorted[k].empty()) arrays.push_back(&e.bound.sorted[k]);
    }
    if (!arrays.empty()) t[k] = Median(arrays);
  }
  t[internal::kZeroTypical] = 0;
  return t;
}

Analyzer::Analyzer(Layout layout, Options options)
    : layout_(layout), impl_(std::make_unique<Impl>()) {
  layout_.dp = std::max(1u, layout_.dp);
  layout_.pp = std::max(1u, layout_.pp);
  layout_.tp = std::max(1u, layout_.tp);
  layout_.vpp = std::max(1u, layout_.vpp);
  options.window_steps = std::max(1u, options.window_steps);
  impl_->options = options;
}

Analyzer::~Analyzer() = default;

uint32_t Analyzer::steps() const { return static_cast<uint32_t>(impl_->window.size()); }

std::vector<StepCache> Analyzer::ExportCache() const {
  std::vector<StepCache> out;
  out.reserve(impl_->window.size());
  for (const StepEntry& e : impl_->window) {
    StepCache& c = out.emplace_back();
    c.cached = e.cached;
    if (!e.cached) continue;
    c.typical.assign(e.typical.begin(), e.typical.end());
    c.dp_t = e.dp_t;
    c.stage_t = e.stage_t;
    c.group_t = e.group_t;
    c.worker_t = e.worker_t;
    c.stage_rem_t = e.stage_rem_t;
    c.rem_workers = e.rem_workers;
    c.rem_workers_t = e.rem_workers_t;
  }
  return out;
}

absl::Status Analyzer::ImportCache(const std::vector<StepCache>& cache) {
  Impl& im = *impl_;
  if (cache.size() != im.window.size()) {
    return absl::InvalidArgumentError("a cache of " + std::to_string(cache.size()) +
                                      " steps for a window of " + std::to_string(im.window.size()));
  }
  const uint32_t workers = layout_.workers();
  for (const StepCache& c : cache) {
    if (!c.cached) continue;
    bool fits = c.typical.size() == internal::kTypicalCount && c.dp_t.size() == layout_.dp &&
                c.stage_t.size() == layout_.pp && c.group_t.size() == Groups().names.size();
    for (const auto& [w, t] : c.worker_t) fits = fits && w < workers;
    for (const auto& [stage, t] : c.stage_rem_t) fits = fits && stage < layout_.pp;
    for (uint32_t w : c.rem_workers) fits = fits && w < workers;
    if (!fits) return absl::InvalidArgumentError("a cache that does not fit the layout");
  }
  for (size_t i = 0; i < cache.size(); ++i) {
    const StepCache& c = cache[i];
    StepEntry& e = im.window[i];
    e.cached = c.cached;
    if (!c.cached) continue;
    std::copy(c.typical.begin(), c.typical.end(), e.typical.begin());
    e.dp_t = c.dp_t;
    e.stage_t = c.stage_t;
    e.group_t = c.group_t;
    e.worker_t = c.worker_t;
    e.stage_rem_t = c.stage_rem_t;
    e.rem_workers = c.rem_workers;
    e.rem_workers_t = c.rem_workers_t;
  }
  return absl::OkStatus();
}

absl::Status Analyzer::AddStep(StepOps step) {
  const uint32_t workers = layout_.workers();
  const std::string where = "step " + std::to_string(step.step) + ": ";
  if (step.workers.size() != workers) {
    return absl::InvalidArgumentError(where + std::to_string(step.workers.size()) +
                                      " workers, the layout (dp " + std::to_string(layout_.dp) +
                                      " x pp " + std::to_string(layout_.pp) + ") has " +
                                      std::to_string(workers));
  }
  for (uint32_t w = 0; w < workers; ++w) {
    const std::string who =
        "data rank " + std::to_string(w % layout_.dp) + ", stage " + std::to_string(w / layout_.dp);
    if (step.workers[w].empty()) return absl::InvalidArgumentError(where + who + " has no ops");
    for (const Op& op : step.workers[w]) {
      if (static_cast<int>(op.kind) >= kOpKindCount) {
        return absl::InvalidArgumentError(where + who + ": unknown op kind " +
                                          std::to_string(static_cast<int>(op.kind)));
      }
      if (!std::isfinite(op.start_us) || !std::isfinite(op.duration_us) || op.duration_us < 0) {
        return absl::InvalidArgumentError(where + who + ": " + std::string(OpKindName(op.kind)) +
                                          " with start " + std::to_string(op.start_us) +
                                          " and duration " + std::to_string(op.duration_us));
      }
    }
  }
  Impl& im = *impl_;
  im.index.resize(workers);
  for (uint32_t w = 0; w < workers; ++w) im.index[w].Build(step.workers[w]);
  if (absl::Status s = internal::CheckDataRanksAgree(layout_, step, im.index); !s.ok()) return s;
  std::vector<uint32_t> key = internal::StepShape(layout_, step, im.index);
  std::shared_ptr<const StepModel> model;
  size_t found = im.models.size();
  for (size_t i = 0; i < im.models.size(); ++i) {
    if (im.models[i]->key == key) {
      found = i;
      model = im.models[i];
      break;
    }
  }
  if (!model) {
    auto built = internal::BuildStepModel(layout_, step, im.index, std::move(key));
    if (!built.ok()) return built.status();
    model = *std::move(built);
  }
  StepEntry entry;
  if (absl::Status s = internal::BindStep(model, step, im.index, &im.bind, &entry.bound); !s.ok()) {
    return s;
  }
  entry.actual_us = im.replay.Run(*model, entry.bound.measured.data());
  if (found < im.models.size())
    im.models.erase(im.models.begin() + static_cast<std::ptrdiff_t>(found));
  im.models.insert(im.models.begin(), model);
  if (im.models.size() > kModelCacheSize) im.models.pop_back();
  im.window.push_back(std::move(entry));
  while (im.window.size() > im.options.window_steps) im.window.pop_front();
  return absl::OkStatus();
}

void Analyzer::Impl::SimulatePartsMeasured(const Typical& typical, const std::vector<bool>& present,
                                           const Layout& layout, IdealRuns* ideals) {
  const OpGroups& groups = Groups();
  for (StepEntry& e : window) {
    if (!e.cached || !Close(e.typical, typical, options.recompute_tolerance)) {
      e.ResetCache(typical, layout);
    }
    const StepModel& m = *e.bound.model;
    const IdealRuns::Ideal& ideal = ideals->Of(m);
    const double* measured = e.bound.measured.data();
    auto run = [&](Selection sel) {
      return RunWith(m, std::span<const Selection>(&sel, 1), measured, ideal.dur);
    };
    for (uint32_t d = 0; d < layout.dp; ++d) {
      if (std::isnan(e.dp_t[d])) e.dp_t[d] = run({Selection::kDpRank, d});
    }
    for (uint32_t s = 0; s < layout.pp; ++s) {
      if (std::isnan(e.stage_t[s])) e.stage_t[s] = run({Selection::kStage, s});
    }
    for (uint32_t g = 0; g < groups.names.size(); ++g) {
      if (present[g] && std::isnan(e.group_t[g])) e.group_t[g] = run({Selection::kOpGroup, g});
    }
  }
}

void Analyzer::Impl::SimulateWorstParts(const WindowResult& r, const Layout& layout,
                                        IdealRuns* ideals) {
  const uint32_t dp = layout.dp, last_stage = layout.pp - 1;
  std::vector<Selection> worker_sels;
  for (uint32_t w : r.m_w_workers) worker_sels.push_back({Selection::kWorker, w / dp, w % dp});
  for (StepEntry& e : window) {
    const StepModel& m = *e.bound.model;
    const IdealRuns::Ideal& ideal = ideals->Of(m);
    const double* measured = e.bound.measured.data();
    for (const Selection& sel : worker_sels) {
      const uint32_t w = sel.a * dp + sel.b;
      if (Find(e.worker_t, w) == nullptr) {
        e.worker_t.emplace_back(
            w, RunWith(m, std::span<const Selection>(&sel, 1), measured, ideal.dur));
      }
    }
    if (std::isnan(e.rem_workers_t) || e.rem_workers != r.m_w_workers) {
      e.rem_workers = r.m_w_workers;
      e.rem_workers_t = RunWith(m, worker_sels, ideal.dur.data(), e.bound.measured);
    }
    for (uint32_t s : {r.m_s_stage, last_stage}) {
      if (Find(e.stage_rem_t, s) == nullptr) {
        const Selection sel{Selection::kStage, s};
        e.stage_rem_t.emplace_back(
            s, RunWith(m, std::span<const Selection>(&sel, 1), ideal.dur.data(), e.bound.measured));
      }
    }
  }
}

WindowResult Analyzer::Window() {
  Impl& im = *impl_;
  if (im.window.empty()) return {};
  const Typical typical = im.ComputeTypical();
  im.loaded = nullptr;
  IdealRuns ideals(&im.replay, typical, layout_.dp);
  WindowResult r = MeasureWindow(im.window, typical, layout_, &ideals);
  if (r.slowdown < im.options.decompose_min_slowdown) return r;
  const std::vector<bool> present = GroupsPresent(im.window);
  im.SimulatePartsMeasured(typical, present, layout_, &ideals);
  DecomposeWindow(im.window, present, layout_, &r);
  PickWorstParts(layout_, im.options, &r);
  im.SimulateWorstParts(r, layout_, &ideals);
  ExplainByWorstParts(im.window, layout_, &r);
  DecomposeEachStep(im.window, present, &r);
  return r;
}

}  // namespace rankwatch::whatif
