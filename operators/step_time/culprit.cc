#include "operators/step_time/culprit.h"

namespace rankwatch::step_time {

Culprit ChooseCulprit(const StragglerScores& x, const WindowSignals& s, const OwnTimeSignals& t) {
  Culprit c;
  if (x.input_hit || x.compute_hit) {
    c.signal = x.compute_hit && (!x.input_hit || x.compute.score() >= x.input.score())
                   ? CulpritSignal::kCompute
                   : CulpritSignal::kInput;
  }
  const SignalScore& score = c.signal == CulpritSignal::kInput     ? x.input
                             : c.signal == CulpritSignal::kCompute ? x.compute
                                                                   : x.own;
  c.from_onset_window = score.onset > score.full;
  if (c.from_onset_window) {
    c.excess = c.signal == CulpritSignal::kInput     ? x.onset.dl_excess
               : c.signal == CulpritSignal::kCompute ? x.onset.compute_excess
                                                     : x.onset.own_excess;
    c.rank = score.onset_worst.rank;
    c.burden = x.onset_burden;
  } else {
    const SignalEvidence& ev = c.signal == CulpritSignal::kInput
                                   ? s.evidence[PhaseIndex(Phase::kDataloader)]
                               : c.signal == CulpritSignal::kCompute ? t.compute_evidence
                                                                     : t.own_evidence;
    c.excess = c.signal == CulpritSignal::kInput     ? s.phase[PhaseIndex(Phase::kDataloader)]
               : c.signal == CulpritSignal::kCompute ? t.compute
                                                     : t.own;
    for (double& v : c.excess) v -= ev.stat.median_seconds;
    c.rank = ev.stat.worst_rank;
    c.burden = x.burden;
  }
  return c;
}

CulpritSet ScopeOf(const Culprit& c, const std::vector<std::string>& rank_nodes,
                   const StepDiagnosisOptions& o) {
  CulpritSet set;
  set.node = c.rank < rank_nodes.size() ? rank_nodes[c.rank] : "";
  std::vector<uint32_t> node_ranks, node_hits;
  for (uint32_t r = 0; r < c.excess.size(); ++r) {
    if (set.node.empty() || r >= rank_nodes.size() || rank_nodes[r] != set.node) continue;
    node_ranks.push_back(r);
    if (Known(c.excess[r]) && AtLeast(c.excess[r] / c.burden, o.straggler_warn)) {
      node_hits.push_back(r);
    }
  }
  if (node_ranks.size() >= 2 && node_hits.size() >= 2 &&
      node_hits.size() >= o.node_fraction * node_ranks.size()) {
    set.scope = CulpritScope::kNode;
    set.ranks = std::move(node_hits);
  } else {
    set.scope = CulpritScope::kRank;
    set.ranks = {c.rank};
  }
  return set;
}

}  // namespace rankwatch::step_time
