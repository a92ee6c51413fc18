// Internals of the Flight Recorder analysis (fr_analysis.h), shared by its files and by nothing
// else:
//  - fr_ops.cc: operation names, PyTorch's rules comparing two records (CompareOps), FrOp;
//  - fr_groups.cc: process groups identified across ranks, each member's progress;
//  - fr_analysis.cc: each group's frontier (missing, not completing, mismatched members; point-
//    to-point operations without a counterpart), the verdict's groups and ranks, and the
//    history matched across members (MatchCollectives);
//  - fr_blame.cc: the wait-for graph: who waits for whom, who holds the job, what missing dumps
//    leave undecided, the summary.
//
// Pure functions over the dumps given; thread-compatible.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "flight_recorder/fr_analysis.h"

namespace rankwatch::fr::internal {

// --- operations (fr_ops.cc) -------------------------------------------------------------------

// "nccl:send 0->1" -> type "send", src 0, dst 1 (group-local ranks).
struct OpName {
  std::string_view type;
  int64_t src = -1;
  int64_t dst = -1;
};
OpName ParseOpName(std::string_view profiling_name);
bool IsCoalescedMarker(std::string_view type);
bool IsP2p(const FrEntry& e);
int64_t SeqOf(const FrEntry& e);  // collective_seq_id, or p2p_seq_id of a send/recv
inline bool Pending(const FrEntry& e) { return e.state != FrState::kCompleted; }
std::string Shapes(const std::vector<std::vector<int64_t>>& sizes);  // "[[8, 4]]"
std::string Dtypes(const std::vector<std::string>& d);               // distinct, sorted
FrOp MakeOp(const FrEntry& e, const std::vector<uint32_t>& group_ranks);
// An operation's time for ordering across ranks: its creation time (wall clock), else none.
int64_t When(const FrOp& op);

// --- groups across ranks (fr_groups.cc) -------------------------------------------------------

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

struct Built {
  std::deque<Group> groups;      // in the order the dumps name them
  std::vector<DumpState> state;  // by rank
};

Built BuildGroups(const std::vector<RankDump>& dumps, uint32_t world_size);
uint32_t InferWorld(const std::vector<RankDump>& dumps);
void Unique(std::vector<uint32_t>* v);  // sorted, without duplicates

// --- per group, then across groups ------------------------------------------------------------

// A point-to-point operation pending on `rank` whose peer posted no counterpart. Whether the
// peer is missing from it or blocked in a collective is decided once every group is analyzed.
struct P2pWait {
  size_t report = 0;  // index in Analysis::reports
  uint32_t rank = 0, peer = 0;
  FrOp op;
  const Group* group = nullptr;
  const Member* peer_member = nullptr;
};

struct Analysis {
  uint32_t world = 0;
  std::vector<std::set<uint32_t>> waits;  // rank -> ranks it waits for
  // rank -> culprits (mismatched, not completing) it waits for in a collective they hold: the
  // mismatch group's own waits and the waits of the collectives a culprit holds elsewhere. Kept
  // out of the cycle search (two members of a two-member mismatch wait for each other).
  std::map<uint32_t, std::set<uint32_t>> culprit_waits;
  std::map<uint32_t, FrCulprit> not_completing;
  std::map<uint32_t, FrCulprit> mismatched;
  // Per missing rank: where it is missing (the earliest frontier wins).
  std::map<uint32_t, FrCulprit> missing;
  std::vector<FrGroupReport> reports;
  // Parallel to `reports`: the members that wait in the group's pending collective (they
  // enqueued it, or a later one, and did not see it complete); empty for point-to-point only.
  std::vector<std::vector<uint32_t>> in_collective;
  std::vector<P2pWait> p2p;
};

// Records `rank` as a culprit of `reason` in `where` unless it already is for an earlier wait
// (a collective before a point-to-point operation, then the earliest created).
void Blame(std::map<uint32_t, FrCulprit>* where, uint32_t rank, FrCulprit::Reason reason,
           const Group& g, const FrOp& op, const Member* m);

// --- the wait-for graph (fr_blame.cc) ---------------------------------------------------------

// After every group's report: the waits that pass through other groups (the collectives a
// mismatched or not-completing rank holds; the peers of point-to-point operations blocked in a
// collective), then each group's state.
void ResolveWaits(Analysis* a);

// The ranks that hold the job (v->culprits), per rank what it waits for (v->ranks[].waits_for),
// what missing dumps leave undecided (v->undecided) and the summary. `v`'s dump lists, groups
// and ranks are filled.
void NameCulprits(const Built& b, const Analysis& a, FrVerdict* v);

}  // namespace rankwatch::fr::internal
