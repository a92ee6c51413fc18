#include "flight_recorder/fr_analysis.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <map>
#include <set>
#include <string_view>
#include <utility>

#include "common/rank_ranges.h"
#include "flight_recorder/fr_analysis_internal.h"

// Each group's frontier and the verdict's groups and ranks; the wait-for graph across groups is
// fr_blame.cc's, the groups across ranks fr_groups.cc's, the operations fr_ops.cc's.

namespace rankwatch::fr {

const char* DumpStateName(DumpState s) {
  switch (s) {
    case DumpState::kRead: return "read";
    case DumpState::kEmpty: return "empty";
    case DumpState::kUnreadable: return "unreadable";
    case DumpState::kMissing: return "missing";
  }
  return "?";
}

const char* MismatchKindName(MismatchKind k) {
  switch (k) {
    case MismatchKind::kOpType: return "op_type";
    case MismatchKind::kSize: return "size";
    case MismatchKind::kDtype: return "dtype";
    case MismatchKind::kState: return "state";
  }
  return "?";
}

const char* GroupStateName(FrGroupReport::State s) {
  switch (s) {
    case FrGroupReport::State::kIdle: return "idle";
    case FrGroupReport::State::kWaiting: return "waiting";
    case FrGroupReport::State::kMissing: return "missing";
    case FrGroupReport::State::kNotCompleting: return "not_completing";
    case FrGroupReport::State::kMismatch: return "mismatch";
    case FrGroupReport::State::kUndecided: return "undecided";
  }
  return "?";
}

const char* CulpritReasonName(FrCulprit::Reason r) {
  switch (r) {
    case FrCulprit::Reason::kMissing: return "missing";
    case FrCulprit::Reason::kNotCompleting: return "not_completing";
    case FrCulprit::Reason::kMismatch: return "mismatch";
    case FrCulprit::Reason::kCycle: return "cycle";
    case FrCulprit::Reason::kNoDump: return "no_dump";
  }
  return "?";
}

std::string RankRanges(const std::vector<uint32_t>& sorted) {
  return FormatRankRanges(sorted, {.separator = ",", .dash = "-", .min_run = 3});
}

namespace internal {

void Blame(std::map<uint32_t, FrCulprit>* where, uint32_t rank, FrCulprit::Reason reason,
           const Group& g, const FrOp& op, const Member* m) {
  // Where the wait starts: a collective the rank is missing from explains why its
  // point-to-point peers wait (they follow it); among those, the earliest created.
  auto it = where->find(rank);
  if (it != where->end() &&
      std::make_pair(it->second.op.p2p, When(it->second.op)) <= std::make_pair(op.p2p, When(op)))
    return;
  FrCulprit c;
  c.rank = rank;
  c.reason = reason;
  c.group_desc = g.desc;
  c.group_ranks = g.ranks;
  c.op = op;
  if (m) {
    c.rank_last_enqueued = m->enqueued;
    c.rank_last_completed = m->completed;
  }
  (*where)[rank] = std::move(c);
}

namespace {

// Collective groups: frontier, missing members, members not completing, mismatches; the
// members that wait in one of the group's collectives (`in_collective`).
void AnalyzeCollectives(const Group& g, Analysis* a, FrGroupReport* r,
                        std::vector<uint32_t>* in_collective) {
  // The earliest collective pending on some member: the frontier.
  const FrEntry* frontier = nullptr;
  for (const auto& [rank, m] : g.members)
    for (const FrEntry* e : m.entries)
      if (!IsP2p(*e) && Pending(*e)) {
        if (!frontier || e->collective_seq_id < frontier->collective_seq_id) {
          frontier = e;
        }
        break;
      }
  // Counters compare across members only in a group of collectives (pg_status counts the last
  // work of either kind).
  const bool counters = !g.any_p2p;
  std::vector<uint32_t> pending_members;
  for (const auto& [rank, m] : g.members)
    if (std::any_of(m.entries.begin(), m.entries.end(),
                    [](const FrEntry* e) { return Pending(*e); }) ||
        (counters && m.has_status && m.enqueued > m.completed))
      pending_members.push_back(rank);
  // The members that wait in a collective of the group (not in a point-to-point operation).
  for (const auto& [rank, m] : g.members)
    if (std::any_of(m.entries.begin(), m.entries.end(),
                    [](const FrEntry* e) { return !IsP2p(*e) && Pending(*e); }) ||
        (counters && m.has_status && m.enqueued > m.completed))
      in_collective->push_back(rank);

  // The members' records of the frontier; the ones that differ from the majority's.
  const int64_t f = frontier ? frontier->collective_seq_id : -1;
  std::map<uint32_t, const FrEntry*> at_f;
  std::set<uint32_t> mismatched;
  if (frontier) {
    r->frontier = MakeOp(*frontier, g.ranks);
    // The earliest creation of the frontier among the members that have it.
    for (const auto& [rank, m] : g.members)
      for (const FrEntry* e : m.entries)
        if (!IsP2p(*e) && e->collective_seq_id == f) {
          at_f[rank] = e;
          if (e->time_created_ns >= 0 &&
              (r->frontier.time_created_ns < 0 || e->time_created_ns < r->frontier.time_created_ns))
            r->frontier.time_created_ns = e->time_created_ns;
          break;
        }
  }
  if (at_f.size() > 1) {
    std::map<std::string, std::vector<uint32_t>> by_sig;
    const FrEntry* ref = nullptr;
    size_t best = 0;
    for (const auto& [rank, e] : at_f) {
      std::vector<uint32_t>& v =
          by_sig[std::string(ParseOpName(e->profiling_name).type) + Shapes(e->input_sizes) +
                 Shapes(e->output_sizes) + Dtypes(e->input_dtypes)];
      v.push_back(rank);
      if (v.size() > best) {
        best = v.size();
        ref = e;
      }
    }
    for (const auto& [rank, e] : at_f) {
      FrEntry x = *e, y = *ref;
      x.state = y.state = FrState::kUnknown;  // states differ while a collective is in flight
      FrMismatch mm;
      if (!CompareOps(y, x, g.ranks.size(), &mm)) {
        mm.rank = rank;
        r->mismatches.push_back(mm);
      }
    }
    // No majority: the reference member is as suspect as the ones that differ from it.
    if (!r->mismatches.empty() && best * 2 <= at_f.size()) {
      FrMismatch mm = r->mismatches.front();
      std::swap(mm.expected, mm.found);
      mm.rank = static_cast<uint32_t>(std::find_if(at_f.begin(), at_f.end(), [&](const auto& kv) {
                                        return kv.second == ref;
                                      })->first);
      r->mismatches.push_back(mm);
    }
    for (const FrMismatch& mm : r->mismatches) mismatched.insert(mm.rank);
  }

  // Not completing: a member whose peers completed collectives it never saw complete. A
  // mismatched member's completions do not count: gloo returns at once from a collective that
  // moves no data (a rank's empty tensor) and leaves its peers waiting in it.
  int64_t max_completed = -1, min_completed = std::numeric_limits<int64_t>::max();
  for (const auto& [rank, m] : g.members)
    if (m.known && m.completed >= 0) {
      if (!mismatched.count(rank)) max_completed = std::max(max_completed, m.completed);
      min_completed = std::min(min_completed, m.completed);
    }
  r->completed_everywhere =
      min_completed == std::numeric_limits<int64_t>::max() ? -1 : min_completed;
  if (counters && max_completed >= 0) {
    for (const auto& [rank, m] : g.members) {
      if (!m.known || m.completed < 0 || m.completed >= max_completed) continue;
      r->not_completing.push_back(rank);
      // The first collective its peers completed and it did not.
      const FrEntry* first = nullptr;
      for (const FrEntry* e : m.entries)
        if (!IsP2p(*e) && e->collective_seq_id == m.completed + 1) first = e;
      for (const auto& [peer, pm] : g.members)
        for (const FrEntry* e : pm.entries)
          if (!first && !IsP2p(*e) && e->collective_seq_id == m.completed + 1) first = e;
      FrOp op = first ? MakeOp(*first, g.ranks) : FrOp{};
      if (!first) {
        op.name = "collective";
        op.seq = m.completed + 1;
      }
      Blame(&a->not_completing, rank, FrCulprit::Reason::kNotCompleting, g, op, &m);
      for (uint32_t w : pending_members)
        if (w != rank) a->waits[w].insert(rank);
    }
  }
  if (!frontier) return;
  // Missing: members that never enqueued the frontier.
  for (uint32_t rank : g.ranks) {
    auto it = g.members.find(rank);
    if (it == g.members.end() || !it->second.known) {
      r->no_dump.push_back(rank);
      continue;
    }
    const Member& m = it->second;
    if (at_f.count(rank)) continue;
    int64_t enq = -1;
    for (const FrEntry* e : m.entries)
      if (!IsP2p(*e)) enq = std::max(enq, e->collective_seq_id);
    if (counters && m.has_status) enq = std::max(enq, m.enqueued);
    if (enq < 0 && !m.has_status && m.entries.empty()) {
      r->no_dump.push_back(rank);  // the dump says nothing of its progress in the group
      continue;
    }
    if (enq >= f) continue;  // enqueued (and evicted from, or not kept in, the dump)
    r->missing.push_back(rank);
  }
  for (uint32_t rank : mismatched) {
    auto it = g.members.find(rank);
    Blame(&a->mismatched, rank, FrCulprit::Reason::kMismatch, g, r->frontier,
          it == g.members.end() ? nullptr : &it->second);
  }
  // Waits: the members that enqueued the frontier wait for the missing ones, and the others
  // for the mismatched ones (these are named; the ones waiting for them are not sinks).
  for (uint32_t w : pending_members) {
    for (uint32_t m : r->missing)
      if (w != m) a->waits[w].insert(m);
    if (!mismatched.count(w))
      for (uint32_t m : mismatched) a->culprit_waits[w].insert(m);
  }
  // A missing member does not wait in the frontier it never enqueued.
  in_collective->erase(std::remove_if(in_collective->begin(), in_collective->end(),
                                      [&](uint32_t x) {
                                        return std::find(r->missing.begin(), r->missing.end(), x) !=
                                               r->missing.end();
                                      }),
                       in_collective->end());
  for (uint32_t m : r->missing) {
    auto it = g.members.find(m);
    Blame(&a->missing, m, FrCulprit::Reason::kMissing, g, r->frontier, &it->second);
  }
}

// Point-to-point groups: a pending send or receive whose peer posted no counterpart waits for
// that peer; whether the peer is missing from it or blocked in a collective is decided once
// every group is analyzed (ResolveWaits).
void AnalyzeP2p(const Group& g, size_t report, Analysis* a, FrGroupReport* r) {
  for (const auto& [rank, m] : g.members) {
    const FrEntry* first = nullptr;
    for (const FrEntry* e : m.entries)
      if (IsP2p(*e) && Pending(*e)) {
        first = e;
        break;
      }
    if (!first) continue;
    const FrOp op = MakeOp(*first, g.ranks);
    // The frontier shown: the earliest operation (ResolveWaits prefers one whose peer is
    // missing).
    if (r->frontier.name.empty() || (r->missing.empty() && When(op) < When(r->frontier)))
      r->frontier = op;
    if (op.peer < 0) continue;
    const auto peer = static_cast<uint32_t>(op.peer);
    auto pit = g.members.find(peer);
    if (pit == g.members.end() || !pit->second.known) {
      r->no_dump.push_back(peer);
      continue;
    }
    const Member& pm = pit->second;
    const std::string_view want = op.name == "send" ? "recv" : "send";
    bool counterpart = false, peer_pending = false;
    for (const FrEntry* e : pm.entries) {
      if (!IsP2p(*e) || !Pending(*e)) continue;
      peer_pending = true;
      const OpName n = ParseOpName(e->profiling_name);
      const int64_t other_local = n.type == "send" ? n.dst : n.src;
      if (n.type == want && other_local >= 0 && static_cast<size_t>(other_local) < g.ranks.size() &&
          g.ranks[static_cast<size_t>(other_local)] == rank)
        counterpart = true;
    }
    if (counterpart) continue;
    if (pm.entries.empty() && !peer_pending && pm.has_status && pm.enqueued > pm.completed) {
      // An empty dump whose counters show work pending: it may be the counterpart.
      r->no_dump.push_back(peer);
      continue;
    }
    a->p2p.push_back(P2pWait{report, rank, peer, op, &g, &pm});
  }
}

}  // namespace
}  // namespace internal

using internal::Analysis;
using internal::AnalyzeCollectives;
using internal::AnalyzeP2p;
using internal::Built;
using internal::Group;
using internal::IsCoalescedMarker;
using internal::IsP2p;
using internal::MakeOp;
using internal::Member;
using internal::ParseOpName;
using internal::Pending;
using internal::Unique;
using internal::When;

namespace {

// Which ranks' dumps were read, empty, unreadable or missing.
void SortDumpsByState(const Built& b, uint32_t world, FrVerdict* v) {
  for (uint32_t r = 0; r < world; ++r) {
    switch (b.state[r]) {
      case DumpState::kRead: v->read.push_back(r); break;
      case DumpState::kEmpty: v->empty.push_back(r); break;
      case DumpState::kUnreadable: v->unreadable.push_back(r); break;
      case DumpState::kMissing: v->missing.push_back(r); break;
    }
  }
}

// Every group of two ranks or more, analysed on its own (its collectives, then its
// point-to-point operations): the groups with work pending go into the analysis with their
// reports, then who waits for whom across groups is resolved.
Analysis AnalyzeGroups(const Built& b, uint32_t world) {
  Analysis a;
  a.world = world;
  a.waits.assign(world, {});
  for (const Group& g : b.groups) {
    if (g.ranks.size() < 2) continue;
    FrGroupReport r;
    r.desc = g.desc;
    r.ranks = g.ranks;
    r.names.assign(g.names.begin(), g.names.end());
    for (const auto& [rank, m] : g.members)
      if (m.known) r.progress[rank] = {m.enqueued, m.completed};
    std::vector<uint32_t> in_collective;
    if (g.any_collective || (!g.any_p2p && !g.members.empty()))
      AnalyzeCollectives(g, &a, &r, &in_collective);
    if (g.any_p2p) AnalyzeP2p(g, a.reports.size(), &a, &r);
    Unique(&r.missing);
    Unique(&r.not_completing);
    Unique(&r.no_dump);
    const bool pending = !r.frontier.name.empty() || !r.not_completing.empty();
    if (!pending) continue;
    a.reports.push_back(std::move(r));
    a.in_collective.push_back(std::move(in_collective));
  }
  internal::ResolveWaits(&a);
  return a;
}

// The groups' reports, the ones that name ranks first, by when their frontier was created; at
// most `max`.
std::vector<FrGroupReport> OrderGroupReports(const std::vector<FrGroupReport>& reports,
                                             size_t max) {
  auto rank_of = [](const FrGroupReport& r) {
    switch (r.state) {
      case FrGroupReport::State::kMismatch:
      case FrGroupReport::State::kNotCompleting:
      case FrGroupReport::State::kMissing: return 0;
      case FrGroupReport::State::kUndecided: return 1;
      default: return 2;
    }
  };
  std::vector<FrGroupReport> groups = reports;
  std::stable_sort(groups.begin(), groups.end(),
                   [&](const FrGroupReport& x, const FrGroupReport& y) {
                     if (rank_of(x) != rank_of(y)) return rank_of(x) < rank_of(y);
                     // Collectives first: a rank missing from one is why its p2p peers wait.
                     if (x.frontier.p2p != y.frontier.p2p) return !x.frontier.p2p;
                     return When(x.frontier) < When(y.frontier);
                   });
  if (groups.size() > max) groups.resize(max);
  return groups;
}

// Per rank: its dump's state and error, and its last operation in each group, pending ones
// first.
std::vector<FrRankReport> ReportRanks(const std::vector<RankDump>& dumps, const Built& b,
                                      uint32_t world) {
  std::vector<FrRankReport> ranks(world);
  for (uint32_t r = 0; r < world; ++r) {
    ranks[r].rank = r;
    ranks[r].dump = b.state[r];
  }
  for (const RankDump& rd : dumps)
    if (rd.rank < world) ranks[rd.rank].error = rd.error;
  for (const Group& g : b.groups) {
    if (g.ranks.size() < 2) continue;
    for (const auto& [rank, m] : g.members) {
      if (m.entries.empty() || rank >= world) continue;
      const FrEntry* pick = nullptr;
      for (const FrEntry* e : m.entries)
        if (Pending(*e)) {
          pick = e;
          break;
        }
      if (!pick) pick = m.entries.back();
      FrRankReport::Last last;
      last.group_desc = g.desc;
      last.group_ranks = g.ranks;
      last.op = MakeOp(*pick, g.ranks);
      last.state = pick->state;
      ranks[rank].last.push_back(std::move(last));
    }
  }
  for (FrRankReport& rr : ranks)
    std::stable_sort(rr.last.begin(), rr.last.end(),
                     [](const FrRankReport::Last& x, const FrRankReport::Last& y) {
                       const bool px = x.state != FrState::kCompleted,
                                  py = y.state != FrState::kCompleted;
                       if (px != py) return px;
                       return When(x.op) < When(y.op);
                     });
  return ranks;
}

}  // namespace

FrVerdict AnalyzeFlightRecorder(const std::vector<RankDump>& dumps,
                                const FrAnalysisOptions& options) {
  FrVerdict v;
  const uint32_t world = std::min(
      options.world_size ? options.world_size : internal::InferWorld(dumps), kMaxWorldSize);
  v.world_size = world;
  const Built b = internal::BuildGroups(dumps, world);
  SortDumpsByState(b, world, &v);
  const Analysis a = AnalyzeGroups(b, world);
  v.hang_found = !a.reports.empty();
  v.groups = OrderGroupReports(a.reports, options.max_groups_reported);
  v.ranks = ReportRanks(dumps, b, world);
  // Who waits for whom, who holds the job, what is undecided, the summary.
  internal::NameCulprits(b, a, &v);
  return v;
}

// --- the whole history, matched --------------------------------------------------------------

std::vector<FrCollective> MatchCollectives(const std::vector<RankDump>& dumps) {
  const uint32_t world = std::min(internal::InferWorld(dumps), kMaxWorldSize);
  Built b = internal::BuildGroups(dumps, world);
  struct Unit {
    std::vector<const FrEntry*> ops;  // without the coalesced marker
    const FrEntry* marker = nullptr;
    const FrEntry* first = nullptr;
  };
  std::vector<std::pair<std::pair<int64_t, uint32_t>, FrCollective>> out;
  for (const Group& g : b.groups) {
    // Per member: its collectives by sequence id (entries sharing one are a coalesced group).
    std::map<uint32_t, std::map<int64_t, Unit>> units;
    std::map<uint32_t, std::pair<int64_t, int64_t>> window;  // first, last sequence id seen
    for (const auto& [rank, m] : g.members) {
      if (!m.known) continue;
      auto& mine = units[rank];
      for (const FrEntry* e : m.entries) {
        if (IsP2p(*e)) continue;
        Unit& u = mine[e->collective_seq_id];
        if (!u.first) u.first = e;
        if (IsCoalescedMarker(ParseOpName(e->profiling_name).type))
          u.marker = e;
        else
          u.ops.push_back(e);
        auto [it, fresh] = window.try_emplace(rank, e->collective_seq_id, e->collective_seq_id);
        if (!fresh) {
          it->second.first = std::min(it->second.first, e->collective_seq_id);
          it->second.second = std::max(it->second.second, e->collective_seq_id);
        }
      }
    }
    std::set<int64_t> seqs;
    for (const auto& [rank, mine] : units)
      for (const auto& [seq, u] : mine) seqs.insert(seq);
    for (int64_t seq : seqs) {
      FrCollective c;
      c.group_desc = g.desc;
      c.group_ranks = g.ranks;
      const Unit* ref = nullptr;
      uint32_t ref_rank = 0;
      for (const auto& [rank, mine] : units) {
        auto it = mine.find(seq);
        if (it != mine.end() && !ref) {
          ref = &it->second;
          ref_rank = rank;
        }
      }
      if (!ref) continue;
      c.coalesced = ref->ops.size() > 1 || ref->marker != nullptr;
      const FrEntry* shown = ref->marker && c.coalesced ? ref->marker : ref->first;
      for (uint32_t rank : g.ranks) {
        auto uit = units.find(rank);
        if (uit == units.end()) continue;  // no usable dump: nothing to say
        auto it = uit->second.find(seq);
        if (it == uit->second.end()) {
          const auto w = window.find(rank);
          // Evicted from its ring buffer, or never enqueued.
          if (w == window.end() || seq > w->second.second) c.missing.push_back(rank);
          continue;
        }
        if (rank == ref_rank) continue;
        const Unit& u = it->second;
        if (u.ops.size() != ref->ops.size()) {
          c.mismatches.push_back(FrMismatch{rank, MismatchKind::kSize,
                                            fmt::format("{} operations", ref->ops.size()),
                                            fmt::format("{} operations", u.ops.size())});
          if (!ref->ops.empty()) shown = ref->ops.front();
          continue;
        }
        for (size_t i = 0; i < u.ops.size(); ++i) {
          FrMismatch mm;
          if (!CompareOps(*ref->ops[i], *u.ops[i], g.ranks.size(), &mm)) {
            mm.rank = rank;
            c.mismatches.push_back(mm);
            shown = ref->ops[i];
            break;
          }
        }
      }
      c.pass = c.mismatches.empty();
      // PyTorch's choice: a coalesced group that matched everywhere shows its closing entry;
      // one with a rank missing shows its first operation.
      if (shown == ref->marker && !c.missing.empty() && !ref->ops.empty()) shown = ref->ops.front();
      c.op = MakeOp(*shown, g.ranks);
      out.push_back({{ref->first->record_id, ref_rank}, std::move(c)});
    }
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const auto& x, const auto& y) { return x.first < y.first; });
  std::vector<FrCollective> result;
  result.reserve(out.size());
  for (auto& [k, c] : out) result.push_back(std::move(c));
  return result;
}

}  // namespace rankwatch::fr
