// Process groups across ranks: a rank names its groups locally, so groups are identified by
// their description and member ranks; each member's counters and entries (fr_analysis_internal.h).
#include <algorithm>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "flight_recorder/fr_analysis_internal.h"

namespace rankwatch::fr::internal {
namespace {

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

}  // namespace

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

}  // namespace rankwatch::fr::internal
