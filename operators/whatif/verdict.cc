#include "operators/whatif/verdict.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>

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

WhatIfVerdict JudgeWhatIf(const WindowResult& r, const Layout& layout,
                          const std::vector<std::vector<uint32_t>>& worker_ranks,
                          const OpStats& stats, const VerdictOptions& o,
                          const WhatIfVerdict* held) {
  WhatIfVerdict v;
  if (r.steps < o.min_steps || r.ideal_us <= 0) return v;
  // The held verdict's exit thresholds keep it (hysteresis); any other needs the entry ones.
  const Verdict held_kind = held != nullptr ? held->verdict : Verdict::kNone;
  const bool held_finding = held_kind != Verdict::kNone && held_kind != Verdict::kBalanced;
  // The share of S - 1 a group must explain for `kind` (and, for op groups, `group`).
  auto share_for = [&](Verdict kind, std::string_view group = {}) {
    const bool keeps = kind == held_kind && (group.empty() || group == held->op_group);
    return keeps ? std::min(o.keep_share, o.explain_share) : o.explain_share;
  };
  v.slowdown = r.slowdown;
  const uint32_t world = std::max<uint32_t>(1, layout.workers() * std::max<uint32_t>(1, layout.tp));
  v.lost_rank_seconds = std::max(0.0, r.actual_us - r.ideal_us) * 1e-6 * r.steps * world;
  const double excess = r.slowdown - 1;
  const double lost_ms = std::max(0.0, r.actual_us - r.ideal_us) / 1e3;
  if (r.slowdown < (held_finding ? std::min(o.exit_slowdown, o.warn_slowdown) : o.warn_slowdown)) {
    v.verdict = Verdict::kBalanced;
    v.note = fmt::format(
        "steps take {:.1f} ms, {:.1f}% above a run where every op took its typical time: "
        "no worker, stage or op type holds the pipeline back",
        r.actual_us / 1e3, excess * 100);
    return v;
  }
  const bool crit = r.slowdown >= o.crit_slowdown ||
                    (held != nullptr && held->severity == Severity::kCrit &&
                     r.slowdown >= std::min(o.crit_exit_slowdown, o.crit_slowdown));
  v.severity = crit ? Severity::kCrit : Severity::kWarn;
  const double need = o.explain_share * excess;
  const Decomposition& d = r.decomposition;
  auto ranks_of = [&](uint32_t worker) {
    return worker < worker_ranks.size() ? worker_ranks[worker] : std::vector<uint32_t>{};
  };
  const std::string head = fmt::format(
      "steps take {:.1f} ms where typical op times give {:.1f} ms (S = {:.3f}, "
      "{:.1f} ms a step lost)",
      r.actual_us / 1e3, r.ideal_us / 1e3, r.slowdown, lost_ms);

  // 1. One op group explains it: GC pauses or a kind of communication.
  if (!d.by_op_group.empty()) {
    const auto& [group, s] = d.by_op_group.front();
    if (s - 1 >= share_for(Verdict::kGcPauses, group) * excess &&
        group == OpGroupName(OpKind::kGc)) {
      const std::vector<double> gc = stats.WorkerGcUs();
      const uint32_t w = gc.empty() ? 0 : static_cast<uint32_t>(ArgMax(gc));
      v.verdict = Verdict::kGcPauses;
      v.op_group = group;
      v.explained = (s - 1) / excess;
      v.data_rank = static_cast<int32_t>(w % layout.dp);
      v.stage = static_cast<int32_t>(w / layout.dp);
      v.ranks = ranks_of(w);
      v.note = fmt::format(
          "{}; garbage-collection pauses explain {:.0f}% of it, most on data rank {} stage {} "
          "(ranks {}: {:.1f} ms of GC a step)",
          head, std::min(1.0, v.explained) * 100, v.data_rank, v.stage, RankList(v.ranks),
          gc.empty() ? 0.0 : gc[w] / 1e3);
      v.next_step =
          "Python's cyclic GC stops the rank that runs it while the others wait: call "
          "gc.freeze() after start-up, raise the thresholds (gc.set_threshold) or run "
          "gc.collect() at the same step on every rank";
      return v;
    }
    if (s - 1 >= share_for(Verdict::kSlowCommunication, group) * excess &&
        IsCommunicationGroup(group)) {
      v.verdict = Verdict::kSlowCommunication;
      v.op_group = group;
      v.explained = (s - 1) / excess;
      v.note = fmt::format(
          "{}; {} alone explains {:.0f}% of it (S = {:.3f} with only its "
          "measured times)",
          head, group, std::min(1.0, v.explained) * 100, s);
      v.next_step = fmt::format(
          "{} transfers take longer than typical: check the links of the ranks in that "
          "group (NCCL_DEBUG=INFO, the fabric's counters), and whether it overlaps compute",
          group);
      return v;
    }
  }

  // 2. Where compute sits: by data-parallel replica and by stage.
  if (d.by_dp_rank.empty() || d.by_stage.empty()) {
    v.verdict = Verdict::kUnattributed;
    v.note = head + "; not decomposed (below the decomposition threshold)";
    return v;
  }
  const size_t dp_top = ArgMax(d.by_dp_rank);
  const size_t stage_top = ArgMax(d.by_stage);
  const size_t dp_explaining = CountExplaining(d.by_dp_rank, need);
  const size_t stage_explaining = CountExplaining(d.by_stage, need);

  // 3. A stage that explains S and holds more compute than the stages' mean on every replica:
  // a badly cut pipeline, whichever replica is slowest in each step (with few replicas, noise
  // decides that). Checked before sequence imbalance: the decomposition by stage decides.
  const std::vector<double> compute = stats.StageComputeUs();
  double total = 0;
  for (double c : compute) total += c;
  const double mean = total / std::max<size_t>(1, compute.size());
  const double mine = stage_top < compute.size() ? compute[stage_top] : 0;
  const std::vector<double> worker_compute = stats.WorkerComputeUs();
  bool heavier_on_every_replica = layout.pp > 1;
  for (uint32_t dp = 0; dp < layout.dp && heavier_on_every_replica; ++dp) {
    double replica_total = 0;
    for (uint32_t st = 0; st < layout.pp; ++st) {
      const uint32_t w = st * layout.dp + dp;
      replica_total += w < worker_compute.size() ? worker_compute[w] : 0;
    }
    const uint32_t w = static_cast<uint32_t>(stage_top) * layout.dp + dp;
    const double replica_mine = w < worker_compute.size() ? worker_compute[w] : 0;
    heavier_on_every_replica = replica_mine >= (1 + o.min_stage_excess) * replica_total / layout.pp;
  }
  const bool keeps_stage =
      held_kind == Verdict::kStageImbalance && held->stage == static_cast<int32_t>(stage_top);
  const double stage_need = keeps_stage ? share_for(Verdict::kStageImbalance) * excess : need;
  if (d.by_stage[stage_top] - 1 >= stage_need && heavier_on_every_replica) {
    v.verdict = Verdict::kStageImbalance;
    v.stage = static_cast<int32_t>(stage_top);
    v.explained = (d.by_stage[stage_top] - 1) / excess;
    v.move_fraction = mine > 0 ? std::max(0.0, (mine - mean) / mine) : 0;
    for (uint32_t w = static_cast<uint32_t>(stage_top) * layout.dp;
         w < (stage_top + 1) * layout.dp && w < worker_ranks.size(); ++w) {
      v.ranks.insert(v.ranks.end(), worker_ranks[w].begin(), worker_ranks[w].end());
    }
    std::sort(v.ranks.begin(), v.ranks.end());
    v.note = fmt::format(
        "{}; pipeline stage {} holds more work than the others on every replica: its compute "
        "is {:.0f}% above the stages' mean; with only its times measured S = {:.3f}, and "
        "typical times on it alone take back {:.0f}% of the loss (M_S)",
        head, stage_top, mean > 0 ? (mine / mean - 1) * 100 : 0.0, d.by_stage[stage_top],
        std::min(1.0, r.m_s) * 100);
    v.next_step = fmt::format(
        "repartition the pipeline: move about {:.0f}% of stage {}'s layers (or its loss / "
        "embedding work) to other stages (Megatron: --decoder-first/last-pipeline-num-layers, "
        "or uneven --num-layers-per-virtual-pipeline-stage)",
        v.move_fraction * 100, stage_top);
    return v;
  }

  // 4. The slowest replica of each step: does it move, and is it alone? Sequence imbalance makes
  // one replica (or a few) slow in a step, a different one the next; a long stage makes every
  // replica slow in every step; a slow worker the same replica in every step.
  std::map<size_t, uint32_t> slowest_counts;
  uint32_t decomposed_steps = 0, lone_steps = 0;
  for (const StepResult& sr : r.per_step) {
    const std::vector<double>& by_dp = sr.decomposition.by_dp_rank;
    if (by_dp.empty() || sr.slowdown < o.warn_slowdown) continue;
    const size_t top = ArgMax(by_dp);
    ++slowest_counts[top];
    ++decomposed_steps;
    const double step_need = o.explain_share * (sr.slowdown - 1);
    if (by_dp[top] - 1 >= step_need &&
        CountExplaining(by_dp, step_need) <= std::max<size_t>(1, by_dp.size() / 2)) {
      ++lone_steps;
    }
  }
  uint32_t mode = 0;
  for (const auto& [dp, n] : slowest_counts) mode = std::max(mode, n);
  const bool moving = layout.dp > 1 && decomposed_steps >= o.min_steps &&
                      mode <= o.moving_max_share * decomposed_steps &&
                      lone_steps >= 0.5 * decomposed_steps;

  if (moving) {
    v.verdict = Verdict::kSequenceImbalance;
    v.moving_replicas = static_cast<uint32_t>(slowest_counts.size());
    v.explained = (d.by_dp_rank[dp_top] - 1) / excess;
    v.note = fmt::format(
        "{}; the slowest data-parallel replica changes from step to step ({} of {} replicas "
        "were the slowest in some step, none in more than {:.0f}% of steps, and in {:.0f}% of "
        "steps it alone held the others back): the replicas get unequal work, e.g. sequence "
        "lengths",
        head, v.moving_replicas, layout.dp, 100.0 * mode / std::max<uint32_t>(1, decomposed_steps),
        100.0 * lone_steps / std::max<uint32_t>(1, decomposed_steps));
    v.next_step =
        "balance the work per replica, not the samples: pack or bucket sequences by length "
        "(token-count batching), or sort each global batch by length before splitting it";
    return v;
  }

  // 5. One replica and one stage: one worker. A held slow worker stays while it explains
  // keep_share on both decompositions and no other replica explains the entry share.
  const bool keeps_worker = held_kind == Verdict::kSlowWorker &&
                            held->data_rank == static_cast<int32_t>(dp_top) &&
                            held->stage == static_cast<int32_t>(stage_top);
  const double worker_need = keeps_worker ? share_for(Verdict::kSlowWorker) * excess : need;
  if (d.by_dp_rank[dp_top] - 1 >= worker_need && d.by_stage[stage_top] - 1 >= worker_need &&
      dp_explaining <= 1 && (stage_explaining >= 1 || keeps_worker)) {
    const uint32_t w = static_cast<uint32_t>(stage_top * layout.dp + dp_top);
    v.verdict = Verdict::kSlowWorker;
    v.data_rank = static_cast<int32_t>(dp_top);
    v.stage = static_cast<int32_t>(stage_top);
    v.ranks = ranks_of(w);
    v.explained = std::min(d.by_dp_rank[dp_top], d.by_stage[stage_top]) - 1;
    v.explained /= excess;
    v.note = fmt::format(
        "{}; one worker holds the job back: data rank {}, stage {} (ranks {}); with only its "
        "times measured S = {:.3f}, and typical times on it alone take back {:.0f}% of the "
        "loss (M_W)",
        head, dp_top, stage_top, RankList(v.ranks),
        std::min(d.by_dp_rank[dp_top], d.by_stage[stage_top]), std::min(1.0, r.m_w) * 100);
    v.next_step =
        "look at that worker's host and device: thermal throttling, a degraded GPU or link, "
        "a noisy neighbour; `rankwatch capture` on its rank compares it with a typical one; "
        "cordon the node if it repeats";
    return v;
  }

  v.verdict = Verdict::kUnattributed;
  v.severity = r.slowdown >= o.crit_slowdown ? Severity::kCrit : Severity::kInfo;
  v.explained = 0;
  v.note = fmt::format(
      "{}; no single replica, stage or op type explains half of it (worst: data rank {} "
      "S = {:.3f}, stage {} S = {:.3f})",
      head, dp_top, d.by_dp_rank[dp_top], stage_top, d.by_stage[stage_top]);
  v.next_step = "look at the stage x replica grid in the web UI for where the time goes";
  return v;
}

}  // namespace rankwatch::whatif
