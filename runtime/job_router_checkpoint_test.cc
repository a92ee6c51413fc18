// JobRouter::Checkpoint with a byte budget: whole partitions (jobs and offset together), oldest
// changes first, everything eventually.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <set>

#include "runtime/job_router.h"
#include "runtime/test_batches.h"

namespace rankwatch {
namespace {

using testing::EncodedStep;

// What one checkpoint holds: jobs whose metadata it writes, and the partitions of its offsets.
struct Contents {
  std::set<std::string> jobs;
  std::map<int32_t, int64_t> offsets;
};

Contents Read(Checkpoint c) {
  c.Materialize();
  Contents out;
  for (const Checkpoint::Op& op : c.ops()) {
    if (op.family == StateFamily::kJobs && op.value && op.key[0] == 'm') {
      out.jobs.insert(op.key.substr(1));
    }
    if (op.family == StateFamily::kOffsets) {
      out.offsets[std::stoi(op.key.substr(op.key.find('\0') + 1))] = std::stoll(*op.value);
    }
  }
  return out;
}

class JobRouterCheckpointTest : public ::testing::Test {
 protected:
  JobRouterCheckpointTest() {
    options.task.pipeline.record_changes = true;
    options.topic = "t";
  }

  // Jobs "p<partition>-<i>", two per partition 0..3, fed `steps` steps from `first`; and
  // two jobs of an unknown partition.
  void Feed(JobRouter& router, uint64_t first, uint64_t steps) {
    for (uint64_t s = first; s < first + steps; ++s) {
      for (int32_t p = 0; p < 4; ++p) {
        for (int i = 0; i < 2; ++i) {
          router.HandleMessage(EncodedStep("p" + std::to_string(p) + "-" + std::to_string(i), s), p,
                               next_offset[p]++, t0, 0);
        }
      }
      router.HandleMessage(EncodedStep("unknown-0", s), t0, 0);
      router.HandleMessage(EncodedStep("unknown-1", s), t0, 0);
    }
  }

  static int32_t PartitionOf(const std::string& job) {
    return job.starts_with("unknown") ? -1 : job[1] - '0';
  }

  PrometheusRegistry registry;
  DaemonMetrics metrics{&registry, "test"};
  SnapshotStore snapshots;
  JobRouterOptions options;
  const TimePoint t0{};
  std::map<int32_t, int64_t> next_offset;
};

TEST_F(JobRouterCheckpointTest, ABudgetCollectsWholePartitionsWithTheirOffsets) {
  JobRouter router(options, {&metrics, &snapshots});
  Feed(router, 1, 5);
  std::set<int32_t> seen;
  for (int round = 0; round < 5; ++round) {
    Checkpoint c;
    const bool complete = router.Checkpoint(&c, t0, 0, nullptr, /*max_bytes=*/1);
    EXPECT_EQ(complete, round == 4) << round;
    const Contents got = Read(std::move(c));
    // One group per round (the first one crosses a 1-byte budget): both of its jobs...
    ASSERT_EQ(got.jobs.size(), 2u) << round;
    const int32_t partition = PartitionOf(*got.jobs.begin());
    EXPECT_EQ(PartitionOf(*got.jobs.rbegin()), partition);
    EXPECT_TRUE(seen.insert(partition).second) << "partition " << partition << " twice";
    // ...with its offset, and no offset of a partition whose changes wait.
    std::map<int32_t, int64_t> expected;
    for (int32_t p : seen) {
      if (p >= 0) expected[p] = next_offset[p];
    }
    EXPECT_EQ(got.offsets, expected) << round;
  }
  EXPECT_EQ(seen, (std::set<int32_t>{-1, 0, 1, 2, 3}));
  Checkpoint idle;
  EXPECT_TRUE(router.Checkpoint(&idle, t0, 0, nullptr, 1));
  EXPECT_TRUE(Read(std::move(idle)).jobs.empty());
}

TEST_F(JobRouterCheckpointTest, TheOldestChangesGoFirst) {
  JobRouter router(options, {&metrics, &snapshots});
  Feed(router, 1, 3);
  Checkpoint first;
  router.Checkpoint(&first, t0, 0, nullptr, 1);
  const int32_t done = PartitionOf(*Read(std::move(first)).jobs.begin());
  Feed(router, 4, 1);  // every partition changes again, `done` included
  std::vector<int32_t> order;
  for (int round = 0; round < 5; ++round) {
    Checkpoint c;
    router.Checkpoint(&c, t0, 0, nullptr, 1);
    order.push_back(PartitionOf(*Read(std::move(c)).jobs.begin()));
  }
  EXPECT_EQ(order.back(), done) << "the partition written first waited least";
  EXPECT_EQ(std::set<int32_t>(order.begin(), order.end()), (std::set<int32_t>{-1, 0, 1, 2, 3}));
}

TEST_F(JobRouterCheckpointTest, SpreadCheckpointsRestoreEveryJobExactly) {
  const auto dir = std::filesystem::path(::testing::TempDir()) / "job_router_checkpoint_spread";
  std::filesystem::remove_all(dir);
  {
    auto store = StateStore::Open({dir});
    ASSERT_TRUE(store.ok());
    JobRouter router(options, {&metrics, &snapshots});
    Feed(router, 1, 6);
    // A budget of about one partition: several rounds, input arriving in between.
    int rounds = 0;
    for (uint64_t step = 7;; ++step, ++rounds) {
      Checkpoint c;
      const bool complete = router.Checkpoint(&c, t0, 0, nullptr, 1);
      ASSERT_TRUE((*store)->Commit(c).ok());
      if (complete && step > 9) break;
      if (step <= 9) Feed(router, step, 1);
      ASSERT_LT(rounds, 50);
    }
    EXPECT_GT(rounds, 4);
    auto offsets = (*store)->Offsets();
    ASSERT_TRUE(offsets.ok());
    for (int32_t p = 0; p < 4; ++p) EXPECT_EQ((offsets->at({"t", p})), next_offset[p]) << p;
  }
  auto store = StateStore::Open({dir});
  ASSERT_TRUE(store.ok());
  PrometheusRegistry r2;
  DaemonMetrics m2(&r2, "test");
  SnapshotStore restored_snapshots;
  JobRouter restored(options, {&m2, &restored_snapshots});
  ASSERT_TRUE(restored.Restore(**store, t0, 0).ok());
  EXPECT_EQ(restored.jobs(), 10u);
  restored.Tick(t0, 0);
  auto snap = restored_snapshots.Get();
  ASSERT_EQ(snap->size(), 10u);
  // World size 1: every step is aligned as it arrives; 9 steps each.
  for (const auto& [job, s] : *snap) EXPECT_EQ(s->aligned_steps, 9u) << job;
}

// A partition assigned with no stored offset stores where its input begins before anything is
// read there, so that a restart before the first read still knows it.
TEST_F(JobRouterCheckpointTest, APartitionWithoutAStoredOffsetStoresWhereItsInputBegins) {
  JobRouter router(options, {&metrics, &snapshots});
  router.StartsAt(2, 500);
  Checkpoint c;
  router.Checkpoint(&c, t0, 0);
  EXPECT_EQ(Read(std::move(c)).offsets, (std::map<int32_t, int64_t>{{2, 500}}));
  router.HandleMessage(EncodedStep("p2-0", 1), 2, 500, t0, 0);
  Checkpoint d;
  router.Checkpoint(&d, t0, 0);
  EXPECT_EQ(Read(std::move(d)).offsets, (std::map<int32_t, int64_t>{{2, 501}}));
}

// Messages lost before the first read mark the jobs found after the gap, up to where the log
// ended when the loss was found; a job first seen after that was not among them.
TEST_F(JobRouterCheckpointTest, ALossBeforeTheFirstReadMarksTheJobsFoundAfterIt) {
  JobRouter router(options, {&metrics, &snapshots});
  router.StartsAt(0, 0);
  router.HandleMessage(EncodedStep("other", 1), 1, 0, t0, 0);  // another partition
  router.InputLost(0, 700, /*log_end=*/1000);
  int64_t offset = 700;
  for (uint64_t step = 1; offset < 1000; ++step) {
    router.HandleMessage(EncodedStep("burst", step), 0, offset++, t0, 0);
  }
  router.HandleMessage(EncodedStep("later", 1), 0, offset++, t0, 0);
  router.InputLost(0, 5, /*log_end=*/1006);  // a second loss marks the jobs there
  router.Tick(t0, 0);
  auto snap = snapshots.Get();
  ASSERT_EQ(snap->size(), 3u);
  EXPECT_EQ(snap->at("burst")->input_lost_messages, 705u);
  EXPECT_EQ(snap->at("later")->input_lost_messages, 5u);
  EXPECT_EQ(snap->at("other")->input_lost_messages, 0u);
}

}  // namespace
}  // namespace rankwatch
