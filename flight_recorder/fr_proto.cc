#include "flight_recorder/fr_proto.h"

#include <algorithm>
#include <map>
#include <utility>
#include <vector>

namespace rankwatch::fr {
namespace {

// Length of the valid UTF-8 sequence at s[i], 0 when the bytes there are not one.
size_t Utf8Length(const std::string& s, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = byte(i);
  if (c < 0x80) return 1;
  size_t n = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // the range of the second byte
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    if (c == 0xE0) lo = 0xA0;  // overlong
    if (c == 0xED) hi = 0x9F;  // surrogates
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  if (i + n > s.size()) return 0;
  if (byte(i + 1) < lo || byte(i + 1) > hi) return 0;
  for (size_t k = 2; k < n; ++k) {
    if (byte(i + k) < 0x80 || byte(i + k) > 0xBF) return 0;
  }
  return n;
}

void SetShapes(const std::vector<std::vector<int64_t>>& shapes,
               google::protobuf::RepeatedPtrField<v1::FlightRecorderShape>* out) {
  for (const std::vector<int64_t>& shape : shapes) {
    out->Add()->mutable_dims()->Add(shape.begin(), shape.end());
  }
}

std::vector<std::vector<int64_t>> GetShapes(
    const google::protobuf::RepeatedPtrField<v1::FlightRecorderShape>& shapes) {
  std::vector<std::vector<int64_t>> out;
  out.reserve(shapes.size());
  for (const v1::FlightRecorderShape& s : shapes)
    out.emplace_back(s.dims().begin(), s.dims().end());
  return out;
}

void SetStrings(const std::vector<std::string>& in, size_t max_bytes,
                google::protobuf::RepeatedPtrField<std::string>* out) {
  for (const std::string& s : in) *out->Add() = WireString(s, max_bytes);
}

void SetFrames(const std::vector<FrFrame>& frames, size_t max_frames, size_t max_bytes,
               google::protobuf::RepeatedPtrField<v1::FlightRecorderFrame>* out) {
  const size_t n = std::min(frames.size(), max_frames);
  for (size_t i = 0; i < n; ++i) {
    v1::FlightRecorderFrame* f = out->Add();
    f->set_name(WireString(frames[i].name, max_bytes));
    f->set_filename(WireString(frames[i].filename, max_bytes));
    f->set_line(frames[i].line);
  }
}

std::vector<FrFrame> GetFrames(
    const google::protobuf::RepeatedPtrField<v1::FlightRecorderFrame>& frames) {
  std::vector<FrFrame> out;
  out.reserve(frames.size());
  for (const v1::FlightRecorderFrame& f : frames) out.push_back({f.name(), f.filename(), f.line()});
  return out;
}

void EntryToProto(const FrEntry& e, const FrTransportOptions& o, v1::FlightRecorderEntry* out) {
  const size_t m = o.max_string_bytes;
  out->set_record_id(e.record_id);
  out->set_pg_uid(e.pg_uid);
  out->set_pg_name(WireString(e.pg_name, m));
  out->set_pg_desc(WireString(e.pg_desc, m));
  out->set_collective_seq_id(e.collective_seq_id);
  out->set_p2p_seq_id(e.p2p_seq_id);
  out->set_op_id(e.op_id);
  out->set_profiling_name(WireString(e.profiling_name, m));
  SetShapes(e.input_sizes, out->mutable_input_sizes());
  SetShapes(e.output_sizes, out->mutable_output_sizes());
  SetStrings(e.input_dtypes, m, out->mutable_input_dtypes());
  SetStrings(e.output_dtypes, m, out->mutable_output_dtypes());
  out->set_state(OpStateToProto(e.state));
  out->set_time_created_ns(e.time_created_ns);
  out->set_time_started_ns(e.time_started_ns);
  out->set_time_completed_ns(e.time_completed_ns);
  out->set_timeout_ms(e.timeout_ms);
  out->set_is_p2p(e.is_p2p);
  out->set_retired(e.retired);
  SetFrames(e.frames, o.max_frames, m, out->mutable_frames());
  out->set_frames_omitted(static_cast<uint32_t>(e.frames.size() - out->frames_size()));
}

// The entries kept, most important first: the pending ones oldest first (the frontier is the
// oldest), then each group's last completed ones newest first.
std::vector<size_t> EntriesByPriority(const std::vector<FrEntry>& entries,
                                      const FrTransportOptions& o) {
  std::vector<size_t> pending, completed;
  std::map<std::pair<int64_t, std::string>, size_t> completed_of_group;
  for (size_t i = entries.size(); i-- > 0;) {
    const FrEntry& e = entries[i];
    if (e.state != FrState::kCompleted) {
      pending.push_back(i);
      continue;
    }
    auto key = e.pg_uid >= 0 ? std::make_pair(e.pg_uid, std::string())
                             : std::make_pair(int64_t{-1}, e.pg_name);
    if (completed_of_group[key]++ < o.completed_per_group) completed.push_back(i);
  }
  std::reverse(pending.begin(), pending.end());
  pending.insert(pending.end(), completed.begin(), completed.end());
  if (pending.size() > o.max_entries) pending.resize(o.max_entries);
  return pending;
}

// Frames, then entries, go until `out` serializes within max_bytes. `priority[i]` is the rank
// of out->entries(i) in importance (0 = most important).
void FitBytes(const FrTransportOptions& o, std::vector<size_t> priority,
              v1::FlightRecorderDump* out) {
  if (out->ByteSizeLong() <= o.max_bytes) return;
  auto strip_frames = [&](bool completed_only) {
    for (v1::FlightRecorderEntry& e : *out->mutable_entries()) {
      if (completed_only && e.state() != v1::FR_OP_COMPLETED) continue;
      e.set_frames_omitted(e.frames_omitted() + static_cast<uint32_t>(e.frames_size()));
      e.clear_frames();
    }
  };
  strip_frames(true);
  if (out->ByteSizeLong() <= o.max_bytes) return;
  strip_frames(false);
  size_t total = out->ByteSizeLong();
  if (total <= o.max_bytes) return;
  // Least important first: drop until the rest fits (each entry costs its size and a few
  // bytes of tag and length).
  std::vector<size_t> order(out->entries_size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return priority[a] > priority[b]; });
  std::vector<bool> drop(order.size(), false);
  for (size_t i : order) {
    if (total <= o.max_bytes) break;
    const size_t bytes = out->entries(static_cast<int>(i)).ByteSizeLong() + 6;
    total = bytes > total ? 0 : total - bytes;
    drop[i] = true;
  }
  google::protobuf::RepeatedPtrField<v1::FlightRecorderEntry> kept;
  uint32_t dropped = 0;
  for (size_t i = 0; i < drop.size(); ++i) {
    if (drop[i]) {
      ++dropped;
    } else {
      kept.Add()->Swap(out->mutable_entries(static_cast<int>(i)));
    }
  }
  out->mutable_entries()->Swap(&kept);
  out->set_entries_omitted(out->entries_omitted() + dropped);
}

void OpToProto(const FrOp& op, const FrVerdictProtoOptions& o, v1::FlightRecorderOp* out) {
  constexpr size_t kMaxString = 4096;
  out->set_name(WireString(op.name, kMaxString));
  out->set_p2p(op.p2p);
  out->set_seq(op.seq);
  out->set_peer(op.peer);
  SetShapes(op.input_sizes, out->mutable_input_sizes());
  SetStrings(op.input_dtypes, kMaxString, out->mutable_input_dtypes());
  out->set_record_id(op.record_id);
  out->set_time_created_ns(op.time_created_ns);
  SetFrames(op.frames, o.max_frames, kMaxString, out->mutable_frames());
}

void SetRanks(const std::vector<uint32_t>& ranks, size_t max,
              google::protobuf::RepeatedField<uint32_t>* out) {
  out->Add(ranks.begin(), ranks.begin() + static_cast<ptrdiff_t>(std::min(max, ranks.size())));
}

}  // namespace

std::string WireString(const std::string& s, size_t max_bytes) {
  std::string out;
  out.reserve(std::min(s.size(), max_bytes));
  for (size_t i = 0; i < s.size();) {
    const size_t n = Utf8Length(s, i);
    const size_t take = n == 0 ? 1 : n;
    if (out.size() + take > max_bytes) break;
    if (n == 0) {
      out.push_back('?');
    } else {
      out.append(s, i, n);
    }
    i += take;
  }
  return out;
}

v1::FlightRecorderDumpState DumpStateToProto(DumpState s) {
  switch (s) {
    case DumpState::kRead: return v1::FR_DUMP_READ;
    case DumpState::kEmpty: return v1::FR_DUMP_EMPTY;
    case DumpState::kUnreadable: return v1::FR_DUMP_UNREADABLE;
    case DumpState::kMissing: return v1::FR_DUMP_MISSING;
  }
  return v1::FR_DUMP_STATE_UNSPECIFIED;
}

v1::FlightRecorderOpState OpStateToProto(FrState s) {
  switch (s) {
    case FrState::kScheduled: return v1::FR_OP_SCHEDULED;
    case FrState::kStarted: return v1::FR_OP_STARTED;
    case FrState::kCompleted: return v1::FR_OP_COMPLETED;
    case FrState::kUnknown: return v1::FR_OP_STATE_UNKNOWN;
  }
  return v1::FR_OP_STATE_UNKNOWN;
}

FrState OpStateFromProto(v1::FlightRecorderOpState s) {
  switch (s) {
    case v1::FR_OP_SCHEDULED: return FrState::kScheduled;
    case v1::FR_OP_STARTED: return FrState::kStarted;
    case v1::FR_OP_COMPLETED: return FrState::kCompleted;
    default: return FrState::kUnknown;
  }
}

void DumpToProto(const FrDump& dump, const FrTransportOptions& o, v1::FlightRecorderDump* out) {
  out->Clear();
  const size_t m = o.max_string_bytes;
  out->set_state(dump.entries.empty() ? v1::FR_DUMP_EMPTY : v1::FR_DUMP_READ);
  out->set_version(WireString(dump.version, m));
  out->set_nccl_version(WireString(dump.nccl_version, m));
  out->set_dump_rank(dump.rank);
  for (const FrGroup& g : dump.groups) {
    v1::FlightRecorderGroup* pg = out->add_groups();
    pg->set_name(WireString(g.name, m));
    pg->set_desc(WireString(g.desc, m));
    pg->mutable_ranks()->Add(g.ranks.begin(), g.ranks.end());
  }
  for (const FrGroupStatus& s : dump.status) {
    v1::FlightRecorderGroupStatus* ps = out->add_status();
    ps->set_uid(WireString(s.uid, m));
    ps->set_last_enqueued(s.last_enqueued);
    ps->set_last_started(s.last_started);
    ps->set_last_completed(s.last_completed);
  }
  std::vector<size_t> by_priority = EntriesByPriority(dump.entries, o);
  // Record order on the wire; priority[i] of the i-th entry sent.
  std::vector<std::pair<size_t, size_t>> sent;  // (entry index, priority)
  sent.reserve(by_priority.size());
  for (size_t p = 0; p < by_priority.size(); ++p) sent.emplace_back(by_priority[p], p);
  std::sort(sent.begin(), sent.end());
  std::vector<size_t> priority;
  priority.reserve(sent.size());
  for (const auto& [index, p] : sent) {
    EntryToProto(dump.entries[index], o, out->add_entries());
    priority.push_back(p);
  }
  out->set_entries_omitted(static_cast<uint32_t>(dump.entries.size() - sent.size()));
  FitBytes(o, std::move(priority), out);
}

void UnreadableToProto(const std::string& error, const FrTransportOptions& o,
                       v1::FlightRecorderDump* out) {
  out->Clear();
  out->set_state(v1::FR_DUMP_UNREADABLE);
  out->set_error(WireString(error, o.max_string_bytes));
  out->set_dump_rank(-1);
}

FrDump DumpFromProto(const v1::FlightRecorderDump& in, FrRanksInterner* interner) {
  FrDump d;
  d.version = in.version();
  d.rank = in.dump_rank();
  d.nccl_version = in.nccl_version();
  d.groups.reserve(in.groups_size());
  for (const v1::FlightRecorderGroup& g : in.groups()) {
    std::vector<uint32_t> ranks(g.ranks().begin(), g.ranks().end());
    d.groups.push_back({g.name(), g.desc(),
                        interner ? interner->Get(std::move(ranks)) : FrRanks(std::move(ranks))});
  }
  d.status.reserve(in.status_size());
  for (const v1::FlightRecorderGroupStatus& s : in.status()) {
    d.status.push_back({s.uid(), s.last_enqueued(), s.last_started(), s.last_completed()});
  }
  d.entries.reserve(in.entries_size());
  for (const v1::FlightRecorderEntry& pe : in.entries()) {
    FrEntry& e = d.entries.emplace_back();
    e.record_id = pe.record_id();
    e.pg_uid = pe.pg_uid();
    e.pg_name = pe.pg_name();
    e.pg_desc = pe.pg_desc();
    e.collective_seq_id = pe.collective_seq_id();
    e.p2p_seq_id = pe.p2p_seq_id();
    e.op_id = pe.op_id();
    e.profiling_name = pe.profiling_name();
    e.input_sizes = GetShapes(pe.input_sizes());
    e.output_sizes = GetShapes(pe.output_sizes());
    e.input_dtypes.assign(pe.input_dtypes().begin(), pe.input_dtypes().end());
    e.output_dtypes.assign(pe.output_dtypes().begin(), pe.output_dtypes().end());
    e.state = OpStateFromProto(pe.state());
    e.time_created_ns = pe.time_created_ns();
    e.time_started_ns = pe.time_started_ns();
    e.time_completed_ns = pe.time_completed_ns();
    e.timeout_ms = pe.timeout_ms();
    e.is_p2p = pe.is_p2p();
    e.retired = pe.retired();
    e.frames = GetFrames(pe.frames());
  }
  return d;
}

RankDump RankDumpFromProto(const v1::FlightRecorderDump& in, FrRanksInterner* interner) {
  RankDump r;
  r.rank = in.rank();
  r.source = in.node().empty() ? in.source() : in.node() + ":" + in.source();
  switch (in.state()) {
    case v1::FR_DUMP_READ:
    case v1::FR_DUMP_EMPTY:
      r.dump = DumpFromProto(in, interner);
      r.state = r.dump.entries.empty() ? DumpState::kEmpty : DumpState::kRead;
      break;
    case v1::FR_DUMP_UNREADABLE:
      r.state = DumpState::kUnreadable;
      r.error = in.error();
      break;
    default: r.state = DumpState::kMissing; break;
  }
  return r;
}

void VerdictToProto(const FrVerdict& v, const FrVerdictProtoOptions& o,
                    v1::FlightRecorderVerdict* out, const std::vector<std::string>* rank_nodes) {
  out->Clear();
  out->set_world_size(v.world_size);
  out->mutable_read()->Add(v.read.begin(), v.read.end());
  out->mutable_empty()->Add(v.empty.begin(), v.empty.end());
  out->mutable_unreadable()->Add(v.unreadable.begin(), v.unreadable.end());
  out->mutable_missing()->Add(v.missing.begin(), v.missing.end());
  for (const FrCulprit& c : v.culprits) {
    v1::FlightRecorderCulprit* pc = out->add_culprits();
    pc->set_rank(c.rank);
    pc->set_reason(CulpritReasonName(c.reason));
    pc->set_group_desc(WireString(c.group_desc, 4096));
    SetRanks(c.group_ranks, o.max_listed, pc->mutable_group_ranks());
    pc->set_group_size(static_cast<uint32_t>(c.group_ranks.size()));
    OpToProto(c.op, o, pc->mutable_op());
    pc->set_rank_last_enqueued(c.rank_last_enqueued);
    pc->set_rank_last_completed(c.rank_last_completed);
    SetRanks(c.waiting, o.max_listed, pc->mutable_waiting());
    pc->set_blocked(c.blocked);
    pc->set_dump(DumpStateToProto(c.dump));
  }
  const size_t groups = std::min(v.groups.size(), o.max_groups);
  for (size_t i = 0; i < groups; ++i) {
    const FrGroupReport& g = v.groups[i];
    v1::FlightRecorderGroupReport* pg = out->add_groups();
    pg->set_desc(WireString(g.desc, 4096));
    SetRanks(g.ranks, o.max_listed, pg->mutable_ranks());
    pg->set_size(static_cast<uint32_t>(g.ranks.size()));
    SetStrings(g.names, 4096, pg->mutable_names());
    pg->set_state(GroupStateName(g.state));
    OpToProto(g.frontier, o, pg->mutable_frontier());
    pg->set_completed_everywhere(g.completed_everywhere);
    SetRanks(g.missing, o.max_ranks, pg->mutable_missing());
    SetRanks(g.not_completing, o.max_ranks, pg->mutable_not_completing());
    for (size_t k = 0; k < std::min(g.mismatches.size(), o.max_listed); ++k) {
      const FrMismatch& m = g.mismatches[k];
      v1::FlightRecorderMismatch* pm = pg->add_mismatches();
      pm->set_rank(m.rank);
      pm->set_kind(MismatchKindName(m.kind));
      pm->set_expected(WireString(m.expected, 4096));
      pm->set_found(WireString(m.found, 4096));
    }
    SetRanks(g.no_dump, o.max_listed, pg->mutable_no_dump());
  }
  // Per rank: the culprits, the ranks that wait for them, then every rank by number.
  std::vector<const FrRankReport*> by_rank(v.world_size, nullptr);
  for (const FrRankReport& r : v.ranks) {
    if (r.rank < by_rank.size()) by_rank[r.rank] = &r;
  }
  std::vector<uint32_t> order;
  std::vector<bool> listed(by_rank.size(), false);
  auto list = [&](uint32_t rank) {
    if (rank < by_rank.size() && by_rank[rank] != nullptr && !listed[rank]) {
      listed[rank] = true;
      order.push_back(rank);
    }
  };
  for (const FrCulprit& c : v.culprits) list(c.rank);
  for (const FrCulprit& c : v.culprits) {
    for (uint32_t w : c.waiting) list(w);
  }
  for (uint32_t r = 0; r < by_rank.size(); ++r) list(r);
  const size_t kept = std::min(order.size(), o.max_ranks);
  for (size_t i = 0; i < kept; ++i) {
    const FrRankReport& r = *by_rank[order[i]];
    v1::FlightRecorderRank* pr = out->add_ranks();
    pr->set_rank(r.rank);
    pr->set_dump(DumpStateToProto(r.dump));
    pr->set_error(WireString(r.error, 4096));
    for (const FrRankReport::Last& l : r.last) {
      v1::FlightRecorderLastOp* pl = pr->add_last();
      pl->set_group_desc(WireString(l.group_desc, 4096));
      pl->set_group_size(static_cast<uint32_t>(l.group_ranks.size()));
      OpToProto(l.op, o, pl->mutable_op());
      pl->set_state(OpStateToProto(l.state));
    }
    SetRanks(r.waits_for, o.max_listed, pr->mutable_waits_for());
    if (rank_nodes != nullptr && r.rank < rank_nodes->size()) {
      pr->set_node(WireString((*rank_nodes)[r.rank], 4096));
    }
  }
  out->set_ranks_omitted(static_cast<uint32_t>(order.size() - kept));
  SetStrings(v.undecided, 4096, out->mutable_undecided());
  out->set_summary(WireString(v.summary, 4096));
  out->set_hang_found(v.hang_found);
}

}  // namespace rankwatch::fr
