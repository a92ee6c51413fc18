#include "flight_recorder/fr_analysis.h"

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "flight_recorder/fr_report.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <deque>
#include <limits>
#include <map>
#include <set>
#include <string_view>
#include <unordered_map>
#include <utility>

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
  std::string out;
  for (size_t i = 0; i < sorted.size();) {
    size_t j = i;
    while (j + 1 < sorted.size() && sorted[j + 1] == sorted[j] + 1) ++j;
    if (!out.empty()) out += ",";
    out += std::to_string(sorted[i]);
    if (j > i) out += (j == i + 1 ? "," : "-") + std::to_string(sorted[j]);
    i = j + 1;
  }
  return out;
}

namespace {

// --- operation names ------------------------------------------------------------------------

// "nccl:send 0->1" -> type "send", src 0, dst 1 (group-local ranks).
struct OpName {
  std::string_view type;
  int64_t src = -1;
  int64_t dst = -1;
};

bool ParseInt(std::string_view s, int64_t* out) {
  while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
  while (!s.empty() && s.back() == ' ') s.remove_suffix(1);
  const auto r = std::from_chars(s.data(), s.data() + s.size(), *out);
  return r.ec == std::errc() && r.ptr == s.data() + s.size();
}

OpName ParseOpName(std::string_view profiling_name) {
  OpName n;
  const size_t colon = profiling_name.find(':');
  std::string_view name =
      colon == std::string_view::npos ? profiling_name : profiling_name.substr(colon + 1);
  const size_t space = name.find(' ');
  n.type = name.substr(0, space);
  if (space == std::string_view::npos) return n;
  const std::string_view meta = name.substr(space + 1);
  if (n.type == "send") {
    const size_t arrow = meta.find("->");
    if (arrow != std::string_view::npos) {
      ParseInt(meta.substr(0, arrow), &n.src);
      ParseInt(meta.substr(arrow + 2), &n.dst);
    }
  } else if (n.type == "recv") {
    const size_t arrow = meta.find("<-");
    if (arrow != std::string_view::npos) {
      ParseInt(meta.substr(0, arrow), &n.dst);
      ParseInt(meta.substr(arrow + 2), &n.src);
    }
  }
  return n;
}

bool IsCoalescedMarker(std::string_view type) {
  return type == "coalesced" || type == "ALLGATHER_coalesced" || type == "REDUCE_SCATTER_coalesced";
}

bool IsP2p(const FrEntry& e) {
  if (e.is_p2p) return true;
  const std::string_view t = ParseOpName(e.profiling_name).type;
  return t == "send" || t == "recv";
}

int64_t SeqOf(const FrEntry& e) { return IsP2p(e) ? e.p2p_seq_id : e.collective_seq_id; }

bool Pending(const FrEntry& e) { return e.state != FrState::kCompleted; }

// Elements of a shape; -1 when it overflows (sizes come from outside input).
int64_t Numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape)
    if (__builtin_mul_overflow(n, d, &n)) return -1;
  return n;
}

// x * n, or -1 on overflow.
int64_t Times(int64_t x, int64_t n) {
  int64_t out;
  return __builtin_mul_overflow(x, n, &out) ? -1 : out;
}

std::string Shapes(const std::vector<std::vector<int64_t>>& sizes) {
  std::string out = "[";
  for (size_t i = 0; i < sizes.size(); ++i) {
    out += i ? ", [" : "[";
    for (size_t j = 0; j < sizes[i].size(); ++j)
      out += (j ? ", " : "") + std::to_string(sizes[i][j]);
    out += "]";
  }
  return out + "]";
}

std::string Dtypes(const std::vector<std::string>& d) {
  std::set<std::string> s(d.begin(), d.end());
  std::string out;
  for (const auto& x : s) out += (out.empty() ? "" : ",") + x;
  return out;
}

bool HasData(const std::vector<std::vector<int64_t>>& sizes) {
  return !sizes.empty() && !sizes.front().empty();
}

}  // namespace

bool CompareOps(const FrEntry& a, const FrEntry& b, size_t group_size, FrMismatch* m) {
  const OpName na = ParseOpName(a.profiling_name), nb = ParseOpName(b.profiling_name);
  auto fail = [&](MismatchKind kind, std::string expected, std::string found) {
    if (m) *m = FrMismatch{0, kind, std::move(expected), std::move(found)};
    return false;
  };
  if (na.type != nb.type)
    return fail(MismatchKind::kOpType, std::string(na.type), std::string(nb.type));
  const std::string_view t = na.type;
  if (t == "send" || t == "recv" || IsCoalescedMarker(t)) return true;
  const bool all_to_all = t == "all_to_all";
  if (!all_to_all && t != "scatter" && a.input_sizes != b.input_sizes)
    return fail(MismatchKind::kSize, "input " + Shapes(a.input_sizes),
                "input " + Shapes(b.input_sizes));
  if (!all_to_all && t != "gather" && a.output_sizes != b.output_sizes)
    return fail(MismatchKind::kSize, "output " + Shapes(a.output_sizes),
                "output " + Shapes(b.output_sizes));
  if ((t == "all_reduce" || t == "allreduce_coalesced") && a.input_sizes != b.output_sizes)
    return fail(MismatchKind::kSize, "input " + Shapes(a.input_sizes) + " = output",
                "output " + Shapes(b.output_sizes));
  const auto gs = static_cast<int64_t>(group_size);
  if ((t == "all_gather" || t == "_all_gather_base" || t == "all_gather_into_tensor_coalesced") &&
      HasData(a.input_sizes) && HasData(b.output_sizes) &&
      Numel(b.output_sizes.front()) != Times(Numel(a.input_sizes.front()), gs))
    return fail(MismatchKind::kSize,
                fmt::format("output numel {} (input x {} ranks)",
                            Times(Numel(a.input_sizes.front()), gs), gs),
                fmt::format("output numel {}", Numel(b.output_sizes.front())));
  if ((t == "reduce_scatter" || t == "_reduce_scatter_base" ||
       t == "reduce_scatter_tensor_coalesced") &&
      HasData(a.output_sizes) && HasData(b.input_sizes) &&
      Numel(b.input_sizes.front()) != Times(Numel(a.output_sizes.front()), gs))
    return fail(MismatchKind::kSize,
                fmt::format("input numel {} (output x {} ranks)",
                            Times(Numel(a.output_sizes.front()), gs), gs),
                fmt::format("input numel {}", Numel(b.input_sizes.front())));
  // Dtypes: each side's inputs and outputs agree, and the two sides agree (where they hold data).
  const bool bcast = t == "broadcast" || t == "scatter";
  if (t != "gather" && !bcast && Dtypes(a.input_dtypes) != Dtypes(a.output_dtypes) &&
      HasData(a.input_sizes) && HasData(a.output_sizes))
    return fail(MismatchKind::kDtype, Dtypes(a.input_dtypes), Dtypes(a.output_dtypes));
  if (!bcast && Dtypes(a.input_dtypes) != Dtypes(b.input_dtypes) && HasData(a.input_sizes) &&
      HasData(b.input_sizes))
    return fail(MismatchKind::kDtype, Dtypes(a.input_dtypes), Dtypes(b.input_dtypes));
  if (t != "gather" && Dtypes(a.output_dtypes) != Dtypes(b.output_dtypes) &&
      HasData(a.output_sizes) && HasData(b.output_sizes))
    return fail(MismatchKind::kDtype, Dtypes(a.output_dtypes), Dtypes(b.output_dtypes));
  if (a.state != b.state)
    return fail(MismatchKind::kState, FrStateName(a.state), FrStateName(b.state));
  return true;
}

namespace {

// --- groups across ranks --------------------------------------------------------------------

struct Member {
  bool known = false;  // the rank has a usable dump that lists the group
  bool has_status = false;
  int64_t enqueued = -1, completed = -1;
  std::vector<const FrEntry*> entries;  // the rank's entries of the group, in record order
};

struct Group {
  std::string desc;
  FrRanks ranks;  // sorted
  std::set<std::string> names;
  std::map<uint32_t, Member> members;
  bool any_p2p = false, any_collective = false;
  bool inferred = false;  // not in pg_config: members are the ranks whose dumps name it
};

bool AllDigits(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// The local id -> name map of one dump: from its entries, completed by creation order when the
// names are numeric and as many as the ids (and the two agree on every id the entries show).
std::map<std::string, std::string> UidToName(const FrDump& d) {
  std::map<std::string, std::string> from_entries;
  for (const FrEntry& e : d.entries)
    if (e.pg_uid >= 0) from_entries[std::to_string(e.pg_uid)] = e.pg_name;
  std::vector<std::string> names, uids;
  for (const FrGroup& g : d.groups) names.push_back(g.name);
  for (const FrGroupStatus& s : d.status) uids.push_back(s.uid);
  const bool numeric = std::all_of(names.begin(), names.end(), AllDigits) &&
                       std::all_of(uids.begin(), uids.end(), AllDigits);
  if (!numeric || names.size() != uids.size()) return from_entries;
  auto by_value = [](const std::string& a, const std::string& b) {
    return a.size() != b.size() ? a.size() < b.size() : a < b;
  };
  std::sort(names.begin(), names.end(), by_value);
  std::sort(uids.begin(), uids.end(), by_value);
  std::map<std::string, std::string> zipped;
  for (size_t i = 0; i < uids.size(); ++i) zipped[uids[i]] = names[i];
  for (const auto& [uid, name] : from_entries) {
    auto it = zipped.find(uid);
    if (it == zipped.end() || it->second != name) return from_entries;
  }
  return zipped;
}

// One list per distinct set of ranks, sorted: groups are keyed by (description, list), and the
// lists dumps share (read through one FrRanksInterner) are sorted once.
class CanonicalRanks {
 public:
  const FrRanks& Get(const FrRanks& raw) {
    auto it = by_id_.find(raw.id());
    if (it != by_id_.end()) return it->second;
    std::vector<uint32_t> v = raw.vec();
    std::sort(v.begin(), v.end());
    v.erase(std::unique(v.begin(), v.end()), v.end());
    auto found = by_content_.find(v);
    if (found == by_content_.end()) {
      FrRanks canonical(v);
      found = by_content_.emplace(std::move(v), std::move(canonical)).first;
    }
    return by_id_.emplace(raw.id(), found->second).first->second;
  }

 private:
  absl::flat_hash_map<const void*, FrRanks> by_id_;
  absl::flat_hash_map<std::vector<uint32_t>, FrRanks> by_content_;
};

struct Built {
  std::deque<Group> groups;      // in the order the dumps name them
  std::vector<DumpState> state;  // by rank
};

Built BuildGroups(const std::vector<RankDump>& dumps, uint32_t world_size) {
  Built b;
  b.state.assign(world_size, DumpState::kMissing);
  CanonicalRanks canonical;
  absl::flat_hash_map<std::pair<std::string, const void*>, Group*> index;
  absl::flat_hash_map<std::string, Group*> inferred;  // groups without pg_config, by name
  for (const RankDump& rd : dumps) {
    if (rd.rank >= world_size) continue;
    b.state[rd.rank] = rd.state;
    if (rd.state != DumpState::kRead && rd.state != DumpState::kEmpty) continue;
    const FrDump& d = rd.dump;
    const auto uid_name = UidToName(d);
    std::map<std::string, const FrGroupStatus*> status_by_name;
    for (const FrGroupStatus& s : d.status) {
      auto it = uid_name.find(s.uid);
      if (it != uid_name.end()) status_by_name[it->second] = &s;
    }
    std::map<std::string, Group*> local;  // this rank's name -> group
    // This rank as a member of `grp` (named `name` here), with its counters when it has them.
    auto join = [&](Group& grp, const std::string& name) {
      Member& m = grp.members[rd.rank];
      m.known = true;
      auto st = status_by_name.find(name);
      if (st != status_by_name.end()) {
        m.has_status = true;
        m.enqueued = st->second->last_enqueued;
        m.completed = st->second->last_completed;
      }
    };
    for (const FrGroup& g : d.groups) {
      if (g.ranks.empty()) continue;  // gloo's placeholder (below)
      const FrRanks& ranks = canonical.Get(g.ranks);
      Group*& slot = index[{g.desc, ranks.id()}];
      if (slot == nullptr) {
        slot = &b.groups.emplace_back();
        slot->desc = g.desc;
        slot->ranks = ranks;
      }
      Group& grp = *slot;
      grp.names.insert(g.name);
      local[g.name] = &grp;
      if (!std::binary_search(ranks.begin(), ranks.end(), rd.rank)) continue;
      join(grp, g.name);
    }
    // Groups the entries name that pg_config does not describe: torch (2.13) records no
    // pg_config for gloo groups (one entry, name "" and no ranks, for all of them). Their names
    // are the job's (torch numbers groups in creation order, on every rank alike), so they are
    // matched across ranks by name; their members are the ranks whose dumps name them.
    for (const FrEntry& e : d.entries) {
      if (e.pg_name.empty() || local.count(e.pg_name)) continue;
      Group*& slot = inferred[e.pg_name];
      if (slot == nullptr) {
        slot = &b.groups.emplace_back();
        slot->desc = e.pg_desc;
        slot->inferred = true;
      }
      slot->names.insert(e.pg_name);
      local[e.pg_name] = slot;
      join(*slot, e.pg_name);
    }
    for (const FrEntry& e : d.entries) {
      auto it = local.find(e.pg_name);
      if (it == local.end()) continue;
      Group& grp = *it->second;
      auto mit = grp.members.find(rd.rank);
      if (mit == grp.members.end()) continue;
      mit->second.entries.push_back(&e);
      (IsP2p(e) ? grp.any_p2p : grp.any_collective) = true;
    }
  }
  for (Group& g : b.groups) {
    if (!g.inferred) continue;
    std::vector<uint32_t> ranks;
    for (const auto& [rank, m] : g.members) ranks.push_back(rank);  // sorted (a map)
    g.ranks = FrRanks(std::move(ranks));
  }
  // Progress from the entries where pg_status said nothing.
  for (Group& g : b.groups) {
    for (auto& [rank, m] : g.members) {
      if (m.has_status) continue;
      for (const FrEntry* e : m.entries) {
        if (IsP2p(*e) != (g.any_p2p && !g.any_collective)) continue;
        const int64_t s = SeqOf(*e);
        m.enqueued = std::max(m.enqueued, s);
        if (!Pending(*e)) m.completed = std::max(m.completed, s);
      }
    }
  }
  return b;
}

FrOp MakeOp(const FrEntry& e, const std::vector<uint32_t>& group_ranks) {
  FrOp op;
  const OpName n = ParseOpName(e.profiling_name);
  op.name = std::string(n.type);
  op.p2p = IsP2p(e);
  op.seq = SeqOf(e);
  if (op.p2p) {
    const int64_t peer_local = n.type == "send" ? n.dst : n.src;
    if (peer_local >= 0 && static_cast<size_t>(peer_local) < group_ranks.size())
      op.peer = group_ranks[static_cast<size_t>(peer_local)];
  }
  op.input_sizes = e.input_sizes;
  op.input_dtypes = e.input_dtypes;
  op.record_id = e.record_id;
  op.time_created_ns = e.time_created_ns;
  op.frames = e.frames;
  return op;
}

// An operation's time for ordering across ranks: its creation time (wall clock), else none.
int64_t When(const FrOp& op) {
  return op.time_created_ns >= 0 ? op.time_created_ns : std::numeric_limits<int64_t>::max();
}

// --- the analysis ---------------------------------------------------------------------------

struct Analysis {
  uint32_t world = 0;
  std::vector<std::set<uint32_t>> waits;  // rank -> ranks it waits for
  // rank -> mismatched ranks it waits for in a collective (kept out of the cycle search)
  std::map<uint32_t, std::set<uint32_t>> mismatch_waits;
  std::map<uint32_t, FrCulprit> not_completing;
  std::map<uint32_t, FrCulprit> mismatched;
  // Per missing rank: where it is missing (the earliest frontier wins).
  std::map<uint32_t, FrCulprit> missing;
  std::vector<FrGroupReport> reports;
};

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

// Collective groups: frontier, missing members, members not completing, mismatches.
void AnalyzeCollectives(const Group& g, Analysis* a, FrGroupReport* r) {
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
      for (uint32_t m : mismatched) a->mismatch_waits[w].insert(m);
  }
  for (uint32_t m : r->missing) {
    auto it = g.members.find(m);
    Blame(&a->missing, m, FrCulprit::Reason::kMissing, g, r->frontier, &it->second);
  }
}

// Point-to-point groups: a pending send or receive whose peer posted no counterpart.
void AnalyzeP2p(const Group& g, Analysis* a, FrGroupReport* r) {
  for (const auto& [rank, m] : g.members) {
    const FrEntry* first = nullptr;
    for (const FrEntry* e : m.entries)
      if (IsP2p(*e) && Pending(*e)) {
        first = e;
        break;
      }
    if (!first) continue;
    const FrOp op = MakeOp(*first, g.ranks);
    // The frontier shown: the earliest operation whose peer is missing, else the earliest.
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
    if (r->missing.empty() || When(op) < When(r->frontier)) r->frontier = op;
    r->missing.push_back(peer);
    a->waits[rank].insert(peer);
    Blame(&a->missing, peer, FrCulprit::Reason::kMissing, g, op, &pm);
  }
}

void Unique(std::vector<uint32_t>* v) {
  std::sort(v->begin(), v->end());
  v->erase(std::unique(v->begin(), v->end()), v->end());
}

uint32_t InferWorld(const std::vector<RankDump>& dumps) {
  uint32_t world = 0;
  absl::flat_hash_set<const void*> seen;  // shared rank lists are looked at once
  for (const RankDump& rd : dumps) {
    world = std::max(world, rd.rank + 1);
    for (const FrGroup& g : rd.dump.groups)
      if (g.ranks.id() == nullptr || seen.insert(g.ranks.id()).second)
        for (uint32_t r : g.ranks) world = std::max(world, r + 1);
  }
  return world;
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

FrVerdict AnalyzeFlightRecorder(const std::vector<RankDump>& dumps,
                                const FrAnalysisOptions& options) {
  FrVerdict v;
  const uint32_t world =
      std::min(options.world_size ? options.world_size : InferWorld(dumps), kMaxWorldSize);
  v.world_size = world;
  Built b = BuildGroups(dumps, world);
  for (uint32_t r = 0; r < world; ++r) {
    switch (b.state[r]) {
      case DumpState::kRead: v.read.push_back(r); break;
      case DumpState::kEmpty: v.empty.push_back(r); break;
      case DumpState::kUnreadable: v.unreadable.push_back(r); break;
      case DumpState::kMissing: v.missing.push_back(r); break;
    }
  }
  Analysis a;
  a.waits.assign(world, {});
  for (Group& g : b.groups) {
    if (g.ranks.size() < 2) continue;
    FrGroupReport r;
    r.desc = g.desc;
    r.ranks = g.ranks;
    r.names.assign(g.names.begin(), g.names.end());
    for (const auto& [rank, m] : g.members)
      if (m.known) r.progress[rank] = {m.enqueued, m.completed};
    if (g.any_collective || (!g.any_p2p && !g.members.empty())) AnalyzeCollectives(g, &a, &r);
    if (g.any_p2p) AnalyzeP2p(g, &a, &r);
    Unique(&r.missing);
    Unique(&r.not_completing);
    Unique(&r.no_dump);
    const bool pending = !r.frontier.name.empty() || !r.not_completing.empty();
    if (!pending) continue;
    v.hang_found = true;
    if (!r.mismatches.empty())
      r.state = FrGroupReport::State::kMismatch;
    else if (!r.not_completing.empty())
      r.state = FrGroupReport::State::kNotCompleting;
    else if (!r.missing.empty())
      r.state = FrGroupReport::State::kMissing;
    else if (!r.no_dump.empty())
      r.state = FrGroupReport::State::kUndecided;
    else
      r.state = FrGroupReport::State::kWaiting;
    a.reports.push_back(std::move(r));
  }

  // Who waits for whom: sinks of the wait-for graph hold the job.
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
  for (const auto& [r, ms] : a.mismatch_waits)
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
  for (auto& [rank, c] : a.mismatched) culprits.emplace(rank, c);
  for (uint32_t r = 0; r < world; ++r) {
    const auto c = static_cast<size_t>(comp[r]);
    if (comp_leaves[c]) continue;  // waits for someone outside its component
    const bool cycle = comp_size[c] > 1;
    if (!cycle && !comp_entered[c]) continue;  // nobody waits for it
    if (culprits.count(r)) continue;
    if (a.mismatch_waits.count(r)) continue;  // waits for a mismatched rank, named above
    FrCulprit cu;
    auto it = a.missing.find(r);
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
    v.culprits.push_back(c);
  }
  std::stable_sort(v.culprits.begin(), v.culprits.end(),
                   [](const FrCulprit& x, const FrCulprit& y) {
                     if (x.blocked != y.blocked) return x.blocked > y.blocked;
                     return x.rank < y.rank;
                   });

  // Groups: the ones that name ranks first, by when their frontier was created.
  auto rank_of = [](const FrGroupReport& r) {
    switch (r.state) {
      case FrGroupReport::State::kMismatch:
      case FrGroupReport::State::kNotCompleting:
      case FrGroupReport::State::kMissing: return 0;
      case FrGroupReport::State::kUndecided: return 1;
      default: return 2;
    }
  };
  std::stable_sort(a.reports.begin(), a.reports.end(),
                   [&](const FrGroupReport& x, const FrGroupReport& y) {
                     if (rank_of(x) != rank_of(y)) return rank_of(x) < rank_of(y);
                     // Collectives first: a rank missing from one is why its p2p peers wait.
                     if (x.frontier.p2p != y.frontier.p2p) return !x.frontier.p2p;
                     return When(x.frontier) < When(y.frontier);
                   });
  if (a.reports.size() > options.max_groups_reported) a.reports.resize(options.max_groups_reported);
  v.groups = std::move(a.reports);

  // Per rank: its last operation per group, pending first.
  v.ranks.resize(world);
  for (uint32_t r = 0; r < world; ++r) {
    v.ranks[r].rank = r;
    v.ranks[r].dump = b.state[r];
    std::set<uint32_t> waits_for = a.waits[r];
    auto mw = a.mismatch_waits.find(r);
    if (mw != a.mismatch_waits.end()) waits_for.insert(mw->second.begin(), mw->second.end());
    v.ranks[r].waits_for.assign(waits_for.begin(), waits_for.end());
  }
  for (const RankDump& rd : dumps)
    if (rd.rank < world) v.ranks[rd.rank].error = rd.error;
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
      v.ranks[rank].last.push_back(std::move(last));
    }
  }
  for (FrRankReport& rr : v.ranks)
    std::stable_sort(rr.last.begin(), rr.last.end(),
                     [](const FrRankReport::Last& x, const FrRankReport::Last& y) {
                       const bool px = x.state != FrState::kCompleted,
                                  py = y.state != FrState::kCompleted;
                       if (px != py) return px;
                       return When(x.op) < When(y.op);
                     });

  // What missing dumps leave open.
  std::vector<uint32_t> no_dump = v.missing;
  no_dump.insert(no_dump.end(), v.unreadable.begin(), v.unreadable.end());
  Unique(&no_dump);
  for (const FrGroupReport& r : v.groups) {
    if (r.no_dump.empty()) continue;
    std::vector<uint32_t> open;
    for (uint32_t x : r.no_dump) open.push_back(x);
    v.undecided.push_back(
        fmt::format("{}: {} pending; {} left no usable record of the group, so whether {} reached "
                    "it is unknown",
                    GroupText(r.desc, r.ranks), OpText(r.frontier), RankRanges(open),
                    open.size() == 1 ? "it" : "they"));
  }
  if (v.hang_found && v.culprits.empty() && v.undecided.empty())
    v.undecided.push_back(
        "every member of each pending group enqueued its operation and saw the same completions: "
        "the wait is inside NCCL or the network, or the dumps were written before the hang");

  // Summary.
  std::string dumps_text =
      fmt::format("{} of {} dumps read", v.read.size() + v.empty.size(), world);
  if (!v.empty.empty()) dumps_text += fmt::format(" ({} without entries)", v.empty.size());
  if (!no_dump.empty())
    dumps_text += fmt::format("; none usable from ranks {}", RankRanges(no_dump));
  if (!v.hang_found) {
    v.summary = "nothing pending in any group: no hang in these dumps; " + dumps_text;
  } else if (v.culprits.empty()) {
    v.summary = "no rank named: " + (v.undecided.empty() ? std::string() : v.undecided.front()) +
                "; " + dumps_text;
  } else {
    std::map<std::string, std::vector<uint32_t>> by_where;
    std::vector<std::string> order;
    for (const FrCulprit& c : v.culprits) {
      const std::string where = fmt::format("{} in {} {}", CulpritReasonName(c.reason),
                                            GroupText(c.group_desc, c.group_ranks), OpText(c.op));
      if (!by_where.count(where)) order.push_back(where);
      by_where[where].push_back(c.rank);
    }
    std::vector<uint32_t> all;
    uint32_t blocked = 0;
    for (const FrCulprit& c : v.culprits) {
      all.push_back(c.rank);
      blocked = std::max(blocked, c.blocked);
    }
    Unique(&all);
    std::string parts;
    for (const std::string& w : order) {
      std::vector<uint32_t> rs = by_where[w];
      Unique(&rs);
      parts += fmt::format("{}{} {}", parts.empty() ? "" : "; ", RankRanges(rs), w);
    }
    v.summary =
        fmt::format("{} {} the job ({}); {}", all.size() == 1 ? "rank" : "ranks",
                    RankRanges(all) + (all.size() == 1 ? " holds" : " hold"), parts, dumps_text);
  }
  return v;
}

// --- the whole history, matched --------------------------------------------------------------

std::vector<FrCollective> MatchCollectives(const std::vector<RankDump>& dumps) {
  const uint32_t world = std::min(InferWorld(dumps), kMaxWorldSize);
  Built b = BuildGroups(dumps, world);
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
