// JobRouter::Checkpoint with a byte budget: whole partitions (jobs and offset together), oldest
// changes first, everything eventually.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <set>

#include "collectors/simulator/fleet_model.h"
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

// A pipeline job's what-if through the state store: the ops of the steps in its window (keys "w"
// job step, the older ones deleted as the window moves) and its state with the job's metadata;
// a router restored from the store shows the same what-if, and goes on like the original.
TEST_F(JobRouterCheckpointTest, APipelineJobsWhatIfIsRestoredFromTheStore) {
  const auto dir = std::filesystem::path(::testing::TempDir()) / "job_router_checkpoint_whatif";
  std::filesystem::remove_all(dir);
  FleetOptions o;
  o.parallel = PipelineSpec{.dp = 2, .pp = 2, .tp = 1, .microbatches = 4};
  o.ranks = o.parallel->world_size();
  o.faults.push_back(*ParseFaultSpec("slow-worker:dp=0,pp=1,factor=1.4:10"));
  ASSERT_TRUE(CheckFleetOptions(o).ok());
  FleetModel model(o);
  std::vector<std::string> messages;
  std::vector<v1::StepRecord> records;
  std::vector<bool> reported;
  for (uint64_t step = 0; step < 150; ++step) {
    model.Step(step, &records, &reported);
    for (uint32_t r = 0; r < o.ranks; ++r) {
      v1::Batch b;
      b.set_schema_version(kSchemaVersion);
      b.mutable_source()->set_training_job("pipe");
      b.mutable_source()->set_rank(r);
      b.mutable_source()->set_world_size(o.ranks);
      *b.mutable_source()->mutable_layout() = model.LayoutOf(r);
      *b.add_steps() = records[r];
      messages.push_back(b.SerializeAsString());
    }
  }
  auto count_whatif_keys = [](const StateStore& store) {
    size_t n = 0;
    EXPECT_TRUE(store
                    .ForEach(StateFamily::kJobs, std::string("wpipe") + '\0',
                             [&](std::string_view, std::string_view) { ++n; })
                    .ok());
    return n;
  };
  JobRouter original(options, {&metrics, &snapshots});
  const size_t crash_at = 120 * 4 + 2;  // step 120 half-reported
  // A message every 5 ms (the daemon re-evaluates a job at most every ten times its cost).
  auto at = [&](size_t i) { return t0 + std::chrono::milliseconds(5 * i); };
  {
    auto store = StateStore::Open({dir});
    ASSERT_TRUE(store.ok());
    for (size_t i = 0; i < crash_at; ++i) {
      original.HandleMessage(messages[i], 0, static_cast<int64_t>(i), at(i), 0);
      if (i % 8 == 7) original.Tick(at(i), 0);
      if (i % 10 == 9 || i + 1 == crash_at) {
        Checkpoint c;
        original.Checkpoint(&c, at(i), 0);
        ASSERT_TRUE((*store)->Commit(c).ok());
      }
    }
    EXPECT_EQ(count_whatif_keys(**store), 64u) << "the what-if's window, no more";
  }
  auto store = StateStore::Open({dir});
  ASSERT_TRUE(store.ok());
  PrometheusRegistry r2;
  DaemonMetrics m2(&r2, "test");
  SnapshotStore restored_snapshots;
  JobRouter restored(options, {&m2, &restored_snapshots});
  ASSERT_TRUE(restored.Restore(**store, at(crash_at), 0).ok());
  for (size_t i = crash_at; i < messages.size(); ++i) {
    for (JobRouter* router : {&original, &restored}) {
      router->HandleMessage(messages[i], 0, static_cast<int64_t>(i), at(i), 0);
      if (i % 8 == 7) router->Tick(at(i), 0);
    }
  }
  original.Tick(at(messages.size() + 200), 0);
  restored.Tick(at(messages.size() + 200), 0);
  const auto a = snapshots.Get()->at("pipe");
  const auto b = restored_snapshots.Get()->at("pipe");
  ASSERT_NE(a->whatif, nullptr);
  ASSERT_NE(b->whatif, nullptr);
  EXPECT_EQ(a->whatif->verdict.verdict, whatif::Verdict::kSlowWorker) << a->whatif->verdict.note;
  EXPECT_EQ(b->whatif->verdict.verdict, a->whatif->verdict.verdict) << b->whatif->verdict.note;
  EXPECT_EQ(b->whatif->analysed_steps, 150u);
  EXPECT_EQ(b->whatif->skipped_steps, 0u) << b->whatif->last_error;
  EXPECT_DOUBLE_EQ(b->whatif->result.slowdown, a->whatif->result.slowdown);
  EXPECT_EQ(a->whatif->since_step, 10u);
  EXPECT_EQ(b->whatif->since_step, a->whatif->since_step);
  EXPECT_EQ(b->step.straggler.since_step, 10u);

  // A job removed for good takes its what-if keys with it.
  Checkpoint c;
  job_state::DeleteJob("pipe", &c);
  ASSERT_TRUE((*store)->Commit(c).ok());
  EXPECT_EQ(count_whatif_keys(**store), 0u);
}

}  // namespace
}  // namespace rankwatch
