#include "operators/whatif/verdict.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>

namespace rankwatch::whatif {
namespace {

// A stage's model compute: forward, backward and (zero-bubble schedules) the weight-gradient part.
bool IsCompute(OpKind k) {
  return k == OpKind::kForwardCompute || k == OpKind::kBackwardCompute ||
         k == OpKind::kBackwardWeightCompute;
}

// Groups of communication: a slow link or a slow collective rather than slow compute.
bool IsCommunicationGroup(std::string_view group) {
  for (int k = 0; k < kOpKindCount; ++k) {
    const auto kind = static_cast<OpKind>(k);
    if (IsModelled(kind) && OpGroupName(kind) == group) return IsCommunication(kind);
  }
  return false;
}

std::string RankList(const std::vector<uint32_t>& ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size() && i < 8; ++i) {
    if (i) out += ",";
    out += std::to_string(ranks[i]);
  }
  if (ranks.size() > 8) out += fmt::format(",... ({} ranks)", ranks.size());
  return out;
}

size_t ArgMax(const std::vector<double>& v) {
  return static_cast<size_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

// How many entries of `v` explain at least `need` of excess (v - 1 >= need).
size_t CountExplaining(const std::vector<double>& v, double need) {
  return static_cast<size_t>(
      std::count_if(v.begin(), v.end(), [&](double s) { return s - 1 >= need; }));
}

}  // namespace

std::string_view VerdictName(Verdict v) {
  switch (v) {
    case Verdict::kNone: return "none";
    case Verdict::kBalanced: return "balanced";
    case Verdict::kSlowWorker: return "slow_worker";
    case Verdict::kStageImbalance: return "stage_imbalance";
    case Verdict::kSequenceImbalance: return "sequence_imbalance";
    case Verdict::kSlowCommunication: return "slow_communication";
    case Verdict::kGcPauses: return "gc_pauses";
    case Verdict::kUnattributed: return "unattributed";
  }
  return "unknown";
}

OpStats::OpStats(Layout layout, uint32_t window_steps)
    : layout_(layout), window_steps_(std::max<uint32_t>(1, window_steps)) {}

void OpStats::Add(const StepOps& step) {
  Step s;
  s.stage_compute_us.assign(layout_.pp, 0.0);
  s.worker_gc_us.assign(layout_.workers(), 0.0);
  s.worker_compute_us.assign(layout_.workers(), 0.0);
  for (uint32_t w = 0; w < step.workers.size() && w < layout_.workers(); ++w) {
    const uint32_t stage = w / layout_.dp;
    for (const Op& op : step.workers[w]) {
      if (IsCompute(op.kind)) {
        s.stage_compute_us[stage] += op.duration_us / layout_.dp;
        s.worker_compute_us[w] += op.duration_us;
      }
      if (op.kind == OpKind::kGc) s.worker_gc_us[w] += op.duration_us;
    }
  }
  steps_.push_back(std::move(s));
  while (steps_.size() > window_steps_) steps_.pop_front();
}

std::vector<double> OpStats::StageComputeUs() const {
  std::vector<double> out(layout_.pp, 0.0);
  for (const Step& s : steps_) {
    for (uint32_t i = 0; i < layout_.pp; ++i) out[i] += s.stage_compute_us[i];
  }
  for (double& v : out) v /= std::max<size_t>(1, steps_.size());
  return out;
}

std::vector<double> OpStats::WorkerGcUs() const {
  std::vector<double> out(layout_.workers(), 0.0);
  for (const Step& s : steps_) {
    for (uint32_t i = 0; i < out.size(); ++i) out[i] += s.worker_gc_us[i];
  }
  for (double& v : out) v /= std::max<size_t>(1, steps_.size());
  return out;
}

std::vector<double> OpStats::WorkerComputeUs() const {
  std::vector<double> out(layout_.workers(), 0.0);
  for (const Step& s : steps_) {
    for (uint32_t i = 0; i < out.size(); ++i) out[i] += s.worker_compute_us[i];
  }
  for (double& v : out) v /= std::max<size_t>(1, steps_.size());
  return out;
}

bool SameFinding(const WhatIfVerdict& a, const WhatIfVerdict& b) {
  return a.verdict == b.verdict && a.data_rank == b.data_rank && a.stage == b.stage &&
         a.op_group == b.op_group;
}

const WhatIfVerdict& VerdictHold::Update(WhatIfVerdict judged, uint64_t analysed_steps) {
  if (judged.verdict == Verdict::kNone) {  // no what-if now (a new world size, no steps)
    has_held_ = false;
    held_ = std::move(judged);
    candidate_ = WhatIfVerdict{};
    return held_;
  }
  if (!has_held_ || SameFinding(judged, held_)) {
    has_held_ = true;
    held_ = std::move(judged);
    candidate_ = WhatIfVerdict{};
    return held_;
  }
  if (candidate_.verdict == Verdict::kNone || !SameFinding(judged, candidate_)) {
    candidate_since_ = analysed_steps;
  }
  if (analysed_steps >= candidate_since_ + hold_steps_) {
    held_ = std::move(judged);
    candidate_ = WhatIfVerdict{};
    return held_;
  }
  candidate_ = std::move(judged);
  // The held finding stays, with the window as it is now.
  held_.slowdown = candidate_.slowdown;
  held_.lost_rank_seconds = candidate_.lost_rank_seconds;
  return held_;
}

void VerdictHold::Restore(const WhatIfVerdict* held, const WhatIfVerdict& candidate,
                          uint64_t candidate_since) {
  has_held_ = held != nullptr;
  held_ = held != nullptr ? *held : WhatIfVerdict{};
  candidate_ = candidate;
  candidate_since_ = candidate_since;
}

namespace {

// What every rule of JudgeWhatIf reads: the window's result, the job's layout, op statistics and
// options, the verdict held now, and the slowdown's excess over 1.
struct Judging {
  Judging(const WindowResult& result, const Layout& job_layout,
          const std::vector<std::vector<uint32_t>>& ranks_of_workers, const OpStats& op_stats,
          const VerdictOptions& options, const WhatIfVerdict* held_now)
      : r(result),
        layout(job_layout),
        worker_ranks(ranks_of_workers),
        stats(op_stats),
        o(options),
        held(held_now),
        held_kind(held_now != nullptr ? held_now->verdict : Verdict::kNone),
        excess(result.slowdown - 1),
        need(options.explain_share * excess) {}

  const WindowResult& r;
  const Layout& layout;
  const std::vector<std::vector<uint32_t>>& worker_ranks;
  const OpStats& stats;
  const VerdictOptions& o;
  const WhatIfVerdict* held;  // null: none
  Verdict held_kind;          // kNone without a held verdict
  double excess;              // S - 1
  double need;                // the share of S - 1 a group explains to enter a verdict

  // The share of S - 1 a group must explain for `kind` (and, for op groups, `group`): the held
  // verdict's exit threshold keeps it (hysteresis); any other needs the entry one.
  double ShareFor(Verdict kind, std::string_view group = {}) const {
    const bool keeps = kind == held_kind && (group.empty() || group == held->op_group);
    return keeps ? std::min(o.keep_share, o.explain_share) : o.explain_share;
  }
  // The global ranks of `worker` (none when the job did not give them).
  std::vector<uint32_t> RanksOf(uint32_t worker) const {
    return worker < worker_ranks.size() ? worker_ranks[worker] : std::vector<uint32_t>{};
  }
  // The note's opening: the step time against the ideal, S and the time lost a step.
  std::string Head() const {
    const double lost_ms = std::max(0.0, r.actual_us - r.ideal_us) / 1e3;
    return fmt::format(
        "steps take {:.1f} ms where typical op times give {:.1f} ms (S = {:.3f}, "
        "{:.1f} ms a step lost)",
        r.actual_us / 1e3, r.ideal_us / 1e3, r.slowdown, lost_ms);
  }
};

// Where the decompositions by replica and by stage point: the replica and the stage with the
// highest S, and how many replicas and stages explain the entry share.
struct WorstParts {
  size_t dp_top = 0;
  size_t stage_top = 0;
  size_t dp_explaining = 0;
  size_t stage_explaining = 0;
};

// The verdict's numbers every rule shares: S and the rank-seconds lost over the window.
WhatIfVerdict MeasureLoss(const Judging& j) {
  WhatIfVerdict v;
  v.slowdown = j.r.slowdown;
  const uint32_t world =
      std::max<uint32_t>(1, j.layout.workers() * std::max<uint32_t>(1, j.layout.tp));
  v.lost_rank_seconds = std::max(0.0, j.r.actual_us - j.r.ideal_us) * 1e-6 * j.r.steps * world;
  return v;
}

// S below warn_slowdown (below exit_slowdown while a finding is held): balanced.
std::optional<WhatIfVerdict> BalancedVerdict(const Judging& j, const WhatIfVerdict& base) {
  const bool held_finding = j.held_kind != Verdict::kNone && j.held_kind != Verdict::kBalanced;
  const double below =
      held_finding ? std::min(j.o.exit_slowdown, j.o.warn_slowdown) : j.o.warn_slowdown;
  if (!(j.r.slowdown < below)) return std::nullopt;
  WhatIfVerdict v = base;
  v.verdict = Verdict::kBalanced;
  v.note = fmt::format(
      "steps take {:.1f} ms, {:.1f}% above a run where every op took its typical time: "
      "no worker, stage or op type holds the pipeline back",
      j.r.actual_us / 1e3, j.excess * 100);
  return v;
}

// Critical from crit_slowdown on; a held critical verdict stays critical down to
// crit_exit_slowdown.
Severity SeverityOf(const Judging& j) {
  const bool crit = j.r.slowdown >= j.o.crit_slowdown ||
                    (j.held != nullptr && j.held->severity == Severity::kCrit &&
                     j.r.slowdown >= std::min(j.o.crit_exit_slowdown, j.o.crit_slowdown));
  return crit ? Severity::kCrit : Severity::kWarn;
}

// Rule 1. One op group explains S: GC pauses, or a kind of communication.
std::optional<WhatIfVerdict> OpGroupVerdict(const Judging& j, const WhatIfVerdict& base) {
  const Decomposition& d = j.r.decomposition;
  if (d.by_op_group.empty()) return std::nullopt;
  const auto& [group, s] = d.by_op_group.front();
  if (s - 1 >= j.ShareFor(Verdict::kGcPauses, group) * j.excess &&
      group == OpGroupName(OpKind::kGc)) {
    const std::vector<double> gc = j.stats.WorkerGcUs();
    const uint32_t w = gc.empty() ? 0 : static_cast<uint32_t>(ArgMax(gc));
    WhatIfVerdict v = base;
    v.verdict = Verdict::kGcPauses;
    v.op_group = group;
    v.explained = (s - 1) / j.excess;
    v.data_rank = static_cast<int32_t>(w % j.layout.dp);
    v.stage = static_cast<int32_t>(w / j.layout.dp);
    v.ranks = j.RanksOf(w);
    v.note = fmt::format(
        "{}; garbage-collection pauses explain {:.0f}% of it, most on data rank {} stage {} "
        "(ranks {}: {:.1f} ms of GC a step)",
        j.Head(), std::min(1.0, v.explained) * 100, v.data_rank, v.stage, RankList(v.ranks),
        gc.empty() ? 0.0 : gc[w] / 1e3);
    v.next_step =
        "Python's cyclic GC stops the rank that runs it while the others wait: call "
        "gc.freeze() after start-up, raise the thresholds (gc.set_threshold) or run "
        "gc.collect() at the same step on every rank";
    return v;
  }
  if (s - 1 >= j.ShareFor(Verdict::kSlowCommunication, group) * j.excess &&
      IsCommunicationGroup(group)) {
    WhatIfVerdict v = base;
    v.verdict = Verdict::kSlowCommunication;
    v.op_group = group;
    v.explained = (s - 1) / j.excess;
    v.note = fmt::format(
        "{}; {} alone explains {:.0f}% of it (S = {:.3f} with only its "
        "measured times)",
        j.Head(), group, std::min(1.0, v.explained) * 100, s);
    v.next_step = fmt::format(
        "{} transfers take longer than typical: check the links of the ranks in that "
        "group (NCCL_DEBUG=INFO, the fabric's counters), and whether it overlaps compute",
        group);
    return v;
  }
  return std::nullopt;
}

// Rule 2. Where compute sits: by data-parallel replica and by stage.
WorstParts FindWorstParts(const Judging& j) {
  const Decomposition& d = j.r.decomposition;
  WorstParts worst;
  worst.dp_top = ArgMax(d.by_dp_rank);
  worst.stage_top = ArgMax(d.by_stage);
  worst.dp_explaining = CountExplaining(d.by_dp_rank, j.need);
  worst.stage_explaining = CountExplaining(d.by_stage, j.need);
  return worst;
}

// Whether `stage` holds more compute than the stages' mean on every replica (by
// min_stage_excess), whichever replica is slowest in each step.
bool HeavierOnEveryReplica(const Judging& j, size_t stage) {
  const std::vector<double> worker_compute = j.stats.WorkerComputeUs();
  bool heavier = j.layout.pp > 1;
  for (uint32_t dp = 0; dp < j.layout.dp && heavier; ++dp) {
    double replica_total = 0;
    for (uint32_t st = 0; st < j.layout.pp; ++st) {
      const uint32_t w = st * j.layout.dp + dp;
      replica_total += w < worker_compute.size() ? worker_compute[w] : 0;
    }
    const uint32_t w = static_cast<uint32_t>(stage) * j.layout.dp + dp;
    const double replica_mine = w < worker_compute.size() ? worker_compute[w] : 0;
    heavier = replica_mine >= (1 + j.o.min_stage_excess) * replica_total / j.layout.pp;
  }
  return heavier;
}

// Rule 3. A stage that explains S and holds more compute than the stages' mean on every
// replica: a badly cut pipeline, whichever replica is slowest in each step (with few replicas,
// noise decides that). Checked before sequence imbalance: the decomposition by stage decides.
std::optional<WhatIfVerdict> StageImbalanceVerdict(const Judging& j, const WorstParts& worst,
                                                   const WhatIfVerdict& base) {
  const Decomposition& d = j.r.decomposition;
  const size_t stage_top = worst.stage_top;
  const std::vector<double> compute = j.stats.StageComputeUs();
  double total = 0;
  for (double c : compute) total += c;
  const double mean = total / std::max<size_t>(1, compute.size());
  const double mine = stage_top < compute.size() ? compute[stage_top] : 0;
  const bool heavier_on_every_replica = HeavierOnEveryReplica(j, stage_top);
  const bool keeps_stage =
      j.held_kind == Verdict::kStageImbalance && j.held->stage == static_cast<int32_t>(stage_top);
  const double stage_need = keeps_stage ? j.ShareFor(Verdict::kStageImbalance) * j.excess : j.need;
  if (!(d.by_stage[stage_top] - 1 >= stage_need && heavier_on_every_replica)) return std::nullopt;
  WhatIfVerdict v = base;
  v.verdict = Verdict::kStageImbalance;
  v.stage = static_cast<int32_t>(stage_top);
  v.explained = (d.by_stage[stage_top] - 1) / j.excess;
  v.move_fraction = mine > 0 ? std::max(0.0, (mine - mean) / mine) : 0;
  for (uint32_t w = static_cast<uint32_t>(stage_top) * j.layout.dp;
       w < (stage_top + 1) * j.layout.dp && w < j.worker_ranks.size(); ++w) {
    v.ranks.insert(v.ranks.end(), j.worker_ranks[w].begin(), j.worker_ranks[w].end());
  }
  std::sort(v.ranks.begin(), v.ranks.end());
  v.note = fmt::format(
      "{}; pipeline stage {} holds more work than the others on every replica: its compute "
      "is {:.0f}% above the stages' mean; with only its times measured S = {:.3f}, and "
      "typical times on it alone take back {:.0f}% of the loss (M_S)",
      j.Head(), stage_top, mean > 0 ? (mine / mean - 1) * 100 : 0.0, d.by_stage[stage_top],
      std::min(1.0, j.r.m_s) * 100);
  v.next_step = fmt::format(
      "repartition the pipeline: move about {:.0f}% of stage {}'s layers (or its loss / "
      "embedding work) to other stages (Megatron: --decoder-first/last-pipeline-num-layers, "
      "or uneven --num-layers-per-virtual-pipeline-stage)",
      v.move_fraction * 100, stage_top);
  return v;
}

// Rule 4. The slowest replica of each step: does it move, and is it alone? Sequence imbalance
// makes one replica (or a few) slow in a step, a different one the next; a long stage makes
// every replica slow in every step; a slow worker the same replica in every step.
std::optional<WhatIfVerdict> SequenceImbalanceVerdict(const Judging& j, const WorstParts& worst,
                                                      const WhatIfVerdict& base) {
  std::map<size_t, uint32_t> slowest_counts;
  uint32_t decomposed_steps = 0, lone_steps = 0;
  for (const StepResult& sr : j.r.per_step) {
    const std::vector<double>& by_dp = sr.decomposition.by_dp_rank;
    if (by_dp.empty() || sr.slowdown < j.o.warn_slowdown) continue;
    const size_t top = ArgMax(by_dp);
    ++slowest_counts[top];
    ++decomposed_steps;
    const double step_need = j.o.explain_share * (sr.slowdown - 1);
    if (by_dp[top] - 1 >= step_need &&
        CountExplaining(by_dp, step_need) <= std::max<size_t>(1, by_dp.size() / 2)) {
      ++lone_steps;
    }
  }
  uint32_t mode = 0;
  for (const auto& [dp, n] : slowest_counts) mode = std::max(mode, n);
  const bool moving = j.layout.dp > 1 && decomposed_steps >= j.o.min_steps &&
                      mode <= j.o.moving_max_share * decomposed_steps &&
                      lone_steps >= 0.5 * decomposed_steps;
  if (!moving) return std::nullopt;
  WhatIfVerdict v = base;
  v.verdict = Verdict::kSequenceImbalance;
  v.moving_replicas = static_cast<uint32_t>(slowest_counts.size());
  v.explained = (j.r.decomposition.by_dp_rank[worst.dp_top] - 1) / j.excess;
  v.note = fmt::format(
      "{}; the slowest data-parallel replica changes from step to step ({} of {} replicas "
      "were the slowest in some step, none in more than {:.0f}% of steps, and in {:.0f}% of "
      "steps it alone held the others back): the replicas get unequal work, e.g. sequence "
      "lengths",
      j.Head(), v.moving_replicas, j.layout.dp,
      100.0 * mode / std::max<uint32_t>(1, decomposed_steps),
      100.0 * lone_steps / std::max<uint32_t>(1, decomposed_steps));
  v.next_step =
      "balance the work per replica, not the samples: pack or bucket sequences by length "
      "(token-count batching), or sort each global batch by length before splitting it";
  return v;
}

// Rule 5. One replica and one stage: one worker. A held slow worker stays while it explains
// keep_share on both decompositions and no other replica explains the entry share.
std::optional<WhatIfVerdict> SlowWorkerVerdict(const Judging& j, const WorstParts& worst,
                                               const WhatIfVerdict& base) {
  const Decomposition& d = j.r.decomposition;
  const size_t dp_top = worst.dp_top, stage_top = worst.stage_top;
  const bool keeps_worker = j.held_kind == Verdict::kSlowWorker &&
                            j.held->data_rank == static_cast<int32_t>(dp_top) &&
                            j.held->stage == static_cast<int32_t>(stage_top);
  const double worker_need = keeps_worker ? j.ShareFor(Verdict::kSlowWorker) * j.excess : j.need;
  if (!(d.by_dp_rank[dp_top] - 1 >= worker_need && d.by_stage[stage_top] - 1 >= worker_need &&
        worst.dp_explaining <= 1 && (worst.stage_explaining >= 1 || keeps_worker))) {
    return std::nullopt;
  }
  const uint32_t w = static_cast<uint32_t>(stage_top * j.layout.dp + dp_top);
  WhatIfVerdict v = base;
  v.verdict = Verdict::kSlowWorker;
  v.data_rank = static_cast<int32_t>(dp_top);
  v.stage = static_cast<int32_t>(stage_top);
  v.ranks = j.RanksOf(w);
  v.explained = std::min(d.by_dp_rank[dp_top], d.by_stage[stage_top]) - 1;
  v.explained /= j.excess;
  v.note = fmt::format(
      "{}; one worker holds the job back: data rank {}, stage {} (ranks {}); with only its "
      "times measured S = {:.3f}, and typical times on it alone take back {:.0f}% of the "
      "loss (M_W)",
      j.Head(), dp_top, stage_top, RankList(v.ranks),
      std::min(d.by_dp_rank[dp_top], d.by_stage[stage_top]), std::min(1.0, j.r.m_w) * 100);
  v.next_step =
      "look at that worker's host and device: thermal throttling, a degraded GPU or link, "
      "a noisy neighbour; `rankwatch capture` on its rank compares it with a typical one; "
      "cordon the node if it repeats";
  return v;
}

// Slower than ideal, but without a decomposition (below its threshold).
WhatIfVerdict NotDecomposedVerdict(const Judging& j, WhatIfVerdict v) {
  v.verdict = Verdict::kUnattributed;
  v.note = j.Head() + "; not decomposed (below the decomposition threshold)";
  return v;
}

// Slower than ideal, and no replica, stage or op type explains it: info, unless S reaches
// crit_slowdown.
WhatIfVerdict UnattributedVerdict(const Judging& j, const WorstParts& worst, WhatIfVerdict v) {
  const Decomposition& d = j.r.decomposition;
  v.verdict = Verdict::kUnattributed;
  v.severity = j.r.slowdown >= j.o.crit_slowdown ? Severity::kCrit : Severity::kInfo;
  v.explained = 0;
  v.note = fmt::format(
      "{}; no single replica, stage or op type explains half of it (worst: data rank {} "
      "S = {:.3f}, stage {} S = {:.3f})",
      j.Head(), worst.dp_top, d.by_dp_rank[worst.dp_top], worst.stage_top,
      d.by_stage[worst.stage_top]);
  v.next_step = "look at the stage x replica grid in the web UI for where the time goes";
  return v;
}

}  // namespace

WhatIfVerdict JudgeWhatIf(const WindowResult& r, const Layout& layout,
                          const std::vector<std::vector<uint32_t>>& worker_ranks,
                          const OpStats& stats, const VerdictOptions& o,
                          const WhatIfVerdict* held) {
  if (r.steps < o.min_steps || r.ideal_us <= 0) return {};
  const Judging j(r, layout, worker_ranks, stats, o, held);
  WhatIfVerdict v = MeasureLoss(j);
  if (std::optional<WhatIfVerdict> balanced = BalancedVerdict(j, v)) return *balanced;
  v.severity = SeverityOf(j);
  if (std::optional<WhatIfVerdict> found = OpGroupVerdict(j, v)) return *found;
  if (r.decomposition.by_dp_rank.empty() || r.decomposition.by_stage.empty()) {
    return NotDecomposedVerdict(j, std::move(v));
  }
  const WorstParts worst = FindWorstParts(j);
  if (std::optional<WhatIfVerdict> found = StageImbalanceVerdict(j, worst, v)) return *found;
  if (std::optional<WhatIfVerdict> found = SequenceImbalanceVerdict(j, worst, v)) return *found;
  if (std::optional<WhatIfVerdict> found = SlowWorkerVerdict(j, worst, v)) return *found;
  return UnattributedVerdict(j, worst, std::move(v));
}

}  // namespace rankwatch::whatif
