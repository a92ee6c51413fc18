// Reads the real vendor fixtures in tests/fixtures and checks values computed by hand
// from the files.
#include "traces/iteration_trace.h"

#include <gtest/gtest.h>

#include <fstream>

namespace rankwatch {
namespace {

const std::string kFixtures = RANKWATCH_FIXTURES;

const v1::StepRecord& StepOf(const IterationTrace& t, uint64_t step) {
  for (const v1::StepRecord& r : t.steps) {
    if (r.step() == step) return r;
  }
  ADD_FAILURE() << "no step " << step;
  static v1::StepRecord none;
  return none;
}

TEST(MsprofStepTraceTest, ReadsTheTimelineOfDevice0) {
  auto t =
      ReadIterationTrace(kFixtures +
                         "/ascend-msprof-timeline/PROF_000001_20230818142704322_COJGGGCANRMICFBC"
                         "/device_0/timeline/step_trace_0_2_1.json");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->rank, 0u);
  EXPECT_EQ(t->node, "A2007104679");
  EXPECT_EQ(t->device, "npu:0");
  ASSERT_EQ(t->steps.size(), 10u);
  EXPECT_EQ(t->steps.front().step(), 1u);
  EXPECT_EQ(t->steps.back().step(), 10u);
  // Iteration 1: no previous iteration, so no data-augmentation gap.
  const v1::StepRecord& s1 = StepOf(*t, 1);
  EXPECT_EQ(s1.dataloader_ns(), 0u);
  EXPECT_EQ(s1.step_time_ns(), 47587810u);                            // Iteration Time(ns)
  EXPECT_EQ(s1.forward_backward_ns(), 4236100u);                      // FP_BP Time(ns)
  EXPECT_EQ(s1.optimizer_ns(), 43345580u);                            // Iteration Refresh(ns)
  EXPECT_NEAR(static_cast<double>(s1.collective_ns()), 41565450, 1);  // Reduce_1_0 dur (µs)
  // Iteration 2: FP Start 56635944375.25 - iteration 1 end 56635912240.3 = 32134.95 µs.
  const v1::StepRecord& s2 = StepOf(*t, 2);
  EXPECT_NEAR(static_cast<double>(s2.dataloader_ns()), 32134950, 2);
  EXPECT_NEAR(static_cast<double>(s2.step_time_ns()), 32134950 + 15369160, 2);
  EXPECT_EQ(s2.forward_backward_ns(), 4269150u);
  EXPECT_EQ(s2.optimizer_ns(), 11095070u);
  // Iteration 9's gap equals the file's own "Data_aug Bound(us)": 15496.15.
  EXPECT_NEAR(static_cast<double>(StepOf(*t, 9).dataloader_ns()), 15496150, 2);
  EXPECT_FALSE(s1.has_forward_ns());  // Ascend knows only the combined FP->BP span
}

TEST(MsprofStepTraceTest, RankComesFromInfoJson) {
  auto t =
      ReadIterationTrace(kFixtures +
                         "/ascend-msprof-timeline/PROF_000001_20230818142704567_GQFAMHBKGODKJMLA"
                         "/device_1/timeline/step_trace_1_0_1.json");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->rank, 1u);
  ASSERT_EQ(t->steps.size(), 10u);
  EXPECT_NEAR(static_cast<double>(StepOf(*t, 10).dataloader_ns()), 15979350, 2);
  EXPECT_NEAR(static_cast<double>(StepOf(*t, 10).step_time_ns()), 15979350 + 16256890, 2);
}

TEST(MindSporeStepTraceTest, ReadsTicksSkipsTheAveragesRowAndUnionsCommunication) {
  auto t = ReadIterationTrace(kFixtures +
                              "/mindspore-step-trace-raw/run_1_normal_run_profiler/"
                              "step_trace_raw_1_detail_time.csv");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->rank, 1u);
  ASSERT_EQ(t->steps.size(), 322u);  // 323 rows minus the "-" averages row
  const v1::StepRecord& s1 = t->steps.front();
  EXPECT_EQ(s1.step(), 1u);
  EXPECT_EQ(s1.step_time_ns(), 284271180u);  // total 28427118 ticks x 10 ns
  EXPECT_EQ(s1.dataloader_ns(), 0u);
  EXPECT_EQ(s1.forward_backward_ns(), 193781150u);
  EXPECT_EQ(s1.optimizer_ns(), 90490030u);
  EXPECT_EQ(s1.collective_ns(), 179334360u);  // union of 11 all-reduce intervals
  EXPECT_EQ(t->steps.back().step(), 322u);
  EXPECT_EQ(t->steps.back().collective_ns(), 100763700u);
}

TEST(MindSporeStepTraceTest, PipelineStagesWithOverlappingCommunicationOps) {
  auto r0 = ReadIterationTrace(kFixtures +
                               "/mindspore-step-trace-raw/cluster_propose/"
                               "step_trace_raw_0_detail_time.csv");
  auto r2 = ReadIterationTrace(kFixtures +
                               "/mindspore-step-trace-raw/cluster_propose/"
                               "step_trace_raw_2_detail_time.csv");
  ASSERT_TRUE(r0.ok()) << r0.status();
  ASSERT_TRUE(r2.ok()) << r2.status();
  EXPECT_EQ(r0->rank, 0u);
  EXPECT_EQ(r2->rank, 2u);
  ASSERT_EQ(r0->steps.size(), 5u);
  ASSERT_EQ(r2->steps.size(), 5u);
  // Summed durations (282,974,520 ns) exceed the step (178,186,600 ns); the union does not.
  EXPECT_EQ(r0->steps[0].collective_ns(), 175495040u);
  EXPECT_LE(r0->steps[0].collective_ns(), r0->steps[0].step_time_ns());
  EXPECT_EQ(r2->steps[4].collective_ns(), 56756250u);
}

TEST(TorchNpuStepTraceTest, ReadsCrlfMicrosecondsAndTheRank) {
  for (uint32_t rank : {0u, 1u}) {
    auto t = ReadIterationTrace(kFixtures + "/ascend-pytorch-profiler/rank" + std::to_string(rank) +
                                "_ascend_pt/ASCEND_PROFILER_OUTPUT/step_trace_time.csv");
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_EQ(t->rank, rank);
    ASSERT_EQ(t->steps.size(), 1u);
    const v1::StepRecord& s = t->steps[0];
    EXPECT_EQ(s.step(), 50u);
    if (rank == 0) {
      EXPECT_EQ(s.dataloader_ns(), 19358000u);        // Preparing
      EXPECT_EQ(s.collective_ns(), 81515607u);        // Communication(Not Overlapped)
      EXPECT_EQ(s.forward_backward_ns(), 90343080u);  // Computing + exposed communication
      EXPECT_EQ(s.step_time_ns(), 135609250u);        // Preparing + Stage
    } else {
      EXPECT_EQ(s.forward_backward_ns(), 73429287u);
      EXPECT_EQ(s.step_time_ns(), 119522250u);
    }
  }
}

TEST(IterationTraceTest, FindsTracesInDirectoriesAndRejectsOthers) {
  auto found = FindIterationTraces(
      {kFixtures + "/ascend-msprof-timeline", kFixtures + "/mindspore-step-trace-raw"});
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(found->size(), 5u);  // 2 msprof + 3 MindSpore
  auto none = FindIterationTraces({kFixtures + "/kineto"});
  EXPECT_FALSE(none.ok());
  auto missing = FindIterationTraces({"/no/such/trace"});
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("/no/such/trace"), std::string::npos);
}

TEST(IterationTraceTest, BrokenFilesAreErrorsNamingFileAndLine) {
  const std::string dir = ::testing::TempDir() + "/rank3_ascend_pt/ASCEND_PROFILER_OUTPUT";
  std::filesystem::create_directories(dir);
  const std::string csv = dir + "/step_trace_time.csv";
  std::ofstream(csv) << "Step,Computing,Communication(Not Overlapped),Stage,Preparing\r\n"
                        "1,10,2,20,1\r\n"
                        "2,ten,2,20,1\r\n";
  auto t = ReadIterationTrace(csv);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find(csv + ":3"), std::string::npos) << t.status();
  EXPECT_NE(t.status().message().find("Computing"), std::string::npos);

  const std::string json = ::testing::TempDir() + "/step_trace_0_1_1.json";
  std::ofstream(json) << "[{\"ph\": \"X\", \"cat\": \"Iteration Time\"";
  auto j = ReadIterationTrace(json);
  ASSERT_FALSE(j.ok());
  EXPECT_NE(j.status().message().find(json), std::string::npos);
  EXPECT_NE(j.status().message().find("not JSON"), std::string::npos) << j.status();
}

TEST(IterationTraceTest, AStepNumberThatIsNoWholeNumberIsAnError) {
  // Converting 1e300 or -5 to a step number was undefined behaviour (fuzz_ascend_csv).
  const std::string dir = ::testing::TempDir() + "/rank4_ascend_pt/ASCEND_PROFILER_OUTPUT";
  std::filesystem::create_directories(dir);
  const std::string csv = dir + "/step_trace_time.csv";
  for (const char* step : {"1e300", "-5", "1.5"}) {
    std::ofstream(csv) << "Step,Computing,Communication(Not Overlapped),Stage,Preparing\r\n"
                       << step << ",10,2,20,1\r\n";
    auto t = ReadIterationTrace(csv);
    ASSERT_FALSE(t.ok()) << step;
    EXPECT_NE(t.status().message().find("not a step number"), std::string::npos) << t.status();
  }
  const std::string ms = ::testing::TempDir() + "/step_trace_raw_0_detail_time.csv";
  std::ofstream(ms) << "step_num,total,iteration_interval,fp_and_bp,tail\n1e19,1,1,1,1\n";
  EXPECT_FALSE(ReadIterationTrace(ms).ok());
}

TEST(MsprofStepTraceTest, TheSmallestIterationIdIsRead) {
  // previous_id == id - 1 overflowed for id = INT64_MIN (fuzz_msprof).
  const std::string json = ::testing::TempDir() + "/msprof_min/step_trace_0_1_1.json";
  std::filesystem::create_directories(::testing::TempDir() + "/msprof_min");
  std::ofstream(json) << R"([{"ph":"X","cat":"Iteration Time","dur":5,
    "args":{"Iteration ID":-9223372036854775808}},
    {"ph":"X","cat":"Iteration Time","dur":7,"args":{"Iteration ID":9223372036854775807}}])";
  auto t = ReadIterationTrace(json);
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->steps.size(), 2u);
  EXPECT_EQ(t->steps[1].step_time_ns(), 7000u);
}

}  // namespace
}  // namespace rankwatch
