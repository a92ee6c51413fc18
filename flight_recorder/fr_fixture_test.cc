// The analysis on real dumps and on PyTorch's own analyzer cases:
//  - tests/fixtures/flight-recorder/nvrx-*: all 16 ranks' dumps of real hung Megatron-style
//    jobs with the fault log naming the faulty ranks: the culprits are exactly those ranks.
//    More sets of the same kind (folders with _dump_<rank> and fault_injection.log) can be
//    given in RANKWATCH_FR_EXTRA (colon-separated folders); they are held to the same rule.
//  - tests/fixtures/flight-recorder/pytorch-cases/*: PyTorch's test_fr_analysis scenarios as
//    dumps, with the collectives its analyzer reports (expected.json).
//  - tests/fixtures/flight-recorder/derived/faults/*: nvrx-lock_gil_1st with its two faulty ranks
//    healed and one fault of another kind put in (make_fault_sets.py, fault.json): exactly the
//    faulty rank is named, or nobody and undecided when a dump is missing (issue #47).
#include <gtest/gtest.h>
#include <simdjson.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "flight_recorder/fr_analysis.h"
#include "flight_recorder/fr_files.h"
#include "flight_recorder/fr_report.h"

namespace rankwatch::fr {
namespace {
namespace fs = std::filesystem;

const fs::path kFixtures = fs::path(RANKWATCH_FIXTURES) / "flight-recorder";

std::vector<uint32_t> FaultRanks(const fs::path& set) {
  std::ifstream in(set / "fault_injection.log");
  std::stringstream ss;
  ss << in.rdbuf();
  std::smatch m;
  const std::string text = ss.str();
  std::vector<uint32_t> out;
  if (!std::regex_search(text, m, std::regex(R"(Fault ranks: \[([0-9, ]*)\])"))) return out;
  std::stringstream list(m[1].str());
  std::string item;
  while (std::getline(list, item, ',')) out.push_back(static_cast<uint32_t>(std::stoul(item)));
  std::sort(out.begin(), out.end());
  return out;
}

void ExpectFaultRanksNamed(const fs::path& set) {
  SCOPED_TRACE(set.string());
  const std::vector<uint32_t> faulty = FaultRanks(set);
  ASSERT_FALSE(faulty.empty()) << "no fault log";
  auto dumps = LoadDumps({set});
  ASSERT_TRUE(dumps.ok()) << dumps.status();
  EXPECT_EQ(dumps->size(), 16u);
  const FrVerdict v = AnalyzeFlightRecorder(*dumps);
  std::vector<uint32_t> named;
  for (const FrCulprit& c : v.culprits) {
    named.push_back(c.rank);
    EXPECT_FALSE(c.group_desc.empty());
    EXPECT_FALSE(c.op.name.empty());
    EXPECT_GT(c.blocked, 0u);
  }
  std::sort(named.begin(), named.end());
  EXPECT_EQ(named, faulty) << VerdictText(v, {});
  EXPECT_TRUE(v.hang_found);
}

TEST(FrFixtures, LockGilFirstNamesTheRanksWhosePythonThreadsHeldTheGil) {
  const fs::path set = kFixtures / "nvrx-lock_gil_1st";
  ExpectFaultRanksNamed(set);
  const FrVerdict v = AnalyzeFlightRecorder(*LoadDumps({set}));
  // Their dumps are empty (no entries); their counters show they never enqueued the expert
  // group's all_to_all that the wait starts in.
  EXPECT_EQ(v.empty, (std::vector<uint32_t>{9, 14}));
  for (const FrCulprit& c : v.culprits) {
    EXPECT_EQ(c.reason, FrCulprit::Reason::kMissing);
    EXPECT_EQ(c.group_desc, "EXPERT_MODEL_PARALLEL_GROUP");
    EXPECT_EQ(c.op.name, "all_to_all");
    EXPECT_EQ(c.op.seq, 45265);
    // Every other rank but one waits for it: stage 0's rank 6 (resp. 1) sends to rank 14
    // (resp. 9) only.
    EXPECT_EQ(c.blocked, 13u);
  }
}

TEST(FrFixtures, LockGilFirstVerdictIsUnchanged) {
  // Issue #47 changed who waits for whom; this set's verdict stays what it was.
  const FrVerdict v = AnalyzeFlightRecorder(*LoadDumps({kFixtures / "nvrx-lock_gil_1st"}));
  ASSERT_EQ(v.culprits.size(), 2u) << VerdictText(v, {});
  EXPECT_EQ(v.culprits[0].rank, 9u);
  EXPECT_EQ(v.culprits[0].waiting, (std::vector<uint32_t>{1, 8, 10, 11, 12, 13, 15}));
  EXPECT_EQ(v.culprits[1].rank, 14u);
  EXPECT_EQ(v.culprits[1].waiting, (std::vector<uint32_t>{6, 8, 10, 11, 12, 13, 15}));
  EXPECT_TRUE(v.undecided.empty());
  // Stage 1's sends wait for 9 and 14 (missing from them) and for the other stage-1 ranks,
  // blocked in the all_to_all that 9 and 14 never enqueued.
  for (const FrGroupReport& g : v.groups) {
    if (g.desc != "PIPELINE_MODEL_PARALLEL_GROUP") continue;
    const uint32_t peer = g.ranks[1];
    if (peer == 9 || peer == 14) {
      EXPECT_EQ(g.missing, std::vector<uint32_t>{peer});
    } else {
      EXPECT_TRUE(g.missing.empty()) << GroupText(g.desc, g.ranks);
      EXPECT_EQ(g.blocked, std::vector<uint32_t>{peer});
    }
  }
}

TEST(FrFixtures, GpuErrorSecondNamesTheRanksWithTheFailedGpus) {
  const fs::path set = kFixtures / "nvrx-gpu_error_2nd";
  ExpectFaultRanksNamed(set);
  const FrVerdict v = AnalyzeFlightRecorder(*LoadDumps({set}));
  ASSERT_EQ(v.culprits.size(), 2u);
  // Each enqueued everything its tensor-parallel peers did and stopped seeing completions at
  // #87748, where its peers completed up to #87760.
  for (const FrCulprit& c : v.culprits) {
    EXPECT_EQ(c.reason, FrCulprit::Reason::kNotCompleting);
    EXPECT_EQ(c.group_desc, "TENSOR_MODEL_PARALLEL_GROUP");
    EXPECT_EQ(c.op.name, "_all_gather_base");
    EXPECT_EQ(c.op.seq, 87749);
    EXPECT_EQ(c.rank_last_enqueued, 87760);
    EXPECT_EQ(c.rank_last_completed, 87748);
    EXPECT_EQ(c.blocked, 7u);
  }
  EXPECT_EQ(v.culprits[0].rank, 9u);
  EXPECT_EQ(v.culprits[0].group_ranks, (std::vector<uint32_t>{8, 9, 10, 11}));
  EXPECT_EQ(v.culprits[0].waiting, (std::vector<uint32_t>{8, 10, 11, 12, 13, 14, 15}));
  EXPECT_EQ(v.culprits[1].rank, 14u);
  EXPECT_EQ(v.culprits[1].group_ranks, (std::vector<uint32_t>{12, 13, 14, 15}));
  EXPECT_EQ(v.culprits[1].waiting, (std::vector<uint32_t>{8, 9, 10, 11, 12, 13, 15}));
  EXPECT_TRUE(v.undecided.empty());
}

// Real dumps of a hung 4-rank gloo job of torch 2.13 (gloo-torch2.13/README.md): no pg_config
// for its groups (world, A = [0-2], B = [1-3]), every entry "scheduled", the finished ones
// retired, no send or recv recorded. Exactly the faulty rank is named.
FrVerdict GlooCase(const char* name) {
  auto dumps = LoadDumps({kFixtures / "gloo-torch2.13" / name});
  EXPECT_TRUE(dumps.ok()) << dumps.status();
  if (!dumps.ok()) return {};
  EXPECT_EQ(dumps->size(), 4u);
  FrVerdict v = AnalyzeFlightRecorder(*dumps);
  EXPECT_EQ(v.read, (std::vector<uint32_t>{0, 1, 2, 3}));
  EXPECT_TRUE(v.hang_found);
  return v;
}

TEST(FrFixtures, GlooRankMissingFromASubgroupAllReduce) {
  const FrVerdict v = GlooCase("missing");
  ASSERT_EQ(v.culprits.size(), 1u) << VerdictText(v, {});
  const FrCulprit& c = v.culprits[0];
  EXPECT_EQ(c.rank, 3u);
  EXPECT_EQ(c.reason, FrCulprit::Reason::kMissing);
  EXPECT_EQ(c.group_ranks, (std::vector<uint32_t>{1, 2, 3}));
  EXPECT_EQ(c.op.name, "all_reduce");
  EXPECT_EQ(c.op.seq, 26);
  EXPECT_EQ(c.waiting, (std::vector<uint32_t>{0, 1, 2}));
  EXPECT_EQ(c.blocked, 3u);
}

TEST(FrFixtures, GlooRankCallingASubgroupAllReduceWithAnEmptyTensor) {
  // Rank 2's all_reduce of B returned at once (gloo moves no data for an empty tensor): it
  // completed #26, its peers did not. That is its mismatch, not their GPUs failing.
  const FrVerdict v = GlooCase("size");
  ASSERT_EQ(v.culprits.size(), 1u) << VerdictText(v, {});
  const FrCulprit& c = v.culprits[0];
  EXPECT_EQ(c.rank, 2u);
  EXPECT_EQ(c.reason, FrCulprit::Reason::kMismatch);
  EXPECT_EQ(c.group_ranks, (std::vector<uint32_t>{1, 2, 3}));
  EXPECT_EQ(c.op.seq, 26);
  EXPECT_EQ(c.waiting, (std::vector<uint32_t>{1, 3}));
  EXPECT_EQ(c.blocked, 3u);
  for (const FrGroupReport& g : v.groups) EXPECT_TRUE(g.not_completing.empty()) << g.desc;
}

TEST(FrFixtures, GlooRankStuckInASend) {
  // The send is not in the dumps: rank 1 is missing from the world all_reduce the others wait in.
  const FrVerdict v = GlooCase("p2p");
  ASSERT_EQ(v.culprits.size(), 1u) << VerdictText(v, {});
  const FrCulprit& c = v.culprits[0];
  EXPECT_EQ(c.rank, 1u);
  EXPECT_EQ(c.reason, FrCulprit::Reason::kMissing);
  EXPECT_EQ(c.group_ranks, (std::vector<uint32_t>{0, 1, 2, 3}));
  EXPECT_EQ(c.op.seq, 26);
  EXPECT_EQ(c.waiting, (std::vector<uint32_t>{0, 2, 3}));
}

// Derived sets (derived/faults/, make_fault_sets.py): the real job with its faulty ranks
// healed, one fault put in. `faulty` is asserted against the set's own fault.json.
struct Derived {
  FrVerdict v;
  std::vector<uint32_t> faulty;  // fault.json's
};

Derived DerivedSet(const char* name) {
  Derived d;
  const fs::path set = kFixtures / "derived" / "faults" / name;
  auto dumps = LoadDumps({set});
  EXPECT_TRUE(dumps.ok()) << dumps.status();
  if (!dumps.ok()) return d;
  FrAnalysisOptions o;
  o.world_size = 16;  // a set with a dump removed still is a 16-rank job
  d.v = AnalyzeFlightRecorder(*dumps, o);
  simdjson::dom::parser parser;
  simdjson::dom::element fault = parser.load((set / "fault.json").string());
  for (simdjson::dom::element r : fault["faulty"].get_array())
    d.faulty.push_back(static_cast<uint32_t>(int64_t(r)));
  EXPECT_TRUE(d.v.hang_found);
  return d;
}

std::vector<uint32_t> Named(const FrVerdict& v) {
  std::vector<uint32_t> out;
  for (const FrCulprit& c : v.culprits) out.push_back(c.rank);
  std::sort(out.begin(), out.end());
  return out;
}

const FrGroupReport* Group(const FrVerdict& v, const std::string& desc, uint32_t member) {
  for (const FrGroupReport& g : v.groups)
    if (g.desc == desc && std::binary_search(g.ranks.begin(), g.ranks.end(), member)) return &g;
  return nullptr;
}

// Stage 0 (ranks 0-7) sends to stage 1, which never posted the receives: each stage-1 peer
// waits in a collective, so it is blocked there, not missing from the send.
void ExpectStageOneBlockedNotMissing(const FrVerdict& v) {
  for (const FrGroupReport& g : v.groups) {
    if (g.desc != "PIPELINE_MODEL_PARALLEL_GROUP") continue;
    SCOPED_TRACE(GroupText(g.desc, g.ranks));
    EXPECT_TRUE(g.missing.empty());
    if (g.no_dump.empty()) {
      EXPECT_EQ(g.blocked, std::vector<uint32_t>{g.ranks[1]});
    }
  }
  // A peer without a dump is undecided, not waited for.
  for (uint32_t r = 0; r < 8; ++r)
    if (v.ranks[r + 8].dump == DumpState::kRead) {
      EXPECT_EQ(v.ranks[r].waits_for, std::vector<uint32_t>{r + 8});
    } else {
      EXPECT_TRUE(v.ranks[r].waits_for.empty());
    }
}

TEST(FrDerivedSets, HealedNamesNoOne) {
  const Derived d = DerivedSet("healed");
  EXPECT_TRUE(d.faulty.empty());
  EXPECT_EQ(Named(d.v), d.faulty) << VerdictText(d.v, {});
  for (const FrGroupReport& g : d.v.groups) {
    EXPECT_EQ(g.state, FrGroupReport::State::kWaiting) << GroupText(g.desc, g.ranks);
    EXPECT_TRUE(g.held_by.empty());
  }
  ExpectStageOneBlockedNotMissing(d.v);
  ASSERT_EQ(d.v.undecided.size(), 1u);
  EXPECT_NE(d.v.undecided[0].find("inside NCCL"), std::string::npos);
}

TEST(FrDerivedSets, SizeMismatchInATensorParallelGroupNamesExactlyThatRank) {
  const Derived d = DerivedSet("tp_size_10");
  ASSERT_EQ(d.faulty, std::vector<uint32_t>{10});
  ASSERT_EQ(Named(d.v), d.faulty) << VerdictText(d.v, {});
  const FrCulprit& c = d.v.culprits[0];
  EXPECT_EQ(c.reason, FrCulprit::Reason::kMismatch);
  EXPECT_EQ(c.group_desc, "TENSOR_MODEL_PARALLEL_GROUP");
  EXPECT_EQ(c.group_ranks, (std::vector<uint32_t>{8, 9, 10, 11}));
  EXPECT_EQ(c.op.name, "_reduce_scatter_base");
  EXPECT_EQ(c.op.seq, 88684);
  // Its tensor-parallel peers wait for it in the mismatched collective; every stage-1 rank in
  // the collectives it holds (it enqueued them, its stream is stuck); rank 2 in its send to it.
  EXPECT_EQ(c.waiting, (std::vector<uint32_t>{2, 8, 9, 11, 12, 13, 14, 15}));
  EXPECT_EQ(c.blocked, 15u);
  const FrGroupReport* tp = Group(d.v, "TENSOR_MODEL_PARALLEL_GROUP", 10);
  ASSERT_NE(tp, nullptr);
  EXPECT_EQ(tp->state, FrGroupReport::State::kMismatch);
  ASSERT_EQ(tp->mismatches.size(), 1u);
  EXPECT_EQ(tp->mismatches[0].rank, 10u);
  EXPECT_EQ(tp->mismatches[0].kind, MismatchKind::kSize);
  const FrGroupReport* ep = Group(d.v, "EXPERT_MODEL_PARALLEL_GROUP", 10);
  ASSERT_NE(ep, nullptr);
  EXPECT_EQ(ep->held_by, std::vector<uint32_t>{10});
  for (uint32_t r : {12u, 13u, 14u, 15u})
    EXPECT_EQ(d.v.ranks[r].waits_for, std::vector<uint32_t>{10});
  ExpectStageOneBlockedNotMissing(d.v);
  EXPECT_TRUE(d.v.undecided.empty());
}

TEST(FrDerivedSets, SizeMismatchInADataParallelGroupNamesExactlyThatRank) {
  const Derived d = DerivedSet("dp_size_12");
  ASSERT_EQ(d.faulty, std::vector<uint32_t>{12});
  ASSERT_EQ(Named(d.v), d.faulty) << VerdictText(d.v, {});
  const FrCulprit& c = d.v.culprits[0];
  EXPECT_EQ(c.reason, FrCulprit::Reason::kMismatch);
  EXPECT_EQ(c.group_desc, "TENSOR_AND_DATA_PARALLEL_GROUP_WITH_CP");
  EXPECT_EQ(c.group_ranks, (std::vector<uint32_t>{8, 9, 10, 11, 12, 13, 14, 15}));
  EXPECT_EQ(c.op.name, "all_reduce");
  EXPECT_EQ(c.op.seq, 15118);
  EXPECT_EQ(c.blocked, 15u);
  const FrGroupReport* tp = Group(d.v, "TENSOR_MODEL_PARALLEL_GROUP", 12);
  ASSERT_NE(tp, nullptr);
  EXPECT_EQ(tp->held_by, std::vector<uint32_t>{12});
  ExpectStageOneBlockedNotMissing(d.v);
}

TEST(FrDerivedSets, AMissingDumpNamesNobodyAndIsUndecided) {
  const Derived d = DerivedSet("no_dump_9");
  EXPECT_TRUE(d.faulty.empty());
  EXPECT_EQ(Named(d.v), d.faulty) << VerdictText(d.v, {});
  EXPECT_EQ(d.v.missing, std::vector<uint32_t>{9});
  EXPECT_EQ(d.v.summary.rfind("undecided: rank 9 left no usable record of 5 pending groups", 0), 0u)
      << d.v.summary;
  // Every group of rank 9 with something pending is undecided; no group names a rank.
  size_t undecided = 0;
  for (const FrGroupReport& g : d.v.groups) {
    EXPECT_TRUE(g.missing.empty()) << GroupText(g.desc, g.ranks);
    EXPECT_TRUE(g.held_by.empty());
    const bool has9 = std::binary_search(g.ranks.begin(), g.ranks.end(), 9u);
    EXPECT_EQ(g.state == FrGroupReport::State::kUndecided, has9) << GroupText(g.desc, g.ranks);
    if (has9) {
      EXPECT_EQ(g.no_dump, std::vector<uint32_t>{9});
    }
    undecided += has9;
  }
  EXPECT_EQ(undecided, 5u);
  EXPECT_EQ(d.v.undecided.size(), 5u);
  ExpectStageOneBlockedNotMissing(d.v);
}

TEST(FrDerivedSets, ARankThatNeverCompletesNamesExactlyThatRank) {
  const Derived d = DerivedSet("not_completing_11");
  ASSERT_EQ(d.faulty, std::vector<uint32_t>{11});
  ASSERT_EQ(Named(d.v), d.faulty) << VerdictText(d.v, {});
  const FrCulprit& c = d.v.culprits[0];
  EXPECT_EQ(c.reason, FrCulprit::Reason::kNotCompleting);
  EXPECT_EQ(c.group_desc, "TENSOR_MODEL_PARALLEL_GROUP");
  EXPECT_EQ(c.group_ranks, (std::vector<uint32_t>{8, 9, 10, 11}));
  EXPECT_EQ(c.op.seq, 88682);
  EXPECT_EQ(c.rank_last_completed, 88681);
  EXPECT_EQ(c.blocked, 15u);
  const FrGroupReport* ep = Group(d.v, "EXPERT_MODEL_PARALLEL_GROUP", 11);
  ASSERT_NE(ep, nullptr);
  EXPECT_EQ(ep->held_by, std::vector<uint32_t>{11});
  ExpectStageOneBlockedNotMissing(d.v);
}

// The derived sets damaged at random (seeded): dumps lost or emptied, counters moved, entries'
// states and sizes changed, entries dropped. The analysis keeps its invariants (and, under the
// sanitizer build, touches no memory it should not).
TEST(FrDerivedSets, RandomDamageKeepsTheInvariants) {
  std::vector<std::vector<RankDump>> bases;
  for (const char* name : {"healed", "tp_size_10", "not_completing_11"}) {
    auto dumps = LoadDumps({kFixtures / "derived" / "faults" / name});
    ASSERT_TRUE(dumps.ok()) << dumps.status();
    bases.push_back(*dumps);
  }
  std::mt19937 rng(47);
  auto pick = [&](size_t n) { return static_cast<size_t>(rng() % n); };
  for (int round = 0; round < 300; ++round) {
    std::vector<RankDump> dumps = bases[pick(bases.size())];
    const int damage = 1 + static_cast<int>(pick(6));
    for (int i = 0; i < damage; ++i) {
      RankDump& d = dumps[pick(dumps.size())];
      switch (pick(6)) {
        case 0: d.state = DumpState::kMissing; break;
        case 1:
          d.dump.entries.clear();
          d.state = DumpState::kEmpty;
          break;
        case 2:
          if (!d.dump.status.empty()) {
            FrGroupStatus& st = d.dump.status[pick(d.dump.status.size())];
            st.last_completed -= static_cast<int64_t>(pick(4));
            st.last_enqueued += static_cast<int64_t>(pick(3)) - 1;
          }
          break;
        case 3:
          if (!d.dump.entries.empty()) {
            FrEntry& e = d.dump.entries[pick(d.dump.entries.size())];
            e.state = pick(2) ? FrState::kCompleted : FrState::kScheduled;
          }
          break;
        case 4:
          if (!d.dump.entries.empty())
            d.dump.entries[pick(d.dump.entries.size())].input_sizes = {{1, 2, 3}};
          break;
        default:
          if (!d.dump.entries.empty())
            d.dump.entries.erase(d.dump.entries.begin() +
                                 static_cast<std::ptrdiff_t>(pick(d.dump.entries.size())));
      }
    }
    std::vector<RankDump> present;
    for (const RankDump& d : dumps)
      if (d.state != DumpState::kMissing) present.push_back(d);
    FrAnalysisOptions o;
    o.world_size = 16;
    const FrVerdict v = AnalyzeFlightRecorder(present, o);
    SCOPED_TRACE("round " + std::to_string(round) + ": " + v.summary);
    ASSERT_EQ(v.ranks.size(), 16u);
    std::vector<uint32_t> named;
    for (const FrCulprit& c : v.culprits) {
      ASSERT_LT(c.rank, 16u);
      named.push_back(c.rank);
      EXPECT_LE(c.blocked, 15u);
      EXPECT_TRUE(std::is_sorted(c.waiting.begin(), c.waiting.end()));
      for (uint32_t w : c.waiting) EXPECT_LT(w, 16u);
      // A rank without a dump is named only as such (or in a cycle), never as missing.
      if (c.dump == DumpState::kMissing || c.dump == DumpState::kUnreadable) {
        EXPECT_TRUE(c.reason == FrCulprit::Reason::kNoDump ||
                    c.reason == FrCulprit::Reason::kCycle);
      }
    }
    std::sort(named.begin(), named.end());
    EXPECT_EQ(std::adjacent_find(named.begin(), named.end()), named.end());
    bool open = false;
    for (const FrGroupReport& g : v.groups) {
      open = open || !g.no_dump.empty();
      for (uint32_t h : g.held_by) EXPECT_TRUE(std::binary_search(named.begin(), named.end(), h));
    }
    if (v.culprits.empty() && open) {
      EXPECT_EQ(v.summary.rfind("undecided: ", 0), 0u);
    }
    if (!v.culprits.empty()) {
      EXPECT_NE(v.summary.find("the job"), std::string::npos);
    }
  }
}

TEST(FrFixtures, ExtraSetsFromTheSameSource) {
  const char* extra = std::getenv("RANKWATCH_FR_EXTRA");
  if (!extra || !*extra) GTEST_SKIP() << "RANKWATCH_FR_EXTRA not set (folders of more dump sets)";
  std::stringstream list(extra);
  std::string dir;
  while (std::getline(list, dir, ':'))
    if (!dir.empty()) ExpectFaultRanksNamed(dir);
}

TEST(FrFixtures, PyTorchAnalyzerCasesGetItsVerdicts) {
  size_t cases = 0;
  for (const auto& entry : fs::directory_iterator(kFixtures / "pytorch-cases")) {
    if (!entry.is_directory()) continue;
    ++cases;
    SCOPED_TRACE(entry.path().filename().string());
    auto dumps = LoadDumps({entry.path()});
    ASSERT_TRUE(dumps.ok()) << dumps.status();
    for (const RankDump& d : *dumps) EXPECT_EQ(d.state, DumpState::kRead) << d.error;
    const std::vector<FrCollective> got = MatchCollectives(*dumps);
    simdjson::dom::parser parser;
    simdjson::dom::element expected = parser.load((entry.path() / "expected.json").string());
    simdjson::dom::array want = expected.get_array();
    ASSERT_EQ(got.size(), want.size());
    size_t i = 0;
    for (simdjson::dom::element w : want) {
      const FrCollective& c = got[i++];
      SCOPED_TRACE("collective " + std::to_string(i - 1));
      EXPECT_EQ(c.op.record_id, int64_t(w["record_id"]));
      EXPECT_EQ(c.op.name, std::string(std::string_view(w["name"])));
      EXPECT_EQ(c.pass, bool(w["pass"]));
      std::vector<uint32_t> missing;
      for (simdjson::dom::element m : w["missing"].get_array())
        missing.push_back(static_cast<uint32_t>(int64_t(m)));
      EXPECT_EQ(c.missing, missing);
      if (w["mismatch"].is_null()) {
        EXPECT_TRUE(c.mismatches.empty());
      } else {
        ASSERT_FALSE(c.mismatches.empty());
        EXPECT_EQ(std::string(MismatchKindName(c.mismatches[0].kind)),
                  std::string(std::string_view(w["mismatch"])));
      }
    }
  }
  EXPECT_GE(cases, 15u);
}

}  // namespace
}  // namespace rankwatch::fr
