#include "traces/step_records_jsonl.h"

#include <gtest/gtest.h>

#include <fstream>

namespace rankwatch {
namespace {

class StepRecordsJsonlTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("step_records_jsonl_test_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_ / "sub");
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::filesystem::path Write(const std::string& name, const std::string& text) {
    const std::filesystem::path p = dir_ / name;
    std::ofstream(p) << text;
    return p;
  }

  std::filesystem::path dir_;
};

// A device-timed record with its host phases and an op with host times, as a collector writes it.
constexpr const char* kDeviceLine =
    R"({"rank": 1, "world_size": 2, "node": "gpu-1", "device": "cuda:1", "record": {"step": "7",)"
    R"( "dataloaderNs": "2000000", "forwardNs": "30000000", "backwardNs": "50000000",)"
    R"( "stepTimeNs": "100000000", "endUnixNs": "1795000000123456789",)"
    R"( "clock": "STEP_CLOCK_DEVICE", "hostPhases": {"forwardNs": "4000000", "backwardNs": 6000000},)"
    R"( "ops": [{"type": "OP_FORWARD_COMPUTE", "startOffsetUs": "10", "durationUs": "30000",)"
    R"( "hostStartOffsetUs": "2", "hostDurationUs": "4000"}], "opsOriginUnixNs": "1795000000000000000",)"
    R"( "someFieldOfANewerCollector": 1}})";

TEST_F(StepRecordsJsonlTest, ReadsRecordsInTheJsonMapping) {
  const auto file =
      Write("rank1.steps.jsonl", std::string(kDeviceLine) + "\n\n" +
                                     R"({"rank": 0, "record": {"step": 8, "stepTimeNs": 5,)"
                                     R"( "clock": "STEP_CLOCK_DEVICE_MISSING"}})"
                                     "\r\n"
                                     // The proto's own field names, numbers as numbers.
                                     R"({"rank": 0, "world_size": 2, "record": {"step": 9,)"
                                     R"( "step_time_ns": 100, "forward_ns": 60,)"
                                     R"( "host_phases": {"forward_ns": 4}, "clock": 1}})"
                                     "\n");
  auto lines = ReadStepRecordsJsonl(file);
  ASSERT_TRUE(lines.ok()) << lines.status();
  ASSERT_EQ(lines->size(), 3u);
  const StepRecordLine& a = (*lines)[0];
  EXPECT_EQ(a.rank, 1u);
  EXPECT_EQ(a.world_size, 2u);
  EXPECT_EQ(a.node, "gpu-1");
  EXPECT_EQ(a.device, "cuda:1");
  EXPECT_EQ(a.record.step(), 7u);
  EXPECT_EQ(a.record.forward_ns(), 30'000'000u);
  EXPECT_EQ(a.record.end_unix_ns(), 1'795'000'000'123'456'789);  // exact beyond 2^53
  EXPECT_EQ(a.record.clock(), v1::STEP_CLOCK_DEVICE);
  EXPECT_EQ(a.record.host_phases().forward_ns(), 4'000'000u);
  EXPECT_EQ(a.record.host_phases().backward_ns(), 6'000'000u);
  EXPECT_FALSE(a.record.host_phases().has_optimizer_ns());
  ASSERT_EQ(a.record.ops_size(), 1);
  EXPECT_EQ(a.record.ops(0).duration_us(), 30'000u);
  EXPECT_EQ(a.record.ops(0).host_start_offset_us(), 2u);
  EXPECT_EQ(a.record.ops(0).host_duration_us(), 4'000u);
  const StepRecordLine& b = (*lines)[1];
  EXPECT_EQ(b.rank, 0u);
  EXPECT_EQ(b.world_size, 0u);
  EXPECT_EQ(b.record.clock(), v1::STEP_CLOCK_DEVICE_MISSING);
  const StepRecordLine& c = (*lines)[2];
  EXPECT_EQ(c.record.step(), 9u);
  EXPECT_EQ(c.record.step_time_ns(), 100u);
  EXPECT_EQ(c.record.host_phases().forward_ns(), 4u);
  EXPECT_EQ(c.record.clock(), v1::STEP_CLOCK_DEVICE);
}

TEST_F(StepRecordsJsonlTest, ABadLineNamesTheFileAndTheLine) {
  const std::string good = R"({"rank": 0, "record": {"step": "1"}})";
  const std::pair<std::string, std::string> cases[] = {
      {"{not json", "not a JSON object"},
      {R"({"record": {"step": "1"}})", "no \"rank\""},
      {R"({"rank": -1, "record": {"step": "1"}})", "\"rank\" is not a number"},
      {R"({"rank": 2, "world_size": 2, "record": {"step": "1"}})", "rank 2 of world size 2"},
      {R"({"rank": 0, "node": 3, "record": {"step": "1"}})", "\"node\" is not a string"},
      {R"({"rank": 0})", "no \"record\" object"},
      {R"({"rank": 0, "record": {"step": "one"}})", "not a StepRecord"},
      {R"({"rank": 0, "record": {"clock": true}})", "not a StepRecord"},
  };
  for (const auto& [line, expected] : cases) {
    const auto file = Write("bad.steps.jsonl", good + "\n" + good + "\n" + line + "\n");
    auto lines = ReadStepRecordsJsonl(file);
    ASSERT_FALSE(lines.ok()) << line;
    EXPECT_EQ(lines.status().code(), absl::StatusCode::kInvalidArgument) << line;
    const std::string message(lines.status().message());
    EXPECT_EQ(message.rfind(file.string() + ":3: ", 0), 0u) << message;
    EXPECT_NE(message.find(expected), std::string::npos) << message;
  }
}

TEST_F(StepRecordsJsonlTest, FindsStepRecordFiles) {
  Write("b.steps.jsonl", "");
  Write("sub/a.steps.jsonl", "");
  Write("sub/other.jsonl", "");
  Write("trace.json", "");
  auto found = FindStepRecordFiles({dir_.string()});
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(*found, (std::vector<std::filesystem::path>{dir_ / "b.steps.jsonl",
                                                        dir_ / "sub/a.steps.jsonl"}));
  EXPECT_TRUE(IsStepRecordsFile("x/rank0.steps.jsonl"));
  EXPECT_FALSE(IsStepRecordsFile("x/rank0.jsonl"));
  EXPECT_FALSE(IsStepRecordsFile(".steps.jsonl"));
  EXPECT_EQ(FindStepRecordFiles({(dir_ / "trace.json").string()}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(FindStepRecordFiles({(dir_ / "missing").string()}).status().code(),
            absl::StatusCode::kNotFound);
  std::filesystem::create_directories(dir_ / "empty");
  EXPECT_EQ(FindStepRecordFiles({(dir_ / "empty").string()}).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(ReadStepRecordsJsonl(dir_ / "missing.steps.jsonl").status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace rankwatch
