#include "traces/whatif_chrome_trace.h"

#include <simdjson.h>

#include <string>

#include "gtest/gtest.h"

namespace rankwatch {
namespace {

using whatif::OpKind;

const std::string kFixtures = std::string(RANKWATCH_FIXTURES) + "/whatif-stragglers";

absl::StatusOr<WhatifTrace> Parse(const std::string& json, const std::string& meta = "") {
  const simdjson::padded_string padded(json);
  return ParseWhatifChromeTrace(std::string_view(padded.data(), padded.size()), meta,
                                "timeline-t.json");
}

// Two data ranks, one stage; thread names first or last must not matter.
const std::string kThreads =
    R"({"ph":"M","name":"thread_name","pid":0,"tid":0,"args":{"name":"PP rank 0, TP rank 0, compute"}},
       {"ph":"M","name":"thread_name","pid":1,"tid":5,"args":{"name":"PP rank 0, TP rank 0, compute"}},
       {"ph":"M","name":"thread_name","pid":1,"tid":6,"args":{"name":"PP rank 0, TP rank 1, compute"}})";

std::string Event(const std::string& name, int pid, int tid, double ts, double dur, int step,
                  int mb = -1, int chunk = -1, int seq = 0) {
  return R"({"ph":"X","name":")" + name + R"(","pid":)" + std::to_string(pid) + R"(,"tid":)" +
         std::to_string(tid) + R"(,"ts":)" + std::to_string(ts) + R"(,"dur":)" +
         std::to_string(dur) + R"(,"args":{"step":)" + std::to_string(step) + R"(,"mb_id":)" +
         std::to_string(mb) + R"(,"model_chunk":)" + std::to_string(chunk) + R"(,"seq_id":)" +
         std::to_string(seq) + "}}";
}

TEST(WhatifChromeTrace, InfersTheLayoutAndSortsEachWorkersOps) {
  const std::string json = "[" + Event("optimizer", 0, 0, 50, 5, 7) + "," +
                           Event("forward-compute", 0, 0, 10, 20, 7, 0, 0) + "," +
                           Event("forward-compute", 1, 5, 12, 20, 7, 0, 0) + "," +
                           Event("forward-compute", 1, 6, 12, 20, 7, 0, 0) + "," +
                           Event("separate-grads-all-reduce", 1, 5, 40, 3, 7) + "," + kThreads +
                           "]";
  auto t = Parse(json);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->layout, (whatif::Layout{2, 1, 2, 1}));
  EXPECT_EQ(t->trial_name, "t");
  EXPECT_EQ(t->events, 4u);
  EXPECT_EQ(t->other_tp_events, 1u);
  ASSERT_EQ(t->steps.size(), 1u);
  EXPECT_EQ(t->steps[0].step, 7u);
  ASSERT_EQ(t->steps[0].workers.size(), 2u);
  const auto& w0 = t->steps[0].workers[0];
  ASSERT_EQ(w0.size(), 2u);
  EXPECT_EQ(w0[0].kind, OpKind::kForwardCompute);
  EXPECT_EQ(w0[0].start_us, 10);
  EXPECT_EQ(w0[0].duration_us, 20);
  EXPECT_EQ(w0[1].kind, OpKind::kOptimizer);
  EXPECT_EQ(t->steps[0].workers[1][1].kind, OpKind::kGradsAllReduce);
}

TEST(WhatifChromeTrace, ANegativeDurationIsClockNoiseReadAsZero) {
  auto t = Parse("[" + kThreads + "," + Event("gc", 0, 0, 5, -0.5, 1) + "," +
                 Event("gc", 1, 5, 5, 2, 1) + "]");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->negative_durations, 1u);
  EXPECT_EQ(t->steps[0].workers[0][0].duration_us, 0);
  EXPECT_EQ(t->steps[0].workers[1][0].duration_us, 2);
}

TEST(WhatifChromeTrace, TheMetaFileGivesTheLayout) {
  const std::string json = "{\"traceEvents\":[" + kThreads + "," +
                           Event("forward-compute", 0, 0, 0, 1, 3) + "," +
                           Event("forward-compute", 1, 5, 0, 1, 3) + "]}";
  auto t = Parse(json,
                 "trial_name: X\ndp_size: 2\npp_size: 1\ntp_size: 4\nvpp_size: 1\n"
                 "dsp_size: 2\nworld_size: 16\n");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->layout, (whatif::Layout{2, 1, 4, 1}));
  EXPECT_EQ(t->context_parallel, 2u);
  EXPECT_EQ(t->trial_name, "X");
}

TEST(WhatifChromeTrace, MalformedInputIsOneLineSayingWhy) {
  auto expect_error = [](const absl::StatusOr<WhatifTrace>& t, const std::string& part) {
    ASSERT_FALSE(t.ok());
    const std::string msg(t.status().message());
    EXPECT_NE(msg.find(part), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  };
  expect_error(Parse("[{"), "not valid JSON");
  expect_error(Parse("3"), "not a Chrome trace");
  expect_error(Parse("[" + kThreads + "," + Event("backward-thing", 0, 0, 0, 1, 1) + "]"),
               "unknown op type 'backward-thing'");
  expect_error(Parse("[" + kThreads + "," + Event("gc", 0, 9, 0, 1, 1) + "]"),
               "without a thread_name");
  expect_error(Parse(R"([{"ph":"X","name":"gc","pid":0,"tid":0,"ts":1,"dur":1,"args":{}}])"),
               "no args.step");
  expect_error(Parse(R"([{"ph":"X","name":"gc","pid":0,"tid":0,"dur":1,"args":{"step":1}}])"),
               "must be numbers");
  expect_error(
      Parse(R"([{"ph":"M","name":"thread_name","pid":0,"tid":0,"args":{"name":"rank 0"}}])"),
      "is not \"PP rank");
  // Data rank 1 has ops in step 1 only.
  expect_error(Parse("[" + kThreads + "," + Event("gc", 0, 0, 0, 1, 1) + "," +
                     Event("gc", 1, 5, 0, 1, 1) + "," + Event("gc", 0, 0, 0, 1, 2) + "]"),
               "step 2: no ops of data rank 1, stage 0");
  expect_error(Parse("[" + kThreads + "," + Event("gc", 1, 5, 0, 1, 1) + "]", "dp_size: 1\n"),
               "outside the meta file's dp 1");
  expect_error(Parse("[" + kThreads + "]", "dp_size: two\n"), "dp_size must be a positive");
  expect_error(Parse("[" + kThreads + "]", "dp_size: 2\npp_size: 1\nworld_size: 3\n"),
               "world_size 3 is not");
}

TEST(WhatifChromeTrace, ReadsTheStudysSlowWorkerJob) {
  auto t = ReadWhatifChromeTrace(kFixtures + "/AR");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->trial_name, "AR");
  EXPECT_EQ(t->layout, (whatif::Layout{4, 4, 4, 1}));
  EXPECT_EQ(t->meta_file.filename(), "meta-AR.yaml");
  ASSERT_EQ(t->steps.size(), 44u);
  EXPECT_EQ(t->steps.front().step, 16u);
  EXPECT_EQ(t->steps.back().step, 1238u);
  EXPECT_EQ(t->events, 44u * 2664u);
  for (const auto& step : t->steps) {
    for (const auto& worker : step.workers) {
      int forward = 0;
      for (const auto& op : worker) forward += op.kind == OpKind::kForwardCompute;
      EXPECT_EQ(forward, 32);
      for (size_t i = 1; i < worker.size(); ++i) {
        ASSERT_LE(worker[i - 1].start_us, worker[i].start_us);
      }
    }
  }
  // Stage 0 data rank 0 opens step 16 with its params all-gather.
  EXPECT_EQ(t->steps[0].workers[0][0].kind, OpKind::kParamsAllGather);

  const auto timeline = WhatifWorkerTimeline(*t, 5);
  size_t ops = 0;
  for (const auto& step : t->steps) ops += step.workers[5].size();
  ASSERT_EQ(timeline.size(), ops);
  EXPECT_EQ(timeline.front().step, 16u);
  EXPECT_EQ(timeline.back().step, 1238u);
  for (size_t i = 1; i < timeline.size(); ++i) {
    ASSERT_LE(timeline[i - 1].op.start_us, timeline[i].op.start_us);
  }
}

TEST(WhatifChromeTrace, ReadsTheStudysStageImbalanceJob) {
  auto t = ReadWhatifChromeTrace(kFixtures + "/ST/timeline-ST.json.gz");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->layout, (whatif::Layout{2, 4, 1, 1}));
  EXPECT_EQ(t->steps.size(), 32u);
  EXPECT_EQ(t->steps[0].workers.size(), 8u);
}

TEST(WhatifChromeTrace, AMissingFileIsNotFound) {
  auto t = ReadWhatifChromeTrace(kFixtures + "/nope/timeline-x.json.gz");
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace rankwatch
