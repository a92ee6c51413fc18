// The analysis on real dumps and on PyTorch's own analyzer cases:
//  - tests/fixtures/flight-recorder/nvrx-*: all 16 ranks' dumps of real hung Megatron-style
//    jobs with the fault log naming the faulty ranks: the culprits are exactly those ranks.
//    More sets of the same kind (folders with _dump_<rank> and fault_injection.log) can be
//    given in RANKWATCH_FR_EXTRA (colon-separated folders); they are held to the same rule.
//  - tests/fixtures/flight-recorder/pytorch-cases/*: PyTorch's test_fr_analysis scenarios as
//    dumps, with the collectives its analyzer reports (expected.json).
#include <gtest/gtest.h>
#include <simdjson.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
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

TEST(FrFixtures, GpuErrorSecondNamesTheRanksWithTheFailedGpus) {
  ExpectFaultRanksNamed(kFixtures / "nvrx-gpu_error_2nd");
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
