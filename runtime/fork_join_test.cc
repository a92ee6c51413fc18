#include "runtime/fork_join.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace rankwatch {
namespace {

class ForkJoinTest : public ::testing::TestWithParam<size_t> {};

TEST_P(ForkJoinTest, HasTheWorkersAndTheCallersLane) {
  ForkJoin fj(GetParam());
  EXPECT_EQ(fj.lanes(), GetParam() + 1);
}

// Every lane runs once, lane 0 on the caller, and Run returns only after each has finished
// (each sleeps before it sets its flag, so a Run that returned early would find one unset).
TEST_P(ForkJoinTest, RunsEveryLaneOnceLaneZeroOnTheCallerAndWaitsForAll) {
  ForkJoin fj(GetParam());
  const size_t lanes = fj.lanes();
  const std::thread::id caller = std::this_thread::get_id();
  for (int run = 0; run < 5; ++run) {
    std::vector<std::atomic<int>> calls(lanes);
    std::vector<std::atomic<bool>> done(lanes);
    std::vector<std::thread::id> thread_of(lanes);
    for (size_t i = 0; i < lanes; ++i) {
      calls[i] = 0;
      done[i] = false;
    }
    fj.Run([&](size_t lane) {
      ASSERT_LT(lane, lanes);
      calls[lane].fetch_add(1);
      thread_of[lane] = std::this_thread::get_id();
      // Lane 0 returns at once: the others finish well after it.
      if (lane != 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
      done[lane].store(true);
    });
    for (size_t i = 0; i < lanes; ++i) {
      EXPECT_EQ(calls[i].load(), 1) << "lane " << i << " of run " << run;
      EXPECT_TRUE(done[i].load()) << "Run returned before lane " << i << " of run " << run;
    }
    EXPECT_EQ(thread_of[0], caller);
    for (size_t i = 1; i < lanes; ++i) {
      EXPECT_NE(thread_of[i], caller) << "lane " << i;
      for (size_t j = 1; j < i; ++j) EXPECT_NE(thread_of[i], thread_of[j]) << i << " " << j;
    }
  }
}

// The lanes run at once: each waits (bounded) until every lane has started.
TEST_P(ForkJoinTest, LanesRunConcurrently) {
  ForkJoin fj(GetParam());
  const size_t lanes = fj.lanes();
  std::atomic<size_t> started{0};
  std::atomic<bool> all_met{true};
  fj.Run([&](size_t) {
    started.fetch_add(1);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (started.load() < lanes) {
      if (std::chrono::steady_clock::now() > deadline) {
        all_met = false;
        return;
      }
      std::this_thread::yield();
    }
  });
  EXPECT_TRUE(all_met.load());
  EXPECT_EQ(started.load(), lanes);
}

// Many short runs in a row: no run is lost or run twice (a worker that missed a start, or ran
// one start twice, would hang Run or leave a count off).
TEST_P(ForkJoinTest, ManyConsecutiveRuns) {
  ForkJoin fj(GetParam());
  const size_t lanes = fj.lanes();
  constexpr int kRuns = 2000;
  std::vector<std::atomic<int>> calls(lanes);
  for (auto& c : calls) c = 0;
  std::atomic<int> in_run{0};
  for (int run = 0; run < kRuns; ++run) {
    std::atomic<size_t> this_run{0};
    fj.Run([&](size_t lane) {
      in_run.fetch_add(1);
      calls[lane].fetch_add(1);
      this_run.fetch_add(1);
      in_run.fetch_sub(1);
    });
    ASSERT_EQ(this_run.load(), lanes) << "run " << run;
    ASSERT_EQ(in_run.load(), 0) << "run " << run << " returned with a lane still running";
  }
  for (size_t i = 0; i < lanes; ++i) EXPECT_EQ(calls[i].load(), kRuns) << "lane " << i;
}

// A run's work, shared out through an atomic counter as JobRouter::HandleMessages does: every
// item is done once, whichever lane takes it.
TEST_P(ForkJoinTest, SharesOutWorkThroughACounter) {
  ForkJoin fj(GetParam());
  constexpr size_t kItems = 1000;
  for (int run = 0; run < 50; ++run) {
    std::vector<std::atomic<int>> done(kItems);
    for (auto& d : done) d = 0;
    std::atomic<size_t> next{0};
    fj.Run([&](size_t) {
      for (size_t k; (k = next.fetch_add(1)) < kItems;) done[k].fetch_add(1);
    });
    for (size_t k = 0; k < kItems; ++k) ASSERT_EQ(done[k].load(), 1) << "item " << k;
  }
}

// Destruction joins the workers: idle ones, ones that never ran, and right after a run.
TEST_P(ForkJoinTest, DestructionJoinsCleanly) {
  { ForkJoin never_ran(GetParam()); }
  for (int i = 0; i < 100; ++i) {
    auto fj = std::make_unique<ForkJoin>(GetParam());
    std::atomic<int> calls{0};
    fj->Run([&](size_t) { calls.fetch_add(1); });
    fj.reset();
    EXPECT_EQ(calls.load(), static_cast<int>(GetParam() + 1));
  }
}

INSTANTIATE_TEST_SUITE_P(Workers, ForkJoinTest, ::testing::Values(0, 1, 3),
                         [](const ::testing::TestParamInfo<size_t>& info) {
                           return std::to_string(info.param) + "Workers";
                         });

}  // namespace
}  // namespace rankwatch
