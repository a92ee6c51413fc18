#include "daemon/job_router.h"

#include <gtest/gtest.h>

namespace rankwatch {
namespace {

std::string Encoded(const std::string& job, uint32_t rank, uint32_t world, uint64_t step) {
  v1::Batch b;
  b.set_schema_version(1);
  b.mutable_source()->set_training_job(job);
  b.mutable_source()->set_rank(rank);
  b.mutable_source()->set_world_size(world);
  v1::StepRecord* r = b.add_steps();
  r->set_step(step);
  r->set_forward_ns(30'000'000);
  r->set_step_time_ns(100'000'000);
  return b.SerializeAsString();
}

class JobRouterTest : public ::testing::Test {
 protected:
  MetricsRegistry registry;
  DaemonMetrics metrics{&registry, "test"};
  SnapshotStore snapshots;
  const TimePoint t0{};
};

TEST_F(JobRouterTest, RoutesJobsCountsEventsAndPublishesSnapshots) {
  JobRouter router({}, &metrics, &snapshots);
  for (uint32_t r = 0; r < 2; ++r) router.HandleMessage(Encoded("a", r, 2, 1), t0, 0);
  router.HandleMessage(Encoded("b", 0, 3, 1), t0, 0);
  router.Tick(t0);
  EXPECT_EQ(router.jobs(), 2u);
  EXPECT_EQ(metrics.events_steps->Get(), 3);
  EXPECT_EQ(metrics.StepsAligned("a")->Get(), 1);
  EXPECT_EQ(metrics.StepsAligned("b")->Get(), 0);
  auto snap = snapshots.Get();
  ASSERT_EQ(snap->size(), 2u);
  EXPECT_EQ(snap->at("a")->aligned_steps, 1u);
  EXPECT_EQ(snap->at("b")->ranks_seen, 1u);
  const std::string text = registry.Render();
  EXPECT_NE(text.find("rankwatch_step_phase_seconds{training_job=\"a\",phase=\"forward\","
                      "stat=\"median\"} 0.03"),
            std::string::npos)
      << text;
}

TEST_F(JobRouterTest, CountsRejectionsByReasonAndKeepsGoing) {
  JobRouter router({}, &metrics, &snapshots);
  router.HandleMessage("not a batch at all", t0, 0);
  router.HandleMessage("", t0, 0);
  router.HandleMessage(Encoded("a", 0, 1, 1), t0, 0);
  router.HandleMessage(Encoded("a", 0, 1, 1), t0, 0);  // redelivered
  router.Tick(t0);
  EXPECT_EQ(metrics.rejected_by_reason[static_cast<int>(RejectReason::kMalformed)]->Get(), 1);
  EXPECT_EQ(metrics.rejected_by_reason[static_cast<int>(RejectReason::kSchemaVersion)]->Get(), 1);
  EXPECT_EQ(metrics.rejected_duplicate->Get(), 1);
  EXPECT_EQ(metrics.StepsAligned("a")->Get(), 1);
}

TEST_F(JobRouterTest, StepCountsAppearOnlyWithTheirSnapshot) {
  JobRouter router({}, &metrics, &snapshots);
  router.HandleMessage(Encoded("a", 0, 1, 1), t0, 0);
  EXPECT_EQ(metrics.StepsAligned("a")->Get(), 0);
  EXPECT_TRUE(snapshots.Get()->empty());
  router.Tick(t0);
  EXPECT_EQ(metrics.StepsAligned("a")->Get(), 1);
  EXPECT_EQ(snapshots.Get()->at("a")->aligned_steps, 1u);
}

TEST_F(JobRouterTest, RefusesJobsBeyondTheLimit) {
  JobRouterOptions o;
  o.max_jobs = 1;
  JobRouter router(o, &metrics, &snapshots);
  router.HandleMessage(Encoded("a", 0, 1, 1), t0, 0);
  router.HandleMessage(Encoded("b", 0, 1, 1), t0, 0);
  EXPECT_EQ(router.jobs(), 1u);
  EXPECT_EQ(metrics.rejected_too_many_jobs->Get(), 1);
}

}  // namespace
}  // namespace rankwatch
