#include "flight_recorder/fr_report.h"

#include <fmt/format.h>

#include <algorithm>

namespace rankwatch::fr {
namespace {

std::string Str(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += fmt::format("\\u{:04x}", static_cast<int>(c));
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string Ranks(const std::vector<uint32_t>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) out += (i ? "," : "") + std::to_string(v[i]);
  return out + "]";
}

std::string Sizes(const std::vector<std::vector<int64_t>>& sizes) {
  std::string out = "[";
  for (size_t i = 0; i < sizes.size(); ++i) {
    out += i ? ",[" : "[";
    for (size_t j = 0; j < sizes[i].size(); ++j)
      out += (j ? "," : "") + std::to_string(sizes[i][j]);
    out += "]";
  }
  return out + "]";
}

std::string OpJson(const FrOp& op) {
  std::string dtypes = "[";
  for (size_t i = 0; i < op.input_dtypes.size(); ++i)
    dtypes += (i ? "," : "") + Str(op.input_dtypes[i]);
  dtypes += "]";
  std::string frames = "[";
  for (size_t i = 0; i < op.frames.size() && i < 8; ++i)
    frames += fmt::format("{}{{\"name\":{},\"file\":{},\"line\":{}}}", i ? "," : "",
                          Str(op.frames[i].name), Str(op.frames[i].filename), op.frames[i].line);
  frames += "]";
  return fmt::format(
      "{{\"name\":{},\"p2p\":{},\"seq\":{},\"peer\":{},\"input_sizes\":{},\"input_dtypes\":{},"
      "\"record_id\":{},\"time_created_ns\":{},\"frames\":{}}}",
      Str(op.name), op.p2p ? "true" : "false", op.seq, op.peer, Sizes(op.input_sizes), dtypes,
      op.record_id, op.time_created_ns, frames);
}

std::string Cut(const std::string& s, size_t n) {
  return s.size() <= n ? s : s.substr(0, n - 1) + "~";
}

}  // namespace

std::string OpText(const FrOp& op) {
  if (op.name.empty()) return "-";
  if (op.p2p)
    return fmt::format("{}{} #{}", op.name,
                       op.peer >= 0 ? fmt::format(" (peer {})", op.peer) : std::string(), op.seq);
  return fmt::format("{} #{}", op.name, op.seq);
}

std::string GroupText(const std::string& desc, const std::vector<uint32_t>& ranks) {
  return fmt::format("{} [{}]", desc.empty() ? "group" : desc, RankRanges(ranks));
}

std::string VerdictText(const FrVerdict& v, const ReportOptions& options) {
  std::string out = "verdict  " + v.summary + "\n";
  out += fmt::format("dumps    {} read, {} without entries{}, {} unreadable{}, {} missing{}\n",
                     v.read.size(), v.empty.size(),
                     v.empty.empty() ? "" : " (" + RankRanges(v.empty) + ")", v.unreadable.size(),
                     v.unreadable.empty() ? "" : " (" + RankRanges(v.unreadable) + ")",
                     v.missing.size(), v.missing.empty() ? "" : " (" + RankRanges(v.missing) + ")");
  if (!v.culprits.empty()) {
    out += "\nranks that hold the job\n";
    out += fmt::format("{:<6} {:<15} {:<48} {:<28} {:>9} {:>8}  {}\n", "rank", "why", "group",
                       "operation", "enq/done", "blocked", "waiting for it");
    for (const FrCulprit& c : v.culprits)
      out += fmt::format("{:<6} {:<15} {:<48} {:<28} {:>9} {:>8}  {}\n", c.rank,
                         CulpritReasonName(c.reason),
                         Cut(GroupText(c.group_desc, c.group_ranks), 48), Cut(OpText(c.op), 28),
                         fmt::format("{}/{}", c.rank_last_enqueued, c.rank_last_completed),
                         c.blocked, Cut(RankRanges(c.waiting), 40));
  }
  if (!v.groups.empty()) {
    out += "\npending groups (where the wait starts first)\n";
    out += fmt::format("{:<48} {:<15} {:<28} {}\n", "group", "state", "first pending", "ranks");
    size_t n = 0;
    for (const FrGroupReport& g : v.groups) {
      if (n++ == options.max_groups) {
        out += fmt::format("... and {} more\n", v.groups.size() - options.max_groups);
        break;
      }
      std::string who;
      if (!g.missing.empty()) who += "missing " + RankRanges(g.missing) + " ";
      if (!g.not_completing.empty()) who += "not completing " + RankRanges(g.not_completing) + " ";
      for (const FrMismatch& m : g.mismatches)
        who += fmt::format("rank {} {} {} vs {} ", m.rank, MismatchKindName(m.kind), m.found,
                           m.expected);
      if (!g.no_dump.empty()) who += "no dump " + RankRanges(g.no_dump) + " ";
      if (!g.held_by.empty()) who += "held by " + RankRanges(g.held_by) + " ";
      if (!g.blocked.empty()) who += "peer blocked in a collective " + RankRanges(g.blocked);
      out += fmt::format("{:<48} {:<15} {:<28} {}\n", Cut(GroupText(g.desc, g.ranks), 48),
                         GroupStateName(g.state), Cut(OpText(g.frontier), 28), who);
    }
  }
  if (!v.undecided.empty()) {
    out += "\nundecided\n";
    for (const std::string& u : v.undecided) out += "  " + u + "\n";
  }
  if (options.per_rank) {
    out += "\nper rank: dump, waits for, last operation per group (pending first)\n";
    for (const FrRankReport& r : v.ranks) {
      std::string last;
      for (size_t i = 0; i < r.last.size() && i < 4; ++i)
        last += fmt::format("{}{}: {} {}", i ? "; " : "", r.last[i].group_desc,
                            OpText(r.last[i].op), FrStateName(r.last[i].state));
      out += fmt::format("{:<6} {:<10} {:<12} {}\n", r.rank, DumpStateName(r.dump),
                         r.waits_for.empty() ? "-" : RankRanges(r.waits_for), last);
    }
  }
  return out;
}

std::string VerdictJson(const FrVerdict& v) {
  std::string culprits = "[";
  for (size_t i = 0; i < v.culprits.size(); ++i) {
    const FrCulprit& c = v.culprits[i];
    culprits += fmt::format(
        "{}{{\"rank\":{},\"reason\":{},\"group\":{},\"group_ranks\":{},\"op\":{},"
        "\"last_enqueued\":{},\"last_completed\":{},\"waiting\":{},\"blocked\":{},\"dump\":{}}}",
        i ? "," : "", c.rank, Str(CulpritReasonName(c.reason)), Str(c.group_desc),
        Ranks(c.group_ranks), OpJson(c.op), c.rank_last_enqueued, c.rank_last_completed,
        Ranks(c.waiting), c.blocked, Str(DumpStateName(c.dump)));
  }
  culprits += "]";
  std::string groups = "[";
  for (size_t i = 0; i < v.groups.size(); ++i) {
    const FrGroupReport& g = v.groups[i];
    std::string mism = "[";
    for (size_t j = 0; j < g.mismatches.size(); ++j)
      mism +=
          fmt::format("{}{{\"rank\":{},\"kind\":{},\"expected\":{},\"found\":{}}}", j ? "," : "",
                      g.mismatches[j].rank, Str(MismatchKindName(g.mismatches[j].kind)),
                      Str(g.mismatches[j].expected), Str(g.mismatches[j].found));
    mism += "]";
    std::string names = "[";
    for (size_t j = 0; j < g.names.size(); ++j) names += (j ? "," : "") + Str(g.names[j]);
    names += "]";
    groups += fmt::format(
        "{}{{\"group\":{},\"ranks\":{},\"names\":{},\"state\":{},\"frontier\":{},"
        "\"completed_everywhere\":{},\"missing\":{},\"not_completing\":{},\"mismatches\":{},"
        "\"no_dump\":{},\"held_by\":{},\"blocked\":{}}}",
        i ? "," : "", Str(g.desc), Ranks(g.ranks), names, Str(GroupStateName(g.state)),
        OpJson(g.frontier), g.completed_everywhere, Ranks(g.missing), Ranks(g.not_completing), mism,
        Ranks(g.no_dump), Ranks(g.held_by), Ranks(g.blocked));
  }
  groups += "]";
  std::string ranks = "[";
  for (size_t i = 0; i < v.ranks.size(); ++i) {
    const FrRankReport& r = v.ranks[i];
    std::string last = "[";
    for (size_t j = 0; j < r.last.size(); ++j)
      // The group's members only when few (a rank of a 16,384-rank job is in groups of all).
      last += fmt::format("{}{{\"group\":{},\"group_size\":{},{}\"op\":{},\"state\":{}}}",
                          j ? "," : "", Str(r.last[j].group_desc), r.last[j].group_ranks.size(),
                          r.last[j].group_ranks.size() <= 64
                              ? "\"group_ranks\":" + Ranks(r.last[j].group_ranks) + ","
                              : std::string(),
                          OpJson(r.last[j].op), Str(FrStateName(r.last[j].state)));
    last += "]";
    ranks += fmt::format("{}{{\"rank\":{},\"dump\":{},\"error\":{},\"waits_for\":{},\"last\":{}}}",
                         i ? "," : "", r.rank, Str(DumpStateName(r.dump)), Str(r.error),
                         Ranks(r.waits_for), last);
  }
  ranks += "]";
  std::string undecided = "[";
  for (size_t i = 0; i < v.undecided.size(); ++i) undecided += (i ? "," : "") + Str(v.undecided[i]);
  undecided += "]";
  return fmt::format(
      "{{\"world_size\":{},\"hang_found\":{},\"summary\":{},\"dumps\":{{\"read\":{},\"empty\":{},"
      "\"unreadable\":{},\"missing\":{}}},\"culprits\":{},\"groups\":{},\"undecided\":{},"
      "\"ranks\":{}}}\n",
      v.world_size, v.hang_found ? "true" : "false", Str(v.summary), Ranks(v.read), Ranks(v.empty),
      Ranks(v.unreadable), Ranks(v.missing), culprits, groups, undecided, ranks);
}

std::string CollectivesText(const std::vector<FrCollective>& collectives, size_t max) {
  size_t failed = 0, missing = 0;
  for (const FrCollective& c : collectives) {
    failed += c.pass ? 0 : 1;
    missing += c.missing.empty() ? 0 : 1;
  }
  std::string out = fmt::format(
      "collectives  {} matched across their groups: {} with members that disagree, {} with members "
      "that never recorded them\n",
      collectives.size(), failed, missing);
  out += fmt::format("{:<5} {:<48} {:<34} {:>9}  {}\n", "pass", "group", "collective", "record",
                     "members");
  std::vector<const FrCollective*> order;
  for (const FrCollective& c : collectives) order.push_back(&c);
  std::stable_sort(order.begin(), order.end(), [](const FrCollective* a, const FrCollective* b) {
    return (a->pass && a->missing.empty()) < (b->pass && b->missing.empty());
  });
  size_t n = 0;
  for (const FrCollective* c : order) {
    if (n++ == max) {
      out += fmt::format("... and {} more\n", order.size() - max);
      break;
    }
    std::string who;
    if (!c->missing.empty()) who += "missing " + RankRanges(c->missing) + " ";
    for (const FrMismatch& m : c->mismatches)
      who += fmt::format("rank {} {}: {} vs {} ", m.rank, MismatchKindName(m.kind), m.found,
                         m.expected);
    out += fmt::format("{:<5} {:<48} {:<34} {:>9}  {}\n", c->pass ? "yes" : "NO",
                       Cut(GroupText(c->group_desc, c->group_ranks), 48),
                       Cut(OpText(c->op) + (c->coalesced ? " (coalesced)" : ""), 34),
                       c->op.record_id, who.empty() ? "all" : who);
  }
  return out;
}

std::string CollectivesJson(const std::vector<FrCollective>& collectives) {
  std::string out = "[";
  for (size_t i = 0; i < collectives.size(); ++i) {
    const FrCollective& c = collectives[i];
    std::string mism = "[";
    for (size_t j = 0; j < c.mismatches.size(); ++j)
      mism +=
          fmt::format("{}{{\"rank\":{},\"kind\":{},\"expected\":{},\"found\":{}}}", j ? "," : "",
                      c.mismatches[j].rank, Str(MismatchKindName(c.mismatches[j].kind)),
                      Str(c.mismatches[j].expected), Str(c.mismatches[j].found));
    mism += "]";
    out += fmt::format(
        "{}{{\"group\":{},\"group_size\":{},\"op\":{},\"coalesced\":{},\"pass\":{},"
        "\"missing\":{},\"mismatches\":{}}}",
        i ? "," : "", Str(c.group_desc), c.group_ranks.size(), OpJson(c.op),
        c.coalesced ? "true" : "false", c.pass ? "true" : "false", Ranks(c.missing), mism);
  }
  return out + "]";
}

}  // namespace rankwatch::fr
