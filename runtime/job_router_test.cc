#include "runtime/job_router.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "alerting/alert_hub.h"
#include "parts/tick_hook.h"
#include "runtime/test_batches.h"

namespace rankwatch {
namespace {

using testing::EncodedStep;

// A tick hook that records what the router hands it, appends its name to the subject of
// every alert it sees, and appends `append` (when set) to the first tick's alerts.
class RecordingEvidence : public TickHook {
 public:
  explicit RecordingEvidence(std::string name) : name_(std::move(name)) {}

  void OnBatch(const v1::Batch& batch) override {
    batches.push_back(batch.source().training_job());
  }
  void OnTick(const TickView& tick, std::vector<v1::Alert>* alerts) override {
    ++ticks;
    now_unix_ns = tick.now_unix_ns;
    evaluated.clear();
    for (const auto& s : *tick.evaluated) evaluated.push_back(s->training_job);
    removed.insert(removed.end(), tick.removed->begin(), tick.removed->end());
    latest.clear();
    for (const auto& [job, s] : *tick.latest) latest.push_back(job);
    alerts_seen = alerts->size();
    for (v1::Alert& a : *alerts) a.set_subject(a.subject() + name_ + ";");
    if (append && ticks == 1) alerts->push_back(*append);
  }

  std::optional<v1::Alert> append;
  std::vector<std::string> batches;
  int ticks = 0;
  int64_t now_unix_ns = 0;
  std::vector<std::string> evaluated, removed, latest;
  size_t alerts_seen = 0;

 private:
  const std::string name_;
};

class JobRouterTest : public ::testing::Test {
 protected:
  PrometheusRegistry registry;
  // The tests' one-rank jobs are jobs from their first step (JobExportOptions::min_steps).
  DaemonMetrics metrics{&registry, "test", {.min_steps = 1}};
  SnapshotStore snapshots;
  const TimePoint t0{};
};

TEST_F(JobRouterTest, RoutesJobsCountsEventsAndPublishesSnapshots) {
  JobRouter router({}, {&metrics, &snapshots});
  for (uint32_t r = 0; r < 2; ++r) router.HandleMessage(EncodedStep("a", 1, r, 2), t0, 0);
  router.HandleMessage(EncodedStep("b", 1, 0, 3), t0, 0);
  router.Tick(t0, 0);
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

TEST_F(JobRouterTest, EvidenceSeesEveryBatchAndEveryTickInOrderAndAddsToThePublishedAlerts) {
  AlertHub hub(nullptr, nullptr, {}, {});
  auto subscription = hub.Subscribe({});
  RecordingEvidence first("first"), second("second");
  first.append.emplace();
  first.append->set_id("a|hang|job");
  first.append->set_training_job("a");
  first.append->set_kind(v1::ALERT_HANG);
  first.append->set_state(v1::ALERT_FIRING);
  JobRouterOptions o;
  o.task.job_ttl = std::chrono::minutes(1);
  o.task.job_retention = std::chrono::minutes(1);
  JobRouter router(o, {&metrics, &snapshots, &hub, nullptr, {&first, &second}});
  router.HandleMessage(EncodedStep("a", 1, 0, 1), t0, 0);
  // Events answering a control request: evidence, not a job's telemetry.
  v1::Batch events;
  ASSERT_TRUE(events.ParseFromString(EncodedStep("b", 1, 0, 1)));
  events.mutable_trace()->set_capture_id("cap-1-1");
  router.HandleMessage(events.SerializeAsString(), t0, 0);
  EXPECT_EQ(first.batches, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(second.batches, first.batches);
  EXPECT_EQ(first.ticks, 0);

  router.Tick(t0, 5);
  for (const RecordingEvidence* e : {&first, &second}) {
    EXPECT_EQ(e->ticks, 1);
    EXPECT_EQ(e->now_unix_ns, 5);
    EXPECT_EQ(e->evaluated, std::vector<std::string>{"a"});
    // Published before evidence runs; "b" sent evidence only, no step of its own.
    EXPECT_EQ(e->latest, std::vector<std::string>{"a"});
    EXPECT_TRUE(e->removed.empty());
  }
  EXPECT_EQ(first.alerts_seen, 0u);
  EXPECT_EQ(second.alerts_seen, 1u);  // what the first appended, in registration order
  ASSERT_TRUE(hub.Flush().ok());
  std::shared_ptr<const v1::Alert> published;
  ASSERT_EQ(subscription->Next(std::chrono::milliseconds(1000), &published),
            AlertHub::Subscription::Wait::kAlert);
  EXPECT_EQ(published->id(), "a|hang|job");
  EXPECT_EQ(published->subject(), "second;");

  // Expired, then removed: each kind hears of the removal once.
  router.Tick(t0 + std::chrono::minutes(2), 6);
  router.Tick(t0 + std::chrono::minutes(4), 7);
  router.Tick(t0 + std::chrono::minutes(5), 8);
  EXPECT_EQ(first.removed, std::vector<std::string>{"a"});
  EXPECT_EQ(second.removed, std::vector<std::string>{"a"});
  EXPECT_TRUE(second.latest.empty());
}

TEST_F(JobRouterTest, CountsRejectionsByReasonAndKeepsGoing) {
  JobRouter router({}, {&metrics, &snapshots});
  router.HandleMessage("not a batch at all", t0, 0);
  router.HandleMessage("", t0, 0);
  router.HandleMessage(EncodedStep("a", 1, 0, 1), t0, 0);
  router.HandleMessage(EncodedStep("a", 1, 0, 1), t0, 0);  // redelivered
  router.Tick(t0, 0);
  EXPECT_EQ(metrics.rejected_by_reason[static_cast<int>(RejectReason::kMalformed)]->Get(), 1);
  EXPECT_EQ(metrics.rejected_by_reason[static_cast<int>(RejectReason::kSchemaVersion)]->Get(), 1);
  EXPECT_EQ(metrics.rejected_duplicate->Get(), 1);
  EXPECT_EQ(metrics.StepsAligned("a")->Get(), 1);
}

TEST_F(JobRouterTest, StepCountsAppearOnlyWithTheirSnapshot) {
  JobRouter router({}, {&metrics, &snapshots});
  router.HandleMessage(EncodedStep("a", 1, 0, 1), t0, 0);
  EXPECT_EQ(metrics.StepsAligned("a")->Get(), 0);
  EXPECT_TRUE(snapshots.Get()->empty());
  router.Tick(t0, 0);
  EXPECT_EQ(metrics.StepsAligned("a")->Get(), 1);
  EXPECT_EQ(snapshots.Get()->at("a")->aligned_steps, 1u);
}

TEST_F(JobRouterTest, SilentJobsExpireStayQueryableThenGo) {
  JobRouterOptions o;
  o.task.job_ttl = std::chrono::minutes(60);
  o.task.job_retention = std::chrono::minutes(30);
  JobRouter router(o, {&metrics, &snapshots});
  router.HandleMessage(EncodedStep("old", 1, 0, 1), t0, 0);
  router.HandleMessage(EncodedStep("busy", 1, 0, 1), t0, 0);
  router.Tick(t0, 0);
  const auto minutes = [&](int m) { return t0 + std::chrono::minutes(m); };
  router.HandleMessage(EncodedStep("busy", 2, 0, 1), minutes(50), 0);
  router.Tick(minutes(59), 0);
  EXPECT_EQ(router.jobs(), 2u);
  router.Tick(minutes(61), 0);  // "old" expired: frozen but queryable
  EXPECT_EQ(router.jobs(), 2u);
  ASSERT_EQ(snapshots.Get()->count("old"), 1u);
  EXPECT_NE(registry.Render().find("training_job=\"old\""), std::string::npos);
  router.Tick(minutes(92), 0);  // retention over: gone, with its metrics
  EXPECT_EQ(router.jobs(), 1u);
  EXPECT_EQ(snapshots.Get()->count("old"), 0u);
  EXPECT_EQ(snapshots.Get()->count("busy"), 1u);
  EXPECT_EQ(registry.Render().find("training_job=\"old\""), std::string::npos);
  EXPECT_EQ(metrics.jobs->Get(), 1);
  // Input brings an expired (not yet removed) job back.
  router.Tick(minutes(111), 0);  // "busy" expires (last input at 50)
  router.HandleMessage(EncodedStep("busy", 3, 0, 1), minutes(112), 0);
  router.Tick(minutes(150), 0);
  EXPECT_EQ(router.jobs(), 1u);
}

TEST_F(JobRouterTest, CheckpointsRestoreJobsAndForgetRemovedOnes) {
  const auto dir = std::filesystem::path(::testing::TempDir()) / "job_router_store";
  std::filesystem::remove_all(dir);
  JobRouterOptions o;
  o.topic = "t";
  o.task.pipeline.record_changes = true;
  o.task.job_ttl = std::chrono::minutes(10);
  o.task.job_retention = std::chrono::minutes(10);
  {
    auto store = StateStore::Open({dir});
    ASSERT_TRUE(store.ok());
    JobRouter router(o, {&metrics, &snapshots});
    for (uint64_t step = 1; step <= 3; ++step) {
      router.HandleMessage(EncodedStep("kept", step, 0, 1), 0, static_cast<int64_t>(step), t0, 0);
    }
    router.HandleMessage(EncodedStep("gone", 1, 0, 1), 1, 0, t0, 0);
    Checkpoint c;
    router.Checkpoint(&c, t0, 0);
    ASSERT_TRUE((*store)->Commit(c).ok());
    router.HandleMessage(EncodedStep("kept", 4, 0, 1), 0, 4, t0 + std::chrono::minutes(15), 0);
    router.Tick(t0 + std::chrono::minutes(15), 0);  // "gone" expires
    router.Tick(t0 + std::chrono::minutes(26), 0);  // ...and is removed
    Checkpoint d;
    router.Checkpoint(&d, t0 + std::chrono::minutes(26), 0);
    ASSERT_TRUE((*store)->Commit(d).ok());
    auto offsets = (*store)->Offsets();
    ASSERT_TRUE(offsets.ok());
    EXPECT_EQ((offsets->at({"t", 0})), 5);  // the next offset after 4
  }
  auto store = StateStore::Open({dir});
  ASSERT_TRUE(store.ok());
  SnapshotStore restored_snapshots;
  PrometheusRegistry r2;
  DaemonMetrics m2(&r2, "test", {.min_steps = 1});
  JobRouter restored(o, {&m2, &restored_snapshots});
  ASSERT_TRUE(restored.Restore(**store, t0, 0).ok());
  EXPECT_EQ(restored.jobs(), 1u);
  restored.Tick(t0, 0);
  ASSERT_EQ(restored_snapshots.Get()->count("kept"), 1u);
  EXPECT_EQ(restored_snapshots.Get()->at("kept")->aligned_steps, 4u);
  EXPECT_EQ(m2.StepsAligned("kept")->Get(), 4);
}

TEST_F(JobRouterTest, AFullTableEvictsJobsThatNeverBecameJobsAndRefusesOnlyThen) {
  JobRouterOptions o;
  o.max_jobs = 3;
  o.established_steps = 10;
  JobRouter router(o, {&metrics, &snapshots});
  // "real" completes 10 steps on its 2 ranks: established.
  for (uint64_t s = 0; s < 10; ++s) {
    for (uint32_t r = 0; r < 2; ++r) router.HandleMessage(EncodedStep("real", s, r, 2), t0, 0);
  }
  // "busy" sends twice but never completes a step; a flood of one-record ids follows.
  router.HandleMessage(EncodedStep("busy", 0, 0, 2), t0, 0);
  router.HandleMessage(EncodedStep("busy", 1, 0, 2), t0 + std::chrono::seconds(1), 0);
  for (int i = 0; i < 100; ++i) {
    router.HandleMessage(EncodedStep("junk-" + std::to_string(i), 0, 0, 8),
                         t0 + std::chrono::seconds(2 + i), 0);
  }
  router.Tick(t0 + std::chrono::seconds(200), 0);
  EXPECT_EQ(router.jobs(), 3u);
  EXPECT_EQ(metrics.jobs_evicted->Get(), 99);  // every junk id but the newest
  EXPECT_EQ(metrics.rejected_too_many_jobs->Get(), 0);
  auto snap = snapshots.Get();
  EXPECT_EQ(snap->count("real"), 1u);
  EXPECT_EQ(snap->count("busy"), 1u) << "two batches outrank one";
  EXPECT_EQ(snap->count("junk-99"), 1u);
  EXPECT_EQ(snap->count("junk-0"), 0u) << "evicted jobs leave the snapshots";
  EXPECT_EQ(registry.Render().find("junk-0\""), std::string::npos) << "and the metrics";
  EXPECT_EQ(router.ranks(), 2u + 2 + 8);
  // Once every tracked job is established, a new job is refused.
  JobRouterOptions one;
  one.max_jobs = 1;
  one.established_steps = 1;
  PrometheusRegistry r2;
  DaemonMetrics m2{&r2, "test"};
  SnapshotStore s2;
  JobRouter full(one, {&m2, &s2});
  full.HandleMessage(EncodedStep("a", 1, 0, 1), t0, 0);
  full.HandleMessage(EncodedStep("b", 1, 0, 1), t0, 0);
  EXPECT_EQ(full.jobs(), 1u);
  EXPECT_EQ(m2.rejected_too_many_jobs->Get(), 1);
  EXPECT_EQ(m2.jobs_evicted->Get(), 0);
}

TEST_F(JobRouterTest, OnlyJobsGetSeriesAndCandidatesAreEvictedBeforeThem) {
  PrometheusRegistry r;
  DaemonMetrics m{&r, "test", {.min_steps = 5, .max_exported = 2}};
  SnapshotStore s;
  JobRouterOptions o;
  o.max_jobs = 4;
  JobRouter router(o, {&m, &s});
  const auto at = [&](int seconds) { return t0 + std::chrono::seconds(seconds); };
  // "solo" is a one-rank job: a job at its 5th aligned step.
  for (uint64_t step = 0; step < 4; ++step)
    router.HandleMessage(EncodedStep("solo", step), at(0), 0);
  // "pair": one step of two ranks makes it a job at once.
  for (uint32_t rank = 0; rank < 2; ++rank) {
    router.HandleMessage(EncodedStep("pair", 0, rank, 2), at(0), 0);
  }
  // One rank of a 4-rank id, 4 records each, aligned at the timeout as one-rank steps.
  for (const char* junk : {"junk-0", "junk-1"}) {
    for (uint64_t step = 0; step < 4; ++step) {
      router.HandleMessage(EncodedStep(junk, step, 0, 4), at(0), 0);
    }
  }
  router.Tick(at(20), 0);
  EXPECT_EQ(s.Get()->at("junk-0")->aligned_steps, 4u) << "evaluated, and queryable";
  std::string text = r.Render();
  EXPECT_EQ(text.find("junk-"), std::string::npos) << text;
  EXPECT_EQ(text.find("training_job=\"solo\""), std::string::npos) << "4 steps: not yet a job";
  EXPECT_NE(text.find("rankwatch_steps_aligned_total{training_job=\"pair\"} 1\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("rankwatch_job_ids{state=\"candidate\"} 3\n"), std::string::npos) << text;
  EXPECT_NE(text.find("rankwatch_job_ids{state=\"exported\"} 1\n"), std::string::npos) << text;
  // The table is full (4): a new id evicts a candidate, never "pair", though "pair" sent fewer
  // batches (3) than any of them (4).
  router.HandleMessage(EncodedStep("pair", 1, 0, 2), at(21), 0);
  router.HandleMessage(EncodedStep("junk-2", 0, 0, 4), at(22), 0);
  router.HandleMessage(EncodedStep("junk-3", 0, 0, 4), at(23), 0);
  router.HandleMessage(EncodedStep("junk-4", 0, 0, 4), at(24), 0);
  EXPECT_EQ(m.jobs_evicted->Get(), 3);
  // "solo" reaches 5 steps: a job, exported (the second of two places).
  router.HandleMessage(EncodedStep("solo", 4), at(25), 0);
  router.Tick(at(25), 0);
  EXPECT_EQ(s.Get()->count("pair"), 1u);
  EXPECT_EQ(s.Get()->count("junk-0"), 0u);
  EXPECT_TRUE(m.IsJob("solo"));
  text = r.Render();
  EXPECT_NE(text.find("rankwatch_steps_aligned_total{training_job=\"solo\"} 5\n"),
            std::string::npos)
      << text;
  EXPECT_EQ(text.find("junk-"), std::string::npos) << text;
}

TEST_F(JobRouterTest, JobsBeyondTheExportBoundAreCountedThenTakeAFreedPlace) {
  PrometheusRegistry r;
  DaemonMetrics m{&r, "test", {.min_steps = 1, .max_exported = 1}};
  SnapshotStore s;
  JobRouterOptions o;
  o.task.job_ttl = std::chrono::minutes(1);
  o.task.job_retention = std::chrono::minutes(1);
  JobRouter router(o, {&m, &s});
  router.HandleMessage(EncodedStep("first", 0), t0, 0);
  router.Tick(t0, 0);
  router.HandleMessage(EncodedStep("second", 0), t0, 0);
  router.Tick(t0, 0);
  std::string text = r.Render();
  EXPECT_NE(text.find("training_job=\"first\""), std::string::npos);
  EXPECT_EQ(text.find("training_job=\"second\""), std::string::npos) << "over the bound";
  EXPECT_NE(text.find("rankwatch_job_ids{state=\"over_limit\"} 1\n"), std::string::npos) << text;
  EXPECT_EQ(s.Get()->count("second"), 1u) << "still diagnosed and queryable";
  // "second" keeps sending; "first" goes silent, expires and is removed: "second" takes its place.
  for (int minute = 1; minute <= 3; ++minute) {
    const TimePoint now = t0 + std::chrono::minutes(minute);
    router.HandleMessage(EncodedStep("second", minute), now, 0);
    router.Tick(now, 0);
  }
  text = r.Render();
  EXPECT_EQ(text.find("training_job=\"first\""), std::string::npos) << text;
  EXPECT_NE(text.find("rankwatch_steps_aligned_total{training_job=\"second\"} 4\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("rankwatch_job_ids{state=\"over_limit\"} 0\n"), std::string::npos) << text;
}

TEST_F(JobRouterTest, RanksAreBoundedOverAllJobs) {
  JobRouterOptions o;
  o.max_ranks = 100;
  JobRouter router(o, {&metrics, &snapshots});
  router.HandleMessage(EncodedStep("a", 0, 0, 60), t0, 0);
  // 60 + 60 > 100: "a" is evicted for "b"; a job larger than the whole budget evicts nothing.
  router.HandleMessage(EncodedStep("b", 0, 0, 60), t0, 0);
  EXPECT_EQ(metrics.jobs_evicted->Get(), 1);
  router.HandleMessage(EncodedStep("huge", 0, 0, 1000), t0, 0);
  EXPECT_EQ(metrics.jobs_evicted->Get(), 1);
  EXPECT_EQ(metrics.rejected_too_many_jobs->Get(), 1);
  EXPECT_EQ(router.jobs(), 1u);
  EXPECT_EQ(router.ranks(), 60u);
  // An elastic restart of "b" to 90 ranks fits; to 200 it does not.
  router.HandleMessage(EncodedStep("b", 5, 0, 90), t0 + std::chrono::seconds(1), 0);
  EXPECT_EQ(router.ranks(), 90u);
  router.HandleMessage(EncodedStep("b", 6, 0, 200), t0 + std::chrono::minutes(5), 0);
  EXPECT_EQ(router.ranks(), 90u);
  EXPECT_EQ(metrics.rejected_too_many_jobs->Get(), 2);
}

// A stopwatch on which every reading is 1 ms after the last: each evaluation costs 1 ms.
TimePoint g_stopwatch{};
TimePoint SteppingStopwatch() { return g_stopwatch += std::chrono::milliseconds(1); }

// Many jobs that change every tick share one evaluation budget: each is re-evaluated at most
// every ten times what evaluating all of them costs, not every ten times its own cost (which
// let 20 jobs of 1 ms each be evaluated every 20-ms tick); a job's first evaluation does not
// wait.
TEST_F(JobRouterTest, JobsThatAllChangeShareTheEvaluationBudget) {
  JobRouterOptions o;
  o.task.stopwatch = &SteppingStopwatch;
  RecordingEvidence hook("hook");
  JobRouter router(o, {&metrics, &snapshots, nullptr, nullptr, {&hook}});
  constexpr int kJobs = 20;
  size_t evaluations = 0, first_tick = 0;
  TimePoint now = t0;
  for (int tick = 0; tick < 50; ++tick) {  // a second of 20-ms ticks, a step of every job each
    for (int j = 0; j < kJobs; ++j) {
      router.HandleMessage(EncodedStep("job-" + std::to_string(j), tick), now, 0);
    }
    router.Tick(now, 0);
    if (tick == 0) first_tick = hook.evaluated.size();
    evaluations += hook.evaluated.size();
    now += std::chrono::milliseconds(20);
  }
  EXPECT_EQ(first_tick, static_cast<size_t>(kJobs));
  // 20 jobs of 1 ms: each at most every 200 ms, about 5 evaluations a job in the second (100 in
  // all), not one every tick (1,000).
  EXPECT_GE(evaluations, 80u);
  EXPECT_LE(evaluations, 140u);
}

}  // namespace
}  // namespace rankwatch
