#include "flight_recorder/fr_analysis.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace rankwatch::fr {
namespace {

// A job built in code: each rank's dump with its groups, counters and pending entries.
class Job {
 public:
  explicit Job(uint32_t world) : dumps_(world) {
    for (uint32_t r = 0; r < world; ++r) {
      dumps_[r].rank = r;
      dumps_[r].state = DumpState::kRead;
      dumps_[r].dump.version = "2.9";
    }
  }
  // Declares a group on each of its members (local name = `name`, uid = `uid`), with counters.
  void Group(const std::string& name, int64_t uid, const std::string& desc,
             const std::vector<uint32_t>& ranks, int64_t enqueued, int64_t completed) {
    for (uint32_t r : ranks) {
      dumps_[r].dump.groups.push_back({name, desc, ranks});
      dumps_[r].dump.status.push_back({std::to_string(uid), enqueued, -1, completed});
    }
  }
  void Counters(uint32_t rank, int64_t uid, int64_t enqueued, int64_t completed) {
    for (FrGroupStatus& s : dumps_[rank].dump.status)
      if (s.uid == std::to_string(uid)) {
        s.last_enqueued = enqueued;
        s.last_completed = completed;
      }
  }
  FrEntry& Pending(uint32_t rank, const std::string& name, int64_t uid, const std::string& op,
                   int64_t seq, bool p2p = false) {
    FrEntry e;
    e.record_id = static_cast<int64_t>(dumps_[rank].dump.entries.size()) + 100;
    e.pg_uid = uid;
    e.pg_name = name;
    for (const FrGroup& g : dumps_[rank].dump.groups)
      if (g.name == name) e.pg_desc = g.desc;
    e.profiling_name = "nccl:" + op;
    e.is_p2p = p2p;
    (p2p ? e.p2p_seq_id : e.collective_seq_id) = seq;
    if (p2p) e.collective_seq_id = 7;
    e.input_sizes = {{8, 4}};
    e.output_sizes = {{8, 4}};
    e.input_dtypes = {"Float"};
    e.output_dtypes = {"Float"};
    e.state = FrState::kScheduled;
    e.time_created_ns = 1'000'000 * (seq % 1000) + rank;
    dumps_[rank].dump.entries.push_back(e);
    return dumps_[rank].dump.entries.back();
  }
  void Empty(uint32_t rank) {
    dumps_[rank].dump.entries.clear();
    dumps_[rank].state = DumpState::kEmpty;
  }
  void Lose(uint32_t rank) { dumps_[rank].state = DumpState::kMissing; }
  std::vector<RankDump>& dumps() { return dumps_; }
  FrVerdict Analyze() {
    std::vector<RankDump> present;
    for (const RankDump& d : dumps_)
      if (d.state != DumpState::kMissing) present.push_back(d);
    FrAnalysisOptions o;
    o.world_size = static_cast<uint32_t>(dumps_.size());
    return AnalyzeFlightRecorder(present, o);
  }

 private:
  std::vector<RankDump> dumps_;
};

std::vector<uint32_t> Culprits(const FrVerdict& v) {
  std::vector<uint32_t> out;
  for (const FrCulprit& c : v.culprits) out.push_back(c.rank);
  std::sort(out.begin(), out.end());
  return out;
}

TEST(FrAnalysis, ARankThatNeverEnqueuedTheCollectiveHoldsTheGroup) {
  Job job(4);
  job.Group("5", 5, "TENSOR_MODEL_PARALLEL_GROUP", {0, 1, 2, 3}, 11, 10);
  job.Counters(3, 5, 10, 10);  // rank 3 never enqueued #11
  for (uint32_t r : {0u, 1u, 2u}) job.Pending(r, "5", 5, "all_reduce", 11);
  job.Empty(3);
  const FrVerdict v = job.Analyze();
  ASSERT_EQ(Culprits(v), (std::vector<uint32_t>{3}));
  const FrCulprit& c = v.culprits[0];
  EXPECT_EQ(c.reason, FrCulprit::Reason::kMissing);
  EXPECT_EQ(c.group_desc, "TENSOR_MODEL_PARALLEL_GROUP");
  EXPECT_EQ(c.op.name, "all_reduce");
  EXPECT_EQ(c.op.seq, 11);
  EXPECT_EQ(c.waiting, (std::vector<uint32_t>{0, 1, 2}));
  EXPECT_EQ(c.blocked, 3u);
  EXPECT_EQ(c.dump, DumpState::kEmpty);
  ASSERT_FALSE(v.groups.empty());
  EXPECT_EQ(v.groups[0].state, FrGroupReport::State::kMissing);
  EXPECT_EQ(v.groups[0].missing, (std::vector<uint32_t>{3}));
  EXPECT_EQ(v.empty, (std::vector<uint32_t>{3}));
  EXPECT_NE(v.summary.find("rank 3 holds the job"), std::string::npos) << v.summary;
}

TEST(FrAnalysis, EveryMemberEnqueuedNobodyCompletedNamesNoOne) {
  Job job(2);
  job.Group("5", 5, "TP", {0, 1}, 4, 3);
  job.Pending(0, "5", 5, "all_reduce", 4);
  job.Pending(1, "5", 5, "all_reduce", 4);
  const FrVerdict v = job.Analyze();
  EXPECT_TRUE(v.hang_found);
  EXPECT_TRUE(v.culprits.empty());
  ASSERT_EQ(v.groups.size(), 1u);
  EXPECT_EQ(v.groups[0].state, FrGroupReport::State::kWaiting);
  ASSERT_EQ(v.undecided.size(), 1u);
  EXPECT_NE(v.undecided[0].find("inside NCCL"), std::string::npos);
}

TEST(FrAnalysis, APeerCompletedWhatTheRankNeverSawCompleteIsNotCompleting) {
  Job job(2);
  job.Group("5", 5, "TP", {0, 1}, 30, 20);
  job.Counters(1, 5, 30, 25);  // rank 1 completed 21..25, which needs rank 0's participation
  for (int64_t s = 21; s <= 30; ++s) job.Pending(0, "5", 5, "all_reduce", s);
  for (int64_t s = 26; s <= 30; ++s) job.Pending(1, "5", 5, "all_reduce", s);
  const FrVerdict v = job.Analyze();
  ASSERT_EQ(Culprits(v), (std::vector<uint32_t>{0}));
  EXPECT_EQ(v.culprits[0].reason, FrCulprit::Reason::kNotCompleting);
  EXPECT_EQ(v.culprits[0].op.seq, 21);
  EXPECT_EQ(v.culprits[0].rank_last_completed, 20);
  EXPECT_EQ(v.culprits[0].waiting, (std::vector<uint32_t>{1}));
}

TEST(FrAnalysis, TheWaitIsFollowedAcrossGroupsToTheRankThatWaitsForNobody) {
  // Pipeline: rank 0 sends to rank 1, which never posted the receive: it waits in its tensor
  // group {1, 2} for rank 2, which never enqueued the collective and waits for nobody.
  Job job(3);
  job.Group("9", 6, "PIPELINE_MODEL_PARALLEL_GROUP", {0, 1}, 50, 49);
  job.Counters(1, 6, 49, 49);
  job.Group("7", 5, "TENSOR_MODEL_PARALLEL_GROUP", {1, 2}, 12, 11);
  job.Counters(2, 5, 11, 11);
  job.Pending(0, "9", 6, "send 0->1", 50, /*p2p=*/true);
  job.Pending(1, "7", 5, "all_reduce", 12);
  job.Empty(2);
  const FrVerdict v = job.Analyze();
  ASSERT_EQ(Culprits(v), (std::vector<uint32_t>{2})) << v.summary;
  EXPECT_EQ(v.culprits[0].group_desc, "TENSOR_MODEL_PARALLEL_GROUP");
  EXPECT_EQ(v.culprits[0].blocked, 2u);
  EXPECT_EQ(v.ranks[0].waits_for, (std::vector<uint32_t>{1}));
  EXPECT_EQ(v.ranks[1].waits_for, (std::vector<uint32_t>{2}));
  ASSERT_FALSE(v.ranks[0].last.empty());
  EXPECT_EQ(v.ranks[0].last[0].op.name, "send");
  EXPECT_EQ(v.ranks[0].last[0].op.peer, 1);
}

TEST(FrAnalysis, APostedCounterpartIsNotAWait) {
  Job job(2);
  job.Group("9", 6, "PP", {0, 1}, 50, 49);
  job.Pending(0, "9", 6, "send 0->1", 50, true);
  job.Pending(1, "9", 6, "recv 1<-0", 50, true);
  const FrVerdict v = job.Analyze();
  EXPECT_TRUE(v.culprits.empty());
  ASSERT_EQ(v.groups.size(), 1u);
  EXPECT_EQ(v.groups[0].state, FrGroupReport::State::kWaiting);
}

TEST(FrAnalysis, RanksThatWaitForEachOtherAreACycle) {
  Job job(2);
  job.Group("1", 1, "A", {0, 1}, 5, 4);
  job.Group("2", 2, "B", {0, 1}, 8, 7);
  job.Counters(1, 1, 4, 4);  // rank 1 never enqueued A #5
  job.Counters(0, 2, 7, 7);  // rank 0 never enqueued B #8
  job.Pending(0, "1", 1, "all_reduce", 5);
  job.Pending(1, "2", 2, "all_reduce", 8);
  const FrVerdict v = job.Analyze();
  ASSERT_EQ(Culprits(v), (std::vector<uint32_t>{0, 1}));
  EXPECT_EQ(v.culprits[0].reason, FrCulprit::Reason::kCycle);
  EXPECT_EQ(v.culprits[1].reason, FrCulprit::Reason::kCycle);
}

TEST(FrAnalysis, AMemberThatEnqueuedADifferentOperationIsAMismatch) {
  Job job(4);
  job.Group("3", 3, "DP", {0, 1, 2, 3}, 6, 5);
  job.Pending(0, "3", 3, "all_reduce", 6);
  job.Pending(1, "3", 3, "all_reduce", 6);
  job.Pending(2, "3", 3, "all_gather", 6);
  job.Pending(3, "3", 3, "all_reduce", 6).input_sizes = {{8, 4}};
  const FrVerdict v = job.Analyze();
  ASSERT_EQ(Culprits(v), (std::vector<uint32_t>{2}));
  EXPECT_EQ(v.culprits[0].reason, FrCulprit::Reason::kMismatch);
  ASSERT_EQ(v.groups[0].mismatches.size(), 1u);
  EXPECT_EQ(v.groups[0].mismatches[0].kind, MismatchKind::kOpType);
  EXPECT_EQ(v.groups[0].mismatches[0].found, "all_gather");
}

TEST(FrAnalysis, AMissingDumpLeavesTheGroupUndecidedAndNamesNoHealthyRank) {
  Job job(4);
  job.Group("5", 5, "TP", {0, 1, 2, 3}, 11, 10);
  for (uint32_t r : {0u, 1u, 2u}) job.Pending(r, "5", 5, "all_reduce", 11);
  job.Lose(3);
  const FrVerdict v = job.Analyze();
  EXPECT_TRUE(v.culprits.empty());
  EXPECT_EQ(v.missing, (std::vector<uint32_t>{3}));
  ASSERT_EQ(v.groups.size(), 1u);
  EXPECT_EQ(v.groups[0].state, FrGroupReport::State::kUndecided);
  ASSERT_EQ(v.undecided.size(), 1u);
  EXPECT_NE(v.undecided[0].find("3 left no usable record"), std::string::npos) << v.undecided[0];
}

// Issue #47: the waits that pass through a collective a culprit holds, and through a peer
// blocked in a collective. Ranks 1-3 form a tensor group, ranks 3-4 an expert group, rank 0
// sends to rank 4 (a pipeline peer) which never posted the receive.
Job HeldJob() {
  Job job(5);
  job.Group("5", 5, "TENSOR_MODEL_PARALLEL_GROUP", {1, 2, 3}, 11, 10);
  job.Group("7", 7, "EXPERT_MODEL_PARALLEL_GROUP", {3, 4}, 20, 19);
  job.Group("9", 9, "PIPELINE_MODEL_PARALLEL_GROUP", {0, 4}, 50, 49);
  job.Counters(4, 9, 49, 49);
  for (uint32_t r : {1u, 2u, 3u}) job.Pending(r, "5", 5, "all_reduce", 11);
  for (uint32_t r : {3u, 4u}) job.Pending(r, "7", 7, "all_to_all", 20);
  job.Pending(0, "9", 9, "send 0->1", 50, /*p2p=*/true);
  return job;
}

const FrGroupReport* GroupOf(const FrVerdict& v, const std::string& desc) {
  for (const FrGroupReport& g : v.groups)
    if (g.desc == desc) return &g;
  return nullptr;
}

TEST(FrAnalysis, RanksBlockedInACollectiveAMismatchedRankHoldsWaitForIt) {
  Job job = HeldJob();
  job.dumps()[3].dump.entries[0].input_sizes = {{4, 4}};  // rank 3's all_reduce #11: 4 x 4
  const FrVerdict v = job.Analyze();
  // Rank 4 waits in the expert all_to_all that rank 3 (stuck in its mismatched all_reduce)
  // holds: it is not the end of rank 0's send, rank 3 is.
  ASSERT_EQ(Culprits(v), (std::vector<uint32_t>{3})) << v.summary;
  const FrCulprit& c = v.culprits[0];
  EXPECT_EQ(c.reason, FrCulprit::Reason::kMismatch);
  EXPECT_EQ(c.group_desc, "TENSOR_MODEL_PARALLEL_GROUP");
  EXPECT_EQ(c.waiting, (std::vector<uint32_t>{1, 2, 4}));
  EXPECT_EQ(c.blocked, 4u);
  EXPECT_EQ(v.ranks[4].waits_for, (std::vector<uint32_t>{3}));
  EXPECT_EQ(v.ranks[0].waits_for, (std::vector<uint32_t>{4}));
  const FrGroupReport* ep = GroupOf(v, "EXPERT_MODEL_PARALLEL_GROUP");
  ASSERT_NE(ep, nullptr);
  EXPECT_EQ(ep->state, FrGroupReport::State::kWaiting);
  EXPECT_EQ(ep->held_by, (std::vector<uint32_t>{3}));
  const FrGroupReport* pp = GroupOf(v, "PIPELINE_MODEL_PARALLEL_GROUP");
  ASSERT_NE(pp, nullptr);
  EXPECT_EQ(pp->state, FrGroupReport::State::kWaiting);
  EXPECT_TRUE(pp->missing.empty());
  EXPECT_EQ(pp->blocked, (std::vector<uint32_t>{4}));
  EXPECT_NE(v.summary.find("rank 3 holds the job"), std::string::npos) << v.summary;
}

TEST(FrAnalysis, RanksBlockedInACollectiveANotCompletingRankHoldsWaitForIt) {
  Job job = HeldJob();
  // Rank 1 completed tensor-parallel collectives #11-#12 that rank 3 never saw complete.
  for (uint32_t r : {1u, 2u, 3u}) job.dumps()[r].dump.entries[0].collective_seq_id = 13;
  job.Counters(1, 5, 13, 12);
  job.Counters(2, 5, 13, 12);
  job.Counters(3, 5, 13, 10);
  const FrVerdict v = job.Analyze();
  ASSERT_EQ(Culprits(v), (std::vector<uint32_t>{3})) << v.summary;
  EXPECT_EQ(v.culprits[0].reason, FrCulprit::Reason::kNotCompleting);
  EXPECT_EQ(v.culprits[0].waiting, (std::vector<uint32_t>{1, 2, 4}));
  EXPECT_EQ(v.culprits[0].blocked, 4u);
  EXPECT_EQ(v.ranks[4].waits_for, (std::vector<uint32_t>{3}));
}

TEST(FrAnalysis, ASendsPeerBlockedInACollectiveEveryMemberEnqueuedIsNotNamed) {
  // Nobody is at fault in the dumps: rank 4 waits in an all_to_all both members enqueued.
  Job job = HeldJob();
  const FrVerdict v = job.Analyze();
  EXPECT_TRUE(v.hang_found);
  EXPECT_TRUE(v.culprits.empty()) << v.summary;
  for (const FrGroupReport& g : v.groups) {
    EXPECT_EQ(g.state, FrGroupReport::State::kWaiting) << g.desc;
    EXPECT_TRUE(g.held_by.empty()) << g.desc;
  }
  ASSERT_EQ(v.undecided.size(), 1u);
  EXPECT_NE(v.undecided[0].find("inside NCCL"), std::string::npos);
  EXPECT_NE(v.undecided[0].find("peers blocked in those collectives"), std::string::npos);
  EXPECT_EQ(v.ranks[0].waits_for, (std::vector<uint32_t>{4}));
}

TEST(FrAnalysis, APeerThatPostedNothingAndWaitsNowhereIsMissing) {
  Job job = HeldJob();
  job.dumps()[4].dump.entries.clear();  // rank 4 enqueued nothing more (its counters say so)
  job.Counters(4, 7, 19, 19);
  job.Counters(3, 7, 20, 19);
  const FrVerdict v = job.Analyze();
  ASSERT_EQ(Culprits(v), (std::vector<uint32_t>{4})) << v.summary;
  EXPECT_EQ(v.culprits[0].reason, FrCulprit::Reason::kMissing);
  // The collective it is missing from comes before the send it never received.
  EXPECT_EQ(v.culprits[0].group_desc, "EXPERT_MODEL_PARALLEL_GROUP");
  EXPECT_EQ(v.culprits[0].waiting, (std::vector<uint32_t>{0, 3}));
}

TEST(FrAnalysis, WaitingOnAnUndecidedGroupBlamesNoOne) {
  // Rank 3 left no dump: the expert group's all_to_all is undecided; rank 4, blocked in it, is
  // not the end of rank 0's send, and rank 3 is not named either.
  Job job = HeldJob();
  job.Lose(3);
  const FrVerdict v = job.Analyze();
  EXPECT_TRUE(v.culprits.empty()) << v.summary;
  EXPECT_EQ(v.missing, (std::vector<uint32_t>{3}));
  const FrGroupReport* ep = GroupOf(v, "EXPERT_MODEL_PARALLEL_GROUP");
  ASSERT_NE(ep, nullptr);
  EXPECT_EQ(ep->state, FrGroupReport::State::kUndecided);
  EXPECT_EQ(ep->no_dump, (std::vector<uint32_t>{3}));
  const FrGroupReport* pp = GroupOf(v, "PIPELINE_MODEL_PARALLEL_GROUP");
  ASSERT_NE(pp, nullptr);
  EXPECT_EQ(pp->blocked, (std::vector<uint32_t>{4}));
  EXPECT_EQ(v.summary.rfind("undecided: rank 3 left no usable record of 2 pending groups", 0), 0u)
      << v.summary;
  EXPECT_FALSE(v.undecided.empty());
}

TEST(FrAnalysis, ARankMissingFromOneGroupWhileWaitingInAnUndecidedOneIsNotNamed) {
  Job job(3);
  job.Group("1", 1, "A", {0, 1}, 5, 4);
  job.Group("2", 2, "B", {1, 2}, 9, 8);
  job.Counters(1, 1, 4, 4);  // rank 1 never enqueued A #5: it waits in B #9
  job.Pending(0, "1", 1, "all_reduce", 5);
  job.Pending(1, "2", 2, "all_reduce", 9);
  job.Lose(2);  // and B's state depends on rank 2, which left no dump
  const FrVerdict v = job.Analyze();
  EXPECT_TRUE(v.culprits.empty()) << v.summary;
  EXPECT_EQ(v.ranks[0].waits_for, (std::vector<uint32_t>{1}));
  bool said = false;
  for (const std::string& u : v.undecided)
    said = said || u.find(
                       "rank 1 is missing from A [0,1] all_reduce #5 but waits in B [1,2] "
                       "all_reduce #9, which is undecided") != std::string::npos;
  EXPECT_TRUE(said) << ::testing::PrintToString(v.undecided);
}

TEST(FrAnalysis, ARankTheDumpsProveMissingIsNamedBesideAMissingDump) {
  Job job(3);
  job.Group("5", 5, "TP", {0, 1, 2}, 11, 10);
  job.Counters(1, 5, 10, 10);  // rank 1 never enqueued #11
  job.Pending(0, "5", 5, "all_reduce", 11);
  job.Empty(1);
  job.Lose(2);
  const FrVerdict v = job.Analyze();
  ASSERT_EQ(Culprits(v), (std::vector<uint32_t>{1})) << v.summary;
  EXPECT_EQ(v.culprits[0].reason, FrCulprit::Reason::kMissing);
  ASSERT_EQ(v.groups.size(), 1u);
  EXPECT_EQ(v.groups[0].no_dump, (std::vector<uint32_t>{2}));
  EXPECT_FALSE(v.undecided.empty());
}

TEST(FrAnalysis, CountersOfAnEmptyDumpAreMappedByCreationOrder) {
  // Rank 1's dump has no entries: its counters are keyed by uid ("4"), its groups by name
  // ("35"); the numeric names and ids both follow creation order.
  Job job(2);
  job.Group("0", 0, "default_pg", {0, 1}, 3, 3);
  job.Group("35", 4, "TP", {0, 1}, 9, 8);
  job.Counters(1, 4, 8, 8);
  job.Pending(0, "35", 4, "all_reduce", 9);
  job.Empty(1);
  const FrVerdict v = job.Analyze();
  ASSERT_EQ(Culprits(v), (std::vector<uint32_t>{1}));
  EXPECT_EQ(v.culprits[0].rank_last_enqueued, 8);
}

TEST(FrAnalysis, NoPendingOperationIsNoHang) {
  Job job(2);
  job.Group("5", 5, "TP", {0, 1}, 4, 4);
  const FrVerdict v = job.Analyze();
  EXPECT_FALSE(v.hang_found);
  EXPECT_TRUE(v.culprits.empty());
  EXPECT_NE(v.summary.find("no hang"), std::string::npos);
}

// PyTorch's match rules (its test_fr_analysis match_one_event cases).
FrEntry Op(const std::string& name, std::vector<std::vector<int64_t>> in,
           std::vector<std::vector<int64_t>> out, FrState state = FrState::kScheduled,
           std::string out_dtype = "float32") {
  FrEntry e;
  e.profiling_name = "nccl:" + name;
  e.input_sizes = std::move(in);
  e.output_sizes = std::move(out);
  e.input_dtypes = {"float32"};
  e.output_dtypes = {std::move(out_dtype)};
  e.state = state;
  return e;
}

TEST(FrCompareOps, PyTorchMatchRules) {
  const FrEntry e1 = Op("all_reduce", {{4, 4}}, {{4, 4}});
  FrMismatch m;
  EXPECT_TRUE(CompareOps(e1, e1, 2, &m));
  EXPECT_FALSE(CompareOps(e1, Op("all_gather", {{4, 4}}, {{4, 4}}), 2, &m));
  EXPECT_EQ(m.kind, MismatchKind::kOpType);
  const FrEntry a2a = Op("all_to_all", {{4, 4}}, {{4, 4}});
  EXPECT_TRUE(CompareOps(a2a, Op("all_to_all", {{5, 4}}, {{3, 4}}), 2, &m));
  EXPECT_FALSE(CompareOps(e1, Op("all_reduce", {{5, 4}}, {{4, 4}}), 2, &m));
  EXPECT_EQ(m.kind, MismatchKind::kSize);
  EXPECT_FALSE(CompareOps(e1, Op("all_reduce", {{4, 4}}, {{5, 4}}), 2, &m));
  EXPECT_EQ(m.kind, MismatchKind::kSize);
  const FrEntry e7 = Op("all_reduce", {{4, 4}}, {{5, 4}});
  EXPECT_FALSE(CompareOps(e7, e7, 2, &m));
  EXPECT_EQ(m.kind, MismatchKind::kSize);
  const FrEntry done = Op("all_reduce", {{4, 4}}, {{4, 4}}, FrState::kCompleted);
  EXPECT_FALSE(CompareOps(e1, done, 2, &m));
  EXPECT_EQ(m.kind, MismatchKind::kState);
  EXPECT_FALSE(CompareOps(Op("all_reduce", {{4, 4}}, {{4, 4}}, FrState::kCompleted, "float16"),
                          done, 2, &m));
  EXPECT_EQ(m.kind, MismatchKind::kDtype);
  const FrEntry g1 = Op("gather", {{4, 4}}, {{4, 4}, {4, 4}}, FrState::kCompleted);
  EXPECT_TRUE(CompareOps(g1, Op("gather", {{4, 4}}, {{}}, FrState::kCompleted, ""), 2, &m));
  EXPECT_TRUE(CompareOps(g1, Op("gather", {{4, 4}}, {{4, 4}}, FrState::kCompleted, ""), 2, &m));
  EXPECT_TRUE(CompareOps(Op("_all_gather_base", {{4, 4}}, {{32}}),
                         Op("_all_gather_base", {{4, 4}}, {{32}}), 2, &m));
  EXPECT_FALSE(CompareOps(Op("_all_gather_base", {{4, 4}}, {{16}}),
                          Op("_all_gather_base", {{4, 4}}, {{16}}), 2, &m));
  EXPECT_TRUE(CompareOps(Op("_reduce_scatter_base", {{8}}, {{4}}),
                         Op("_reduce_scatter_base", {{8}}, {{4}}), 2, &m));
}

TEST(FrRankRanges, Compact) {
  EXPECT_EQ(RankRanges({0, 1, 2, 3, 5, 7, 8}), "0-3,5,7,8");
  EXPECT_EQ(RankRanges({}), "");
}

}  // namespace
}  // namespace rankwatch::fr
