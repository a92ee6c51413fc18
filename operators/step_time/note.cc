#include "operators/step_time/note.h"

#include <fmt/format.h>

#include <cmath>

namespace rankwatch::step_time {
namespace {

double Ms(double seconds) { return seconds * 1e3; }

}  // namespace

std::string StragglerNote(const Culprit& c, const CulpritSet& set, const Attribution& a,
                          const WindowSignals& s, const OwnTimeSignals& t) {
  const std::string who =
      set.scope == CulpritScope::kNode
          ? fmt::format("node {} (ranks {})", set.node, RankList(set.ranks))
          : fmt::format("rank {}{}", c.rank, set.node.empty() ? "" : " on " + set.node);
  // How much longer the other ranks wait for the culprit, where that is measured.
  double waits = NAN;
  if (s.evidence[PhaseIndex(Phase::kCollective)].stat.present) {
    const double mine = s.phase[PhaseIndex(Phase::kCollective)][c.rank];
    if (Known(mine)) waits = s.Median(Phase::kCollective) - mine;
  }
  const std::string wait_text =
      Known(waits) && waits > 0
          ? fmt::format("; the other ranks wait {:.1f} ms a step longer than it in collectives",
                        Ms(waits))
          : "";
  if (a.cause == StragglerCause::kGc) {
    const double mine = s.gc[c.rank], collections = s.gc_collections[c.rank];
    const std::string counted =
        Known(collections) && collections > 0
            ? fmt::format(" ({:.1f} collections a step of {:.1f} ms each; the median rank {:.1f})",
                          collections, Ms(mine / collections), s.gc_median_collections)
            : "";
    return fmt::format(
        "{} pauses {:.1f} ms a step in garbage collection, {:.1f} ms more than the median "
        "rank{}{}",
        who, Ms(mine), Ms(a.parts.gc), counted, wait_text);
  }
  if (c.signal == CulpritSignal::kOwn && a.cause == StragglerCause::kOutside) {
    return fmt::format(
        "{} spends {:.1f} ms more per step outside the measured phases (not in dataloader, "
        "forward, backward or optimizer: host code between them, a custom autograd op after "
        "the model's output, or CPU contention){}",
        who, Ms(a.parts.outside), wait_text);
  }
  if (c.signal == CulpritSignal::kOwn && a.cause == StragglerCause::kNone) {
    return fmt::format(
        "{}'s own time (step time less time blocked on other ranks) is {:.1f} ms a step above "
        "the median rank's; where the excess sits is unknown ({})",
        who, Ms(a.parts.own),
        t.blocked.kind == BlockedModel::Kind::kSharded
            ? "the job is sharded and reports no collective times"
            : "missing " + MissingText(s.missing));
  }
  if (a.phase.median > 0) {
    return fmt::format(
        "{} spends {:.0f}% more time in {} than the median rank ({:.1f} ms more per step){}", who,
        a.phase.excess / a.phase.median * 100, PhaseName(a.phase.phase), Ms(a.phase.excess),
        wait_text);
  }
  return fmt::format(
      "{} spends {:.1f} ms more per step in {} than the median rank, which spends none{}", who,
      Ms(a.phase.excess), PhaseName(a.phase.phase), wait_text);
}

std::string RankList(const std::vector<uint32_t>& ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i == 8) return out + fmt::format(" and {} more", ranks.size() - 8);
    out += (i ? "," : "") + std::to_string(ranks[i]);
  }
  return out;
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

}  // namespace rankwatch::step_time
