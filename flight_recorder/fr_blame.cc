// The wait-for graph across groups: who waits for whom, the ranks that hold the job, what
// missing dumps leave undecided, the summary (fr_analysis_internal.h; the rules are
// docs/flight-recorder.md's "Who is named").
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "flight_recorder/fr_analysis_internal.h"
#include "flight_recorder/fr_report.h"

namespace rankwatch::fr::internal {
namespace {

bool Contains(const std::vector<uint32_t>& v, uint32_t x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

FrGroupReport::State StateOf(const FrGroupReport& r) {
  if (!r.mismatches.empty()) return FrGroupReport::State::kMismatch;
  if (!r.not_completing.empty()) return FrGroupReport::State::kNotCompleting;
  if (!r.missing.empty()) return FrGroupReport::State::kMissing;
  if (!r.no_dump.empty()) return FrGroupReport::State::kUndecided;
  return FrGroupReport::State::kWaiting;
}

// Strongly connected components (Tarjan, iterative) of the wait-for graph.
std::vector<int> Components(const std::vector<std::set<uint32_t>>& edges, int* count) {
  const size_t n = edges.size();
  std::vector<int> index(n, -1), low(n, 0), comp(n, -1);
  std::vector<char> on(n, 0);
  std::vector<uint32_t> stack;
  int next = 0;
  *count = 0;
  struct Frame {
    uint32_t v;
    std::set<uint32_t>::const_iterator it;
  };
  for (uint32_t s = 0; s < n; ++s) {
    if (index[s] >= 0) continue;
    std::vector<Frame> call{{s, edges[s].begin()}};
    index[s] = low[s] = next++;
    stack.push_back(s);
    on[s] = 1;
    while (!call.empty()) {
      Frame& f = call.back();
      if (f.it != edges[f.v].end()) {
        const uint32_t w = *f.it++;
        if (index[w] < 0) {
          index[w] = low[w] = next++;
          stack.push_back(w);
          on[w] = 1;
          call.push_back({w, edges[w].begin()});
        } else if (on[w]) {
          low[f.v] = std::min(low[f.v], index[w]);
        }
        continue;
      }
      const uint32_t v = f.v;
      call.pop_back();
      if (!call.empty()) low[call.back().v] = std::min(low[call.back().v], low[v]);
      if (low[v] == index[v]) {
        uint32_t w;
        do {
          w = stack.back();
          stack.pop_back();
          on[w] = 0;
          comp[w] = *count;
        } while (w != v);
        ++*count;
      }
    }
  }
  return comp;
}

}  // namespace

void ResolveWaits(Analysis* a) {
  // Ranks that wait in a collective of some group.
  std::vector<char> in_collective(a->world, 0);
  for (const std::vector<uint32_t>& members : a->in_collective)
    for (uint32_t r : members)
      if (r < a->world) in_collective[r] = 1;

  // Point-to-point operations without a counterpart: the rank waits for the peer either way. A
  // peer that waits in a collective is blocked there (it has not reached its send or receive);
  // one that does not is missing from the operation.
  for (const P2pWait& w : a->p2p) {
    FrGroupReport& r = a->reports[w.report];
    a->waits[w.rank].insert(w.peer);
    if (w.peer < a->world && in_collective[w.peer]) {
      r.blocked.push_back(w.peer);
      continue;
    }
    if (r.missing.empty() || When(w.op) < When(r.frontier)) r.frontier = w.op;
    r.missing.push_back(w.peer);
    Blame(&a->missing, w.peer, FrCulprit::Reason::kMissing, *w.group, w.op, w.peer_member);
  }
  for (FrGroupReport& r : a->reports) {
    Unique(&r.missing);
    Unique(&r.blocked);
    r.state = StateOf(r);
  }

  // A mismatched or not-completing rank's stream is stuck: the collectives it has pending that
  // every member enqueued (the group waits, or its state is undecided) cannot complete, and
  // their other members wait for it.
  for (size_t i = 0; i < a->reports.size(); ++i) {
    FrGroupReport& r = a->reports[i];
    if (r.frontier.p2p) continue;
    if (r.state != FrGroupReport::State::kWaiting && r.state != FrGroupReport::State::kUndecided)
      continue;
    const std::vector<uint32_t>& members = a->in_collective[i];
    for (uint32_t m : members)
      if (a->mismatched.count(m) || a->not_completing.count(m)) r.held_by.push_back(m);
    for (uint32_t w : members)
      if (!Contains(r.held_by, w))
        for (uint32_t h : r.held_by) a->culprit_waits[w].insert(h);
  }
}

void NameCulprits(const Built& b, const Analysis& a, FrVerdict* v) {
  const uint32_t world = v->world_size;
  // The ranks that wait in a collective of a group whose frontier depends on a rank without a
  // usable dump: what they wait for is undecided (the first such group, by report).
  std::vector<int> in_undecided(world, -1);
  for (size_t i = 0; i < a.reports.size(); ++i)
    if (!a.reports[i].no_dump.empty())
      for (uint32_t r : a.in_collective[i])
        if (r < world && in_undecided[r] < 0) in_undecided[r] = static_cast<int>(i);

  // Sinks of the wait-for graph hold the job.
  int ncomp = 0;
  const std::vector<int> comp = Components(a.waits, &ncomp);
  std::vector<char> comp_leaves(static_cast<size_t>(ncomp), 0),
      comp_entered(static_cast<size_t>(ncomp), 0);
  std::vector<size_t> comp_size(static_cast<size_t>(ncomp), 0);
  for (uint32_t r = 0; r < world; ++r) {
    ++comp_size[static_cast<size_t>(comp[r])];
    for (uint32_t w : a.waits[r]) {
      if (comp[w] != comp[r]) {
        comp_leaves[static_cast<size_t>(comp[r])] = 1;
        comp_entered[static_cast<size_t>(comp[w])] = 1;
      }
    }
  }
  std::vector<std::vector<uint32_t>> waiters(world);
  for (uint32_t r = 0; r < world; ++r)
    for (uint32_t w : a.waits[r]) waiters[w].push_back(r);
  for (const auto& [r, ms] : a.culprit_waits)
    for (uint32_t w : ms)
      if (r < world && w < world) waiters[w].push_back(r);
  auto blocked_by = [&](uint32_t culprit) {
    std::vector<char> seen(world, 0);
    std::vector<uint32_t> todo{culprit};
    seen[culprit] = 1;
    uint32_t n = 0;
    while (!todo.empty()) {
      const uint32_t x = todo.back();
      todo.pop_back();
      for (uint32_t y : waiters[x])
        if (!seen[y]) {
          seen[y] = 1;
          ++n;
          todo.push_back(y);
        }
    }
    return n;
  };
  std::map<uint32_t, FrCulprit> culprits = a.not_completing;
  for (const auto& [rank, c] : a.mismatched) culprits.emplace(rank, c);
  std::vector<std::string> waits_undecided;  // missing ranks not named: they wait on undecided
  for (uint32_t r = 0; r < world; ++r) {
    const auto c = static_cast<size_t>(comp[r]);
    if (comp_leaves[c]) continue;  // waits for someone outside its component
    const bool cycle = comp_size[c] > 1;
    if (!cycle && !comp_entered[c]) continue;  // nobody waits for it
    if (culprits.count(r)) continue;
    if (a.culprit_waits.count(r)) continue;  // waits for a culprit named above
    auto it = a.missing.find(r);
    if (!cycle) {
      // Only waited for as the peer of a send or receive while it waits in a collective: it is
      // blocked there, and the collective holds nobody the dumps show.
      if (it == a.missing.end()) continue;
      // Missing from one group while it waits in another that a missing dump leaves undecided.
      if (in_undecided[r] >= 0) {
        const FrGroupReport& u = a.reports[static_cast<size_t>(in_undecided[r])];
        waits_undecided.push_back(
            fmt::format("rank {} is missing from {} {} but waits in {} {}, which is undecided", r,
                        GroupText(it->second.group_desc, it->second.group_ranks),
                        OpText(it->second.op), GroupText(u.desc, u.ranks), OpText(u.frontier)));
        continue;
      }
    }
    FrCulprit cu;
    if (it != a.missing.end()) cu = it->second;
    cu.rank = r;
    if (cycle)
      cu.reason = FrCulprit::Reason::kCycle;
    else if (b.state[r] == DumpState::kMissing || b.state[r] == DumpState::kUnreadable)
      cu.reason = FrCulprit::Reason::kNoDump;
    else
      cu.reason = FrCulprit::Reason::kMissing;
    culprits[r] = std::move(cu);
  }
  for (auto& [rank, c] : culprits) {
    c.dump = rank < world ? b.state[rank] : DumpState::kMissing;
    c.waiting = waiters[rank];
    Unique(&c.waiting);
    c.blocked = blocked_by(rank);
    v->culprits.push_back(c);
  }
  std::stable_sort(v->culprits.begin(), v->culprits.end(),
                   [](const FrCulprit& x, const FrCulprit& y) {
                     if (x.blocked != y.blocked) return x.blocked > y.blocked;
                     return x.rank < y.rank;
                   });

  // Per rank: the ranks it waits for directly.
  for (uint32_t r = 0; r < world && r < v->ranks.size(); ++r) {
    std::set<uint32_t> waits_for = a.waits[r];
    auto cw = a.culprit_waits.find(r);
    if (cw != a.culprit_waits.end()) waits_for.insert(cw->second.begin(), cw->second.end());
    v->ranks[r].waits_for.assign(waits_for.begin(), waits_for.end());
  }

  // What missing dumps leave open.
  std::vector<uint32_t> no_dump = v->missing;
  no_dump.insert(no_dump.end(), v->unreadable.begin(), v->unreadable.end());
  Unique(&no_dump);
  std::vector<uint32_t> open_ranks;  // ranks the undecided groups depend on
  size_t open_groups = 0;
  const FrGroupReport* first_open = nullptr;
  for (const FrGroupReport& r : a.reports) {
    if (r.no_dump.empty()) continue;
    ++open_groups;
    open_ranks.insert(open_ranks.end(), r.no_dump.begin(), r.no_dump.end());
  }
  Unique(&open_ranks);
  for (const FrGroupReport& r : v->groups) {
    if (r.no_dump.empty()) continue;
    if (!first_open) first_open = &r;
    v->undecided.push_back(
        fmt::format("{}: {} pending; {} left no usable record of the group, so whether {} reached "
                    "it is unknown",
                    GroupText(r.desc, r.ranks), OpText(r.frontier), RankRanges(r.no_dump),
                    r.no_dump.size() == 1 ? "it" : "they"));
  }
  v->undecided.insert(v->undecided.end(), waits_undecided.begin(), waits_undecided.end());
  if (v->hang_found && v->culprits.empty() && v->undecided.empty()) {
    bool blocked = false;
    for (const FrGroupReport& r : a.reports) blocked = blocked || !r.blocked.empty();
    v->undecided.push_back(
        std::string("every member of each pending group enqueued its operation and saw the same "
                    "completions: the wait is inside NCCL or the network, or the dumps were "
                    "written before the hang") +
        (blocked ? "; the sends and receives wait for peers blocked in those collectives" : ""));
  }

  // Summary.
  std::string dumps_text =
      fmt::format("{} of {} dumps read", v->read.size() + v->empty.size(), world);
  if (!v->empty.empty()) dumps_text += fmt::format(" ({} without entries)", v->empty.size());
  if (!no_dump.empty())
    dumps_text += fmt::format("; none usable from ranks {}", RankRanges(no_dump));
  if (!v->hang_found) {
    v->summary = "nothing pending in any group: no hang in these dumps; " + dumps_text;
  } else if (v->culprits.empty() && open_groups > 0) {
    v->summary = fmt::format(
        "undecided: {} {} left no usable record of {} pending {} ({}{}): no rank is named; {}",
        open_ranks.size() == 1 ? "rank" : "ranks", RankRanges(open_ranks), open_groups,
        open_groups == 1 ? "group" : "groups",
        first_open
            ? GroupText(first_open->desc, first_open->ranks) + " " + OpText(first_open->frontier)
            : std::string("-"),
        open_groups > 1 ? ", ..." : "", dumps_text);
  } else if (v->culprits.empty()) {
    v->summary = "no rank named: " + (v->undecided.empty() ? std::string() : v->undecided.front()) +
                 "; " + dumps_text;
  } else {
    std::map<std::string, std::vector<uint32_t>> by_where;
    std::vector<std::string> order;
    for (const FrCulprit& c : v->culprits) {
      const std::string where = fmt::format("{} in {} {}", CulpritReasonName(c.reason),
                                            GroupText(c.group_desc, c.group_ranks), OpText(c.op));
      if (!by_where.count(where)) order.push_back(where);
      by_where[where].push_back(c.rank);
    }
    std::vector<uint32_t> all;
    for (const FrCulprit& c : v->culprits) all.push_back(c.rank);
    Unique(&all);
    std::string parts;
    for (const std::string& w : order) {
      std::vector<uint32_t> rs = by_where[w];
      Unique(&rs);
      parts += fmt::format("{}{} {}", parts.empty() ? "" : "; ", RankRanges(rs), w);
    }
    v->summary =
        fmt::format("{} {} the job ({}); {}", all.size() == 1 ? "rank" : "ranks",
                    RankRanges(all) + (all.size() == 1 ? " holds" : " hold"), parts, dumps_text);
  }
}

}  // namespace rankwatch::fr::internal
