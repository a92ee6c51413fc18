// TaskManager's assignment handling: assign (local store or changelog, whichever covers more
// input), revoke (checkpoint, hand over, release) and adoption of another instance's state,
// against a real RocksDB store per instance and the changelog on the embedded Kafka broker.
#include "runtime/task_manager.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <string>

#include "kafka/embedded_broker.h"
#include "runtime/test_batches.h"

namespace rankwatch {
namespace {

using testing::EncodedStep;

constexpr char kTopic[] = "telemetry";

// One daemon instance: its own store, writer, router and task manager; a shared changelog
// topic when given a broker.
struct Instance {
  Instance(const std::filesystem::path& dir, EmbeddedBroker* broker) {
    auto opened = StateStore::Open({dir});
    EXPECT_TRUE(opened.ok()) << opened.status();
    store = std::move(*opened);
    writer = std::make_unique<CheckpointWriter>(store.get(), CheckpointWriterOptions{}, nullptr,
                                                [this](const absl::Status& s) { health.Fail(s); });
    if (broker != nullptr) {
      StateChangelogOptions o;
      o.brokers = broker->bootstrap();
      o.topic = std::string(kTopic) + ".changelog";
      o.partitions = 2;
      auto log = StateChangelog::Open(o);
      EXPECT_TRUE(log.ok()) << log.status();
      changelog = std::move(*log);
    }
    JobRouterOptions options;
    options.topic = kTopic;
    options.task.pipeline.record_changes = true;
    router = std::make_unique<JobRouter>(options, TaskSinks{&metrics, &snapshots});
    manager = std::make_unique<TaskManager>(kTopic, store.get(), writer.get(), changelog.get(),
                                            router.get(), &metrics, &health);
  }
  ~Instance() {
    manager.reset();
    router.reset();
    writer.reset();
  }
  // Feeds `steps` steps of `job` on `partition` from offset `*offset` on.
  void Feed(const std::string& job, int32_t partition, uint64_t first, uint64_t steps,
            int64_t* offset) {
    for (uint64_t s = first; s < first + steps; ++s) {
      router->HandleMessage(EncodedStep(job, s), partition, (*offset)++, now, 0);
    }
    router->Tick(now, 0);
  }
  uint64_t AlignedSteps(const std::string& job) const {
    auto snap = snapshots.Get();
    auto it = snap->find(job);
    return it == snap->end() ? 0 : it->second->aligned_steps;
  }

  PrometheusRegistry registry;
  DaemonMetrics metrics{&registry, "test"};
  SnapshotStore snapshots;
  StateHealth health{&metrics, nullptr};
  std::unique_ptr<StateStore> store;
  std::unique_ptr<CheckpointWriter> writer;
  std::unique_ptr<StateChangelog> changelog;
  std::unique_ptr<JobRouter> router;
  std::unique_ptr<TaskManager> manager;
  const TimePoint now{};
};

class TaskManagerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    base_ = std::filesystem::path(::testing::TempDir()) /
            ("task-manager-" + std::to_string(::getpid()) + "-" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(base_);
    std::filesystem::create_directories(base_);
  }
  void TearDown() override { std::filesystem::remove_all(base_); }
  void StartBroker() {
    auto broker = EmbeddedBroker::Start({kTopic, 2, 1, /*changelog_topic=*/true});
    ASSERT_TRUE(broker.ok()) << broker.status();
    broker_ = std::move(*broker);
  }
  std::filesystem::path base_;
  std::unique_ptr<EmbeddedBroker> broker_;
  const TimePoint now{};
};

TEST_F(TaskManagerTest, ARestartResumesEachPartitionAtItsStoredOffsetAndReleasesOthers) {
  int64_t offsets[2] = {0, 0};
  {
    Instance a(base_ / "a", nullptr);
    a.manager->OnAssigned({0, 1}, now, 0);
    a.Feed("j0", 0, 1, 5, &offsets[0]);
    a.Feed("j1", 1, 1, 3, &offsets[1]);
    a.manager->Shutdown(now, 0);
  }
  Instance a(base_ / "a", nullptr);
  ASSERT_TRUE(a.manager->RestoreAll(now, 0).ok());
  a.router->Tick(now, 0);
  EXPECT_EQ(a.router->jobs(), 2u);  // served at once, before any assignment
  EXPECT_EQ(a.AlignedSteps("j0"), 5u);
  // The group gives this instance partition 1 only.
  const auto resume = a.manager->OnAssigned({1}, now, 0);
  ASSERT_EQ(resume.size(), 1u);
  EXPECT_EQ(resume[0], std::optional<int64_t>(3));
  EXPECT_EQ(a.router->JobsOf(1), std::vector<std::string>{"j1"});
  EXPECT_TRUE(a.router->JobsOf(0).empty()) << "partition 0 went to another instance";
  EXPECT_EQ(a.router->jobs(), 1u);
  EXPECT_EQ(a.snapshots.Get()->count("j0"), 0u);
}

TEST_F(TaskManagerTest, ARevokedPartitionIsCheckpointedAndReleasedWithItsStateKept) {
  int64_t offset = 0;
  Instance a(base_ / "a", nullptr);
  a.manager->OnAssigned({0}, now, 0);
  a.Feed("j0", 0, 1, 4, &offset);
  a.manager->OnRevoked({0}, now, 0);
  EXPECT_EQ(a.router->jobs(), 0u);
  EXPECT_EQ(a.snapshots.Get()->count("j0"), 0u);
  auto stored = a.store->Offsets();
  ASSERT_TRUE(stored.ok());
  EXPECT_EQ(stored->at({kTopic, 0}), 4);
  // Assigned again: the same state comes back from the local store.
  const auto resume = a.manager->OnAssigned({0}, now, 0);
  EXPECT_EQ(resume[0], std::optional<int64_t>(4));
  a.router->Tick(now, 0);
  EXPECT_EQ(a.AlignedSteps("j0"), 4u);
}

TEST_F(TaskManagerTest, ANewOwnerAdoptsTheChangelogWhenItCoversMoreThanItsStore) {
  StartBroker();
  int64_t offset = 0;
  Instance b(base_ / "b", broker_.get());
  {
    // b owned partition 0 once, long ago: its store has an old state of it.
    b.manager->OnAssigned({0}, now, 0);
    b.Feed("j0", 0, 1, 2, &offset);
    b.manager->OnRevoked({0}, now, 0);
  }
  Instance a(base_ / "a", broker_.get());
  a.manager->OnAssigned({0}, now, 0);
  a.Feed("j0", 0, 3, 6, &offset);  // a continues from offset 2 (as Kafka would resume it)
  a.Feed("j-new", 0, 1, 2, &offset);
  a.manager->OnRevoked({0}, now, 0);  // checkpoint, changelog flushed, handed over
  ASSERT_EQ(offset, 10);

  const auto resume = b.manager->OnAssigned({0}, now, 0);
  ASSERT_EQ(resume.size(), 1u);
  EXPECT_EQ(resume[0], std::optional<int64_t>(10)) << "the changelog covers more than b's store";
  b.router->Tick(now, 0);
  EXPECT_EQ(b.AlignedSteps("j-new"), 2u);
  // b's store holds the adopted state with its offset: a restart of b needs no changelog.
  auto stored = b.store->Offsets();
  ASSERT_TRUE(stored.ok());
  EXPECT_EQ(stored->at({kTopic, 0}), 10);
  auto jobs = job_state::ReadJobs(*b.store, 0);
  ASSERT_TRUE(jobs.ok());
  EXPECT_EQ(jobs->size(), 2u);
}

// An instance got a partition with no state anywhere and read nothing there before it was
// revoked: where its input began goes to the changelog all the same, so the next owner resumes
// there (and counts what the log lost since) rather than at the log's end at its own assignment.
TEST_F(TaskManagerTest, WhereAPartitionsInputBeganReachesTheNextOwnerBeforeAnythingIsRead) {
  StartBroker();
  Instance a(base_ / "a", broker_.get());
  EXPECT_EQ(a.manager->OnAssigned({1}, now, 0), std::vector<std::optional<int64_t>>{std::nullopt});
  a.router->StartsAt(1, 40);  // the consumer: the log's end when it was assigned
  a.manager->OnRevoked({1}, now, 0);
  Instance b(base_ / "b", broker_.get());
  EXPECT_EQ(b.manager->OnAssigned({1}, now, 0), std::vector<std::optional<int64_t>>{40});
}

// A restart's rejoin can take longer than the alignment timeout (10 s): a step restored with a
// rank missing must wait for that rank's record, which comes once the partition is read again,
// not close as timed out while nothing could be read.
TEST_F(TaskManagerTest, ARestoredOpenStepWaitsForItsPartitionToBeReadAgain) {
  int64_t offset = 0;
  {
    Instance a(base_ / "a", nullptr);
    a.manager->OnAssigned({0}, now, 0);
    a.router->HandleMessage(EncodedStep("two", 1, /*rank=*/0, /*world=*/2), 0, offset++, now, 0);
    a.manager->Shutdown(now, 0);  // step 1 open, rank 1 missing
  }
  Instance a(base_ / "a", nullptr);
  const TimePoint restart = now + std::chrono::seconds(100);
  ASSERT_TRUE(a.manager->RestoreAll(restart, 0).ok());
  const TimePoint rejoined = restart + std::chrono::seconds(15);
  a.router->Tick(rejoined - std::chrono::seconds(1), 0);  // waiting for the group
  EXPECT_EQ(a.manager->OnAssigned({0}, rejoined, 0), std::vector<std::optional<int64_t>>{1});
  a.router->HandleMessage(EncodedStep("two", 1, /*rank=*/1, /*world=*/2), 0, offset++,
                          rejoined + std::chrono::seconds(1), 0);
  a.router->Tick(rejoined + std::chrono::seconds(1), 0);
  auto snap = a.snapshots.Get();
  ASSERT_EQ(snap->count("two"), 1u);
  EXPECT_EQ(snap->at("two")->aligned_steps, 1u);
  EXPECT_EQ(snap->at("two")->timed_out_steps, 0u) << "closed while its partition was not read";
  // Once read again, the timeout runs: a step left open closes 10 s later.
  a.router->HandleMessage(EncodedStep("two", 2, /*rank=*/0, /*world=*/2), 0, offset++,
                          rejoined + std::chrono::seconds(2), 0);
  a.router->Tick(rejoined + std::chrono::seconds(13), 0);
  EXPECT_EQ(a.snapshots.Get()->at("two")->timed_out_steps, 1u);
}

TEST_F(TaskManagerTest, TheLocalStoreWinsWhenTheChangelogIsBehindIt) {
  StartBroker();
  int64_t offset = 0;
  {
    Instance a(base_ / "a", broker_.get());
    a.manager->OnAssigned({1}, now, 0);
    a.Feed("j1", 1, 1, 3, &offset);
    a.manager->OnRevoked({1}, now, 0);  // the changelog has partition 1 up to offset 3
  }
  // The same instance later consumed further with no changelog (it restarted without the
  // flag): its store covers more than the changelog.
  {
    Instance a(base_ / "a", nullptr);
    a.manager->OnAssigned({1}, now, 0);
    a.Feed("j1", 1, 4, 4, &offset);
    a.manager->Shutdown(now, 0);
  }
  Instance a(base_ / "a", broker_.get());
  const auto resume = a.manager->OnAssigned({1}, now, 0);
  EXPECT_EQ(resume[0], std::optional<int64_t>(7));
  a.router->Tick(now, 0);
  EXPECT_EQ(a.AlignedSteps("j1"), 7u);
}

TEST_F(TaskManagerTest, AStorageErrorStopsCheckpointsForGood) {
  int64_t offset = 0;
  Instance a(base_ / "a", nullptr);
  a.manager->OnAssigned({0}, now, 0);
  a.health.Fail(absl::DataLossError("disk gone"));
  a.Feed("j0", 0, 1, 3, &offset);
  EXPECT_TRUE(a.manager->Checkpoint(now, 0));
  a.manager->Shutdown(now, 0);
  auto stored = a.store->Offsets();
  ASSERT_TRUE(stored.ok());
  EXPECT_EQ(stored->count({kTopic, 0}), 0u) << "nothing is written after a failure";
  EXPECT_EQ(a.metrics.state_healthy->Get(), 0);
  EXPECT_EQ(a.router->jobs(), 1u) << "the last good diagnoses stay served";
}

}  // namespace
}  // namespace rankwatch
