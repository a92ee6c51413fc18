#include "cli/diagnose_flight_recorder.h"

#include <cstdio>
#include <map>
#include <vector>

#include "common/rank_ranges.h"

namespace rankwatch {
namespace {

constexpr int kRanksShown = 16;  // per-rank tables printed; the rest with --json
constexpr int kGroupsShown = 8;  // pending groups printed

std::string DumpWord(v1::FlightRecorderDumpState s) {
  switch (s) {
    case v1::FR_DUMP_READ: return "read";
    case v1::FR_DUMP_EMPTY: return "empty";
    case v1::FR_DUMP_UNREADABLE: return "unreadable";
    case v1::FR_DUMP_MISSING: return "missing";
    default: return "?";
  }
}

std::string OpStateWord(v1::FlightRecorderOpState s) {
  switch (s) {
    case v1::FR_OP_SCHEDULED: return "scheduled";
    case v1::FR_OP_STARTED: return "started";
    case v1::FR_OP_COMPLETED: return "completed";
    default: return "state unknown";
  }
}

std::string List(const google::protobuf::RepeatedField<uint32_t>& ranks, uint32_t total = 0) {
  std::string out = FormatRankRanges(ranks);
  if (total > static_cast<uint32_t>(ranks.size())) {
    out += " and " + std::to_string(total - ranks.size()) + " more";
  }
  return out;
}

std::string Ranks(const google::protobuf::RepeatedField<uint32_t>& ranks, uint32_t total = 0) {
  return (ranks.size() == 1 && total <= 1 ? "rank " : "ranks ") + List(ranks, total);
}

std::string Group(const std::string& desc, uint32_t size) {
  return (desc.empty() ? std::string("(no description)") : desc) + " (" + std::to_string(size) +
         (size == 1 ? " rank)" : " ranks)");
}

std::string Dims(const v1::FlightRecorderShape& s) {
  std::string out = "[";
  for (int i = 0; i < s.dims_size(); ++i) out += (i ? ", " : "") + std::to_string(s.dims(i));
  return out + "]";
}

}  // namespace

std::string FlightRecorderOpText(const v1::FlightRecorderOp& op) {
  std::string out = op.name().empty() ? "(no operation)" : op.name();
  if (op.p2p() && op.peer() >= 0) out += " (peer " + std::to_string(op.peer()) + ")";
  if (op.seq() >= 0) out += " #" + std::to_string(op.seq());
  return out;
}

void PrintFlightRecorder(const v1::FlightRecorderVerdict& v, const v1::HangStacks& stacks) {
  if (v.dumps() == 0 && v.analyzed_unix_ns() == 0) return;
  std::printf(
      "\nFLIGHT RECORDER  %u of %u ranks' dumps (read %d, empty %d, unreadable %d, "
      "missing %d)\n",
      v.dumps(), v.world_size(), v.read_size(), v.empty_size(), v.unreadable_size(),
      v.missing_size());
  std::printf("           %s\n", v.summary().c_str());
  for (const v1::FlightRecorderCulprit& c : v.culprits()) {
    std::printf("           culprit: rank %u (%s) in %s: %s", c.rank(), c.reason().c_str(),
                Group(c.group_desc(), c.group_size()).c_str(),
                FlightRecorderOpText(c.op()).c_str());
    if (c.op().input_sizes_size() > 0) {
      std::printf(" %s", Dims(c.op().input_sizes(0)).c_str());
      if (c.op().input_dtypes_size() > 0) std::printf(" %s", c.op().input_dtypes(0).c_str());
    }
    std::printf("; its last enqueued #%lld, completed #%lld; %u ranks blocked",
                static_cast<long long>(c.rank_last_enqueued()),
                static_cast<long long>(c.rank_last_completed()), c.blocked());
    if (c.waiting_size() > 0) {
      std::printf(", waiting directly: %s", List(c.waiting(), 0).c_str());
    }
    std::printf(" (dump %s)\n", DumpWord(c.dump()).c_str());
  }
  for (int i = 0; i < v.groups_size() && i < kGroupsShown; ++i) {
    const v1::FlightRecorderGroupReport& g = v.groups(i);
    std::printf("           group %s: %s at %s", Group(g.desc(), g.size()).c_str(),
                g.state().c_str(), FlightRecorderOpText(g.frontier()).c_str());
    if (g.missing_size() > 0) std::printf("; missing %s", List(g.missing()).c_str());
    if (g.not_completing_size() > 0) {
      std::printf("; not completing %s", List(g.not_completing()).c_str());
    }
    for (const v1::FlightRecorderMismatch& m : g.mismatches()) {
      std::printf("; rank %u %s %s, expected %s", m.rank(), m.kind().c_str(), m.found().c_str(),
                  m.expected().c_str());
    }
    if (g.no_dump_size() > 0) std::printf("; no dump from %s", List(g.no_dump()).c_str());
    std::printf("\n");
  }
  if (v.groups_size() > kGroupsShown) {
    std::printf("           %d more groups with something pending\n",
                v.groups_size() - kGroupsShown);
  }
  for (const std::string& u : v.undecided()) std::printf("           undecided: %s\n", u.c_str());

  // One view per rank: where its training thread stands (hang stacks) and its last operation
  // in each of its groups (Flight Recorder).
  std::map<uint32_t, std::string> where;
  for (const v1::StackGroup& g : stacks.groups()) {
    for (uint32_t r : g.ranks()) where[r] = g.where();
  }
  int shown = 0;
  for (const v1::FlightRecorderRank& r : v.ranks()) {
    if (shown++ == kRanksShown) break;
    std::printf("           rank %u%s%s, dump %s", r.rank(), r.node().empty() ? "" : " on ",
                r.node().c_str(), DumpWord(r.dump()).c_str());
    if (r.waits_for_size() > 0) std::printf(", waits for %s", Ranks(r.waits_for()).c_str());
    std::printf("\n");
    if (auto w = where.find(r.rank()); w != where.end()) {
      std::printf("             stack  %s\n", w->second.c_str());
    }
    if (!r.error().empty()) std::printf("             error  %s\n", r.error().c_str());
    for (const v1::FlightRecorderLastOp& l : r.last()) {
      std::printf("             %-50s %-28s %s\n", Group(l.group_desc(), l.group_size()).c_str(),
                  FlightRecorderOpText(l.op()).c_str(), OpStateWord(l.state()).c_str());
    }
  }
  const int more = v.ranks_size() - kRanksShown + static_cast<int>(v.ranks_omitted());
  if (more > 0) std::printf("           %d more ranks: rankwatch diagnose --json\n", more);
}

}  // namespace rankwatch
