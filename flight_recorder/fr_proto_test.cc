#include "flight_recorder/fr_proto.h"

#include <gtest/gtest.h>

#include "flight_recorder/fr_test_dumps.h"

namespace rankwatch::fr {
namespace {

using testing::DumpBuilder;

void ExpectSameEntry(const FrEntry& a, const FrEntry& b) {
  EXPECT_EQ(a.record_id, b.record_id);
  EXPECT_EQ(a.pg_uid, b.pg_uid);
  EXPECT_EQ(a.pg_name, b.pg_name);
  EXPECT_EQ(a.pg_desc, b.pg_desc);
  EXPECT_EQ(a.collective_seq_id, b.collective_seq_id);
  EXPECT_EQ(a.p2p_seq_id, b.p2p_seq_id);
  EXPECT_EQ(a.op_id, b.op_id);
  EXPECT_EQ(a.profiling_name, b.profiling_name);
  EXPECT_EQ(a.input_sizes, b.input_sizes);
  EXPECT_EQ(a.output_sizes, b.output_sizes);
  EXPECT_EQ(a.input_dtypes, b.input_dtypes);
  EXPECT_EQ(a.output_dtypes, b.output_dtypes);
  EXPECT_EQ(a.state, b.state);
  EXPECT_EQ(a.time_created_ns, b.time_created_ns);
  EXPECT_EQ(a.time_started_ns, b.time_started_ns);
  EXPECT_EQ(a.time_completed_ns, b.time_completed_ns);
  EXPECT_EQ(a.timeout_ms, b.timeout_ms);
  EXPECT_EQ(a.is_p2p, b.is_p2p);
  EXPECT_EQ(a.retired, b.retired);
  ASSERT_EQ(a.frames.size(), b.frames.size());
  for (size_t i = 0; i < a.frames.size(); ++i) {
    EXPECT_EQ(a.frames[i].name, b.frames[i].name);
    EXPECT_EQ(a.frames[i].filename, b.frames[i].filename);
    EXPECT_EQ(a.frames[i].line, b.frames[i].line);
  }
}

// Survives the wire (serialized and parsed) into `out`.
v1::FlightRecorderDump OverTheWire(const v1::FlightRecorderDump& d) {
  v1::FlightRecorderDump out;
  EXPECT_TRUE(out.ParseFromString(d.SerializeAsString()));
  return out;
}

TEST(FrProto, RoundTripKeepsEveryFieldWhenNothingIsTrimmed) {
  DumpBuilder b(2);
  b.Group("0", "default_pg", {0, 1, 2, 3}).Group("7", "PIPELINE_MODEL_PARALLEL_GROUP", {2, 3});
  b.Ops(0, 1, 3, FrState::kCompleted).Ops(1, 1, 1, FrState::kScheduled, "nccl:send 2->3");
  FrDump dump = b.Build();
  dump.entries.back().is_p2p = true;
  dump.entries.back().p2p_seq_id = 1;
  dump.entries.back().collective_seq_id = 0;
  dump.entries.back().input_sizes = {{2, 3, 4}, {}, {7}};
  dump.entries.back().time_started_ns = -1;
  dump.entries[0].pg_uid = -1;  // absent ids stay absent
  v1::FlightRecorderDump wire;
  DumpToProto(dump, {}, &wire);
  wire.set_rank(2);
  wire.set_node("node-a");
  wire.set_source("/tmp/nccl_trace_rank_2");
  const v1::FlightRecorderDump parsed = OverTheWire(wire);
  EXPECT_EQ(parsed.state(), v1::FR_DUMP_READ);
  EXPECT_EQ(parsed.entries_omitted(), 0u);
  const FrDump back = DumpFromProto(parsed);
  EXPECT_EQ(back.version, "2.9");
  EXPECT_EQ(back.rank, 2);
  EXPECT_EQ(back.nccl_version, "2.21.5");
  ASSERT_EQ(back.groups.size(), 2u);
  EXPECT_EQ(back.groups[1].name, "7");
  EXPECT_EQ(back.groups[1].desc, "PIPELINE_MODEL_PARALLEL_GROUP");
  EXPECT_EQ(back.groups[1].ranks, (std::vector<uint32_t>{2, 3}));
  ASSERT_EQ(back.status.size(), 2u);
  EXPECT_EQ(back.status[0].uid, "0");
  EXPECT_EQ(back.status[0].last_enqueued, 3);
  EXPECT_EQ(back.status[0].last_completed, 3);
  EXPECT_EQ(back.status[1].last_completed, -1);
  ASSERT_EQ(back.entries.size(), dump.entries.size());
  for (size_t i = 0; i < dump.entries.size(); ++i)
    ExpectSameEntry(back.entries[i], dump.entries[i]);

  const RankDump rd = RankDumpFromProto(parsed);
  EXPECT_EQ(rd.rank, 2u);
  EXPECT_EQ(rd.state, DumpState::kRead);
  EXPECT_EQ(rd.source, "node-a:/tmp/nccl_trace_rank_2");
}

TEST(FrProto, EmptyAndUnreadableDumps) {
  v1::FlightRecorderDump wire;
  DumpToProto(DumpBuilder(1).Group("0", "default_pg", {0, 1}).Build(), {}, &wire);
  wire.set_rank(1);
  EXPECT_EQ(wire.state(), v1::FR_DUMP_EMPTY);
  RankDump rd = RankDumpFromProto(OverTheWire(wire));
  EXPECT_EQ(rd.state, DumpState::kEmpty);
  EXPECT_EQ(rd.dump.groups.size(), 1u);  // pg_config and pg_status still count

  UnreadableToProto("byte 12: opcode GLOBAL refused", {}, &wire);
  wire.set_rank(5);
  rd = RankDumpFromProto(OverTheWire(wire));
  EXPECT_EQ(rd.state, DumpState::kUnreadable);
  EXPECT_EQ(rd.rank, 5u);
  EXPECT_EQ(rd.error, "byte 12: opcode GLOBAL refused");
}

TEST(FrProto, TrimKeepsPendingEntriesAndTheLastCompletedOfEachGroup) {
  DumpBuilder b(0);
  b.Group("0", "default_pg", {0, 1}).Group("1", "TENSOR_MODEL_PARALLEL_GROUP", {0, 1});
  b.Ops(0, 1, 20, FrState::kCompleted, "nccl:all_reduce", /*frames=*/20);
  b.Ops(1, 1, 3, FrState::kCompleted);
  b.Ops(0, 21, 21, FrState::kStarted);
  b.Ops(1, 4, 5, FrState::kScheduled);
  b.Ops(0, 22, 25, FrState::kCompleted);  // completed after the pending ones (not in order)
  const FrDump dump = b.Build();
  v1::FlightRecorderDump wire;
  DumpToProto(dump, {}, &wire);
  // Group 0: the last 8 completed (17..20, 22..25) and 21; group 1: 1..3 and 4, 5.
  std::vector<std::pair<int64_t, int64_t>> kept;  // (uid, seq) in record order
  int64_t last_record = -1;
  for (const v1::FlightRecorderEntry& e : wire.entries()) {
    kept.emplace_back(e.pg_uid(), e.collective_seq_id());
    EXPECT_GT(e.record_id(), last_record);
    last_record = e.record_id();
  }
  const std::vector<std::pair<int64_t, int64_t>> want = {{0, 17}, {0, 18}, {0, 19}, {0, 20}, {1, 1},
                                                         {1, 2},  {1, 3},  {0, 21}, {1, 4},  {1, 5},
                                                         {0, 22}, {0, 23}, {0, 24}, {0, 25}};
  EXPECT_EQ(kept, want);
  EXPECT_EQ(wire.entries_omitted(), dump.entries.size() - want.size());
  // Frames: the innermost 16, the rest counted.
  EXPECT_EQ(wire.entries(0).frames_size(), 16);
  EXPECT_EQ(wire.entries(0).frames(0).name(), "fn0");
  EXPECT_EQ(wire.entries(0).frames_omitted(), 4u);
  EXPECT_EQ(wire.entries(4).frames_size(), 2);
  EXPECT_EQ(wire.entries(4).frames_omitted(), 0u);
}

TEST(FrProto, OverTheEntryLimitPendingEntriesGoLast) {
  DumpBuilder b(0);
  b.Group("0", "default_pg", {0, 1});
  b.Ops(0, 1, 6, FrState::kCompleted).Ops(0, 7, 12, FrState::kScheduled);
  FrTransportOptions o;
  o.max_entries = 8;
  v1::FlightRecorderDump wire;
  DumpToProto(b.Build(), o, &wire);
  // The 6 pending first, then the 2 newest completed; record order on the wire.
  ASSERT_EQ(wire.entries_size(), 8);
  EXPECT_EQ(wire.entries(0).collective_seq_id(), 5);
  EXPECT_EQ(wire.entries(7).collective_seq_id(), 12);
  o.max_entries = 3;
  DumpToProto(b.Build(), o, &wire);
  ASSERT_EQ(wire.entries_size(), 3);
  EXPECT_EQ(wire.entries(0).collective_seq_id(), 7);  // the oldest pending: the frontier
  EXPECT_EQ(wire.entries(2).collective_seq_id(), 9);
  EXPECT_EQ(wire.entries_omitted(), 9u);
}

TEST(FrProto, OverTheByteBudgetFramesGoThenEntries) {
  DumpBuilder b(0);
  b.Group("0", "default_pg", {0, 1});
  b.Ops(0, 1, 8, FrState::kCompleted, "nccl:all_reduce", 16)
      .Ops(0, 9, 9, FrState::kStarted, "nccl:all_reduce", 16);
  const FrDump dump = b.Build();
  v1::FlightRecorderDump full;
  DumpToProto(dump, {}, &full);
  FrTransportOptions o;
  // Room for everything but the completed entries' frames.
  o.max_bytes = full.ByteSizeLong() - 8 * 16 * 10;
  v1::FlightRecorderDump wire;
  DumpToProto(dump, o, &wire);
  EXPECT_LE(wire.ByteSizeLong(), o.max_bytes);
  ASSERT_EQ(wire.entries_size(), 9);
  EXPECT_EQ(wire.entries(0).frames_size(), 0);
  EXPECT_EQ(wire.entries(0).frames_omitted(), 16u);
  EXPECT_EQ(wire.entries(8).frames_size(), 16);  // the pending entry keeps its stack
  // Room for little: entries go, the oldest completed first; the pending one stays.
  o.max_bytes = 400;
  DumpToProto(dump, o, &wire);
  EXPECT_LE(wire.ByteSizeLong(), o.max_bytes);
  ASSERT_GE(wire.entries_size(), 1);
  EXPECT_LT(wire.entries_size(), 9);
  EXPECT_EQ(wire.entries(wire.entries_size() - 1).collective_seq_id(), 9);
  EXPECT_EQ(wire.entries(0).collective_seq_id(), 9 - wire.entries_size() + 1);
  EXPECT_EQ(wire.entries_omitted(), 9u - wire.entries_size());
}

TEST(FrProto, WireStringsAreValidUtf8WithinTheLimit) {
  EXPECT_EQ(WireString("plain", 100), "plain");
  EXPECT_EQ(WireString("abc", 2), "ab");
  EXPECT_EQ(WireString("a\xc3\xa9z", 2), "a");  // é is not cut in half
  EXPECT_EQ(WireString("a\xc3\xa9z", 3), "a\xc3\xa9");
  EXPECT_EQ(WireString("a\xffz\xc3", 10), "a?z?");
  EXPECT_EQ(WireString("\xed\xa0\x80", 10), "???");  // a surrogate is not UTF-8
  FrDump dump = DumpBuilder(0).Group("0", "desc \xfe", {0}).Build();
  dump.version = std::string(5000, 'v');
  v1::FlightRecorderDump wire;
  DumpToProto(dump, {}, &wire);
  EXPECT_EQ(wire.groups(0).desc(), "desc ?");
  EXPECT_EQ(wire.version().size(), 4096u);
}

TEST(FrProto, VerdictToProto) {
  FrVerdict v;
  v.world_size = 4;
  v.read = {0, 1, 2};
  v.empty = {3};
  FrCulprit c;
  c.rank = 3;
  c.reason = FrCulprit::Reason::kMissing;
  c.group_desc = "TENSOR_MODEL_PARALLEL_GROUP";
  c.group_ranks = {2, 3};
  c.op.name = "all_reduce";
  c.op.seq = 5;
  c.op.input_sizes = {{1024, 4}};
  c.op.input_dtypes = {"Float"};
  for (int i = 0; i < 12; ++i) c.op.frames.push_back({"f", "train.py", i});
  c.rank_last_enqueued = 4;
  c.rank_last_completed = 4;
  c.waiting = {2};
  c.blocked = 3;
  c.dump = DumpState::kEmpty;
  v.culprits.push_back(c);
  FrGroupReport g;
  g.desc = "TENSOR_MODEL_PARALLEL_GROUP";
  g.ranks = {2, 3};
  g.names = {"1"};
  g.state = FrGroupReport::State::kMissing;
  g.frontier = c.op;
  g.completed_everywhere = 4;
  g.missing = {3};
  g.mismatches.push_back({2, MismatchKind::kSize, "[1024, 4]", "[512]"});
  v.groups.push_back(g);
  for (uint32_t r = 0; r < 4; ++r) {
    FrRankReport rr;
    rr.rank = r;
    rr.dump = r == 3 ? DumpState::kEmpty : DumpState::kRead;
    if (r == 2) {
      rr.last.push_back({"TENSOR_MODEL_PARALLEL_GROUP", {2, 3}, c.op, FrState::kStarted});
      rr.waits_for = {3};
    }
    v.ranks.push_back(rr);
  }
  v.undecided = {"nothing"};
  v.summary = "rank 3 holds the job";
  v.hang_found = true;
  const std::vector<std::string> nodes = {"a", "a", "b", "b"};
  FrVerdictProtoOptions o;
  o.max_ranks = 3;
  v1::FlightRecorderVerdict out;
  VerdictToProto(v, o, &out, &nodes);
  EXPECT_EQ(out.world_size(), 4u);
  EXPECT_EQ(std::vector<uint32_t>(out.empty().begin(), out.empty().end()),
            std::vector<uint32_t>{3});
  ASSERT_EQ(out.culprits_size(), 1);
  EXPECT_EQ(out.culprits(0).rank(), 3u);
  EXPECT_EQ(out.culprits(0).reason(), CulpritReasonName(FrCulprit::Reason::kMissing));
  EXPECT_EQ(out.culprits(0).group_size(), 2u);
  EXPECT_EQ(out.culprits(0).op().seq(), 5);
  EXPECT_EQ(out.culprits(0).op().frames_size(), 8);
  EXPECT_EQ(out.culprits(0).blocked(), 3u);
  EXPECT_EQ(out.culprits(0).dump(), v1::FR_DUMP_EMPTY);
  ASSERT_EQ(out.groups_size(), 1);
  EXPECT_EQ(out.groups(0).state(), GroupStateName(FrGroupReport::State::kMissing));
  EXPECT_EQ(out.groups(0).mismatches(0).kind(), MismatchKindName(MismatchKind::kSize));
  // The culprit, the rank that waits for it, then by rank; 3 kept.
  ASSERT_EQ(out.ranks_size(), 3);
  EXPECT_EQ(out.ranks(0).rank(), 3u);
  EXPECT_EQ(out.ranks(1).rank(), 2u);
  EXPECT_EQ(out.ranks(1).node(), "b");
  EXPECT_EQ(out.ranks(1).last(0).state(), v1::FR_OP_STARTED);
  EXPECT_EQ(out.ranks(1).last(0).group_size(), 2u);
  EXPECT_EQ(out.ranks(2).rank(), 0u);
  EXPECT_EQ(out.ranks_omitted(), 1u);
  EXPECT_EQ(out.summary(), "rank 3 holds the job");
  EXPECT_TRUE(out.hang_found());
}

// The analysis reads the trimmed dumps the way it reads the files: the same verdict.
TEST(FrProto, TrimmedDumpsGiveTheSameVerdict) {
  std::vector<RankDump> files, wire;
  for (const FrDump& d : testing::HungJobDumps()) {
    RankDump f;
    f.rank = static_cast<uint32_t>(d.rank);
    f.dump = d;
    f.state = d.entries.empty() ? DumpState::kEmpty : DumpState::kRead;
    files.push_back(f);
    FrTransportOptions o;
    o.completed_per_group = 1;
    v1::FlightRecorderDump p;
    DumpToProto(d, o, &p);
    p.set_rank(f.rank);
    wire.push_back(RankDumpFromProto(OverTheWire(p)));
  }
  FrAnalysisOptions ao;
  ao.world_size = 4;
  const FrVerdict a = AnalyzeFlightRecorder(files, ao);
  const FrVerdict b = AnalyzeFlightRecorder(wire, ao);
  EXPECT_EQ(a.summary, b.summary);
  ASSERT_EQ(a.culprits.size(), b.culprits.size());
  ASSERT_EQ(b.culprits.size(), 1u);
  EXPECT_EQ(b.culprits[0].rank, 3u);
  EXPECT_EQ(b.culprits[0].group_desc, "TENSOR_MODEL_PARALLEL_GROUP");
  EXPECT_EQ(b.culprits[0].op.seq, 5);
}

}  // namespace
}  // namespace rankwatch::fr
