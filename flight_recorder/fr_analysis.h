// Flight Recorder analysis: why a hung job hangs, from every rank's Flight Recorder dump.
//
// Steps (docs/flight-recorder.md has the rules and their evidence):
//  1. Groups: each rank's pg_config names its groups locally; groups are identified across
//     ranks by their member ranks and description. A rank's pg_status is keyed by the group's
//     local id (uid): the id is mapped to a name from the rank's entries, and for the groups a
//     rank has no entry of (an empty dump), by creation order when the names are the default
//     numeric ones (names and ids both grow with creation; checked against the entries).
//  2. Per group, each member's progress: the last collective (or point-to-point operation) it
//     enqueued and completed, from pg_status, else from its entries.
//  3. Collectives are matched across members by sequence id (a coalesced group is one
//     collective: its entries share the id and end with a "*coalesced" entry), and compared:
//     operation, sizes (all_to_all and scatter/gather as PyTorch's analyzer allows), dtypes.
//  4. The frontier of each group: the first collective some member has not completed. Members
//     that never enqueued it are *missing*; a member whose peers completed collectives it has
//     not is *not completing* (its device stopped reporting completions: a GPU error or a stuck
//     stream; NCCL completes a collective on every member or on none); members whose record
//     differs from the majority's are *mismatched*. A point-to-point operation pending on one
//     side with no counterpart on the peer waits for the peer: the peer is missing from it,
//     unless it waits in a collective itself (then it is *blocked* there).
//  5. Wait-for graph: a rank with a pending operation waits for the missing, not-completing and
//     mismatched members of it, and for the members that *hold* it: a mismatched or
//     not-completing rank's stream is stuck, so a collective every member enqueued and that
//     rank has pending cannot complete. The ranks that hold the job are the mismatched and
//     not-completing ranks, and the ranks others wait for that wait for nobody and are missing
//     from something (sinks; a cycle of waits is reported as a cycle). Each is reported with
//     the group and operation where the wait starts (a collective it is missing from before a
//     point-to-point operation, then the earliest created), the ranks that wait for it
//     directly and how many wait for it in all.
//  6. Missing and empty dumps: a rank with no dump cannot be judged; groups whose frontier
//     depends on it are undecided, and the verdict says so. Waiting on an undecided group
//     blames no one: neither the ranks that wait in it (nor those that wait for them) nor the
//     rank without a dump are named.
//
// Pure functions; thread-compatible.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "flight_recorder/fr_dump.h"

namespace rankwatch::fr {

// One rank's dump as found: read, empty (no entries: its Python threads may have been stuck;
// its pg_status still counts), unreadable (with the reader's error) or missing.
enum class DumpState : uint8_t { kRead, kEmpty, kUnreadable, kMissing };
const char* DumpStateName(DumpState s);

struct RankDump {
  uint32_t rank = 0;
  DumpState state = DumpState::kMissing;
  FrDump dump;         // kRead, kEmpty
  std::string error;   // kUnreadable
  std::string source;  // file name or node it came from (for messages)
};

// The largest job analyzed (the wire's limit too); ranks beyond it are left out.
inline constexpr uint32_t kMaxWorldSize = uint32_t{1} << 20;

struct FrAnalysisOptions {
  // World size; 0: the largest rank seen in any dump's groups + 1. At most kMaxWorldSize.
  uint32_t world_size = 0;
  size_t max_groups_reported = 64;  // pending groups listed in the verdict
};

// One operation as reported.
struct FrOp {
  std::string name;  // "all_to_all", "send", "coalesced(all_reduce x3)", ...
  bool p2p = false;
  int64_t seq = -1;   // collective_seq_id, or p2p_seq_id for point-to-point operations
  int64_t peer = -1;  // point-to-point: the peer's global rank
  std::vector<std::vector<int64_t>> input_sizes;
  std::vector<std::string> input_dtypes;
  int64_t record_id = -1;
  int64_t time_created_ns = -1;
  std::vector<FrFrame> frames;
};

enum class MismatchKind : uint8_t { kOpType, kSize, kDtype, kState };
const char* MismatchKindName(MismatchKind k);

struct FrMismatch {
  uint32_t rank = 0;  // the member that differs from the group's majority (or from the first)
  MismatchKind kind = MismatchKind::kOpType;
  std::string expected;
  std::string found;
};

// One process group, identified across ranks.
struct FrGroupReport {
  std::string desc;
  FrRanks ranks;                   // sorted
  std::vector<std::string> names;  // the local names the members use (distinct)
  enum class State : uint8_t {
    kIdle,           // nothing pending on any member
    kWaiting,        // every member enqueued the frontier; none completed it
    kMissing,        // some members never enqueued the frontier
    kNotCompleting,  // some members did not see collectives their peers completed
    kMismatch,       // members enqueued different operations at the same sequence id
    kUndecided,      // depends on members without a dump
  };
  State state = State::kIdle;
  FrOp frontier;                      // the first operation not completed everywhere
  int64_t completed_everywhere = -1;  // the last sequence id every member completed
  std::vector<uint32_t> missing;
  std::vector<uint32_t> not_completing;
  std::vector<FrMismatch> mismatches;
  std::vector<uint32_t> no_dump;  // members without a usable dump
  // kWaiting, kUndecided: members that are culprits elsewhere (mismatched or not completing)
  // and have the frontier pending: their stream is stuck, so they hold it; the others wait for
  // them.
  std::vector<uint32_t> held_by;
  // Point-to-point: peers that posted no counterpart while they wait in a collective (they
  // are blocked there, not missing; the rank that waits for them waits for what holds them).
  std::vector<uint32_t> blocked;
  // Per member: last enqueued and completed sequence id (-1 unknown).
  std::map<uint32_t, std::pair<int64_t, int64_t>> progress;
};
const char* GroupStateName(FrGroupReport::State s);

struct FrCulprit {
  uint32_t rank = 0;
  enum class Reason : uint8_t {
    kMissing,        // never enqueued an operation its peers wait in
    kNotCompleting,  // its peers completed collectives it never saw complete
    kMismatch,       // enqueued a different operation from its peers
    kCycle,          // waits in a cycle of ranks that wait for each other
    kNoDump,         // others wait for it and it left no usable dump
  };
  Reason reason = Reason::kMissing;
  std::string group_desc;  // where the wait starts
  FrRanks group_ranks;
  FrOp op;                          // the operation the others wait in
  int64_t rank_last_enqueued = -1;  // the culprit's own progress in that group
  int64_t rank_last_completed = -1;
  std::vector<uint32_t> waiting;  // ranks that wait for it directly
  uint32_t blocked = 0;           // ranks that wait for it, directly or not
  DumpState dump = DumpState::kRead;
};
const char* CulpritReasonName(FrCulprit::Reason r);

// Per rank: what its dump says (one view with the stacks the daemon has).
struct FrRankReport {
  uint32_t rank = 0;
  DumpState dump = DumpState::kMissing;
  std::string error;
  // Its last operation per group it belongs to: group description, op, its state.
  struct Last {
    std::string group_desc;
    FrRanks group_ranks;
    FrOp op;
    FrState state = FrState::kUnknown;
  };
  std::vector<Last> last;           // groups with a pending operation first
  std::vector<uint32_t> waits_for;  // ranks it waits for directly
};

struct FrVerdict {
  uint32_t world_size = 0;
  std::vector<uint32_t> read, empty, unreadable, missing;  // dumps by state
  std::vector<FrCulprit> culprits;     // the ranks that hold the job, most blocking first
  std::vector<FrGroupReport> groups;   // groups with something pending, wait's start first
  std::vector<FrRankReport> ranks;     // every rank 0..world_size-1
  std::vector<std::string> undecided;  // what missing dumps leave open, one line each
  std::string summary;                 // one line
  bool hang_found = false;             // some operation is pending somewhere
};

FrVerdict AnalyzeFlightRecorder(const std::vector<RankDump>& dumps,
                                const FrAnalysisOptions& options = {});

// Every collective matched across a group's members (step 3), for the dumps' whole history:
// PyTorch's fr_trace "collectives" table. A collective passes when every member recorded it
// and they agree.
struct FrCollective {
  std::string group_desc;
  FrRanks group_ranks;
  FrOp op;  // as the lowest member recorded it
  bool pass = true;
  std::vector<uint32_t> missing;  // members with no record of it
  std::vector<FrMismatch> mismatches;
  bool coalesced = false;
};
std::vector<FrCollective> MatchCollectives(const std::vector<RankDump>& dumps);

// Compares one operation of two members of a group of `group_size` (PyTorch's rules: sizes of
// all_to_all are not compared per rank, scatter's inputs and gather's outputs may differ,
// all_gather output = input x group size, reduce_scatter input = output x group size). Returns
// false and fills `m` (rank left 0) on a mismatch.
bool CompareOps(const FrEntry& a, const FrEntry& b, size_t group_size, FrMismatch* m);

// "0-3,5,7,8" for sorted ranks: the reports' compact style of FormatRankRanges
// (common/rank_ranges.h), a run from three ranks on.
std::string RankRanges(const std::vector<uint32_t>& sorted);

}  // namespace rankwatch::fr
