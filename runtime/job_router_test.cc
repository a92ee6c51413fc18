#include "runtime/job_router.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>
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

// A stopwatch on which every reading is 1 ms after the same thread's last (evaluations may run
// on several ingest threads, each timing its own): each evaluation costs 1 ms.
thread_local TimePoint t_idle_stopwatch{};
TimePoint IdleSteppingStopwatch() { return t_idle_stopwatch += std::chrono::milliseconds(1); }

// With input idle (the last poll found nothing), changed jobs do not wait for the fleet's
// share: each is re-evaluated once ten times its own cost (1 ms) has passed, every 20-ms tick,
// where the fleet budget (20 jobs x 1 ms x 10 = 200 ms) lets each through about every tenth.
TEST_F(JobRouterTest, WhileInputIsIdleChangedJobsWaitOnlyForTheirOwnCost) {
  constexpr int kJobs = 20, kTicks = 50;
  auto evaluations = [&](bool input_idle, size_t threads) {
    PrometheusRegistry r;
    DaemonMetrics m{&r, "test", {.min_steps = 1}};
    SnapshotStore s;
    JobRouterOptions o;
    o.task.stopwatch = &IdleSteppingStopwatch;
    o.ingest_threads = threads;
    RecordingEvidence hook("hook");
    JobRouter router(o, {&m, &s, nullptr, nullptr, {&hook}});
    size_t total = 0, last_tick = 0;
    TimePoint now = t0;
    for (int tick = 0; tick < kTicks; ++tick) {
      for (int j = 0; j < kJobs; ++j) {
        router.HandleMessage(EncodedStep("job-" + std::to_string(j), tick), now, 0);
      }
      router.Tick(now, 0, input_idle);
      total += hook.evaluated.size();
      last_tick = hook.evaluated.size();
      now += std::chrono::milliseconds(20);
    }
    // Every job's latest snapshot has its newest step when each was evaluated every tick.
    if (input_idle) {
      EXPECT_EQ(last_tick, static_cast<size_t>(kJobs));
      for (int j = 0; j < kJobs; ++j) {
        EXPECT_EQ(s.Get()->at("job-" + std::to_string(j))->aligned_steps,
                  static_cast<uint64_t>(kTicks))
            << j << ", " << threads << " threads";
      }
    }
    return total;
  };
  for (size_t threads : {1, 2}) {
    const size_t busy = evaluations(false, threads);
    const size_t idle = evaluations(true, threads);
    // Busy: about 5 a job (100), as in JobsThatAllChangeShareTheEvaluationBudget. Idle: every
    // job every tick (1,000): its own 10 ms wait is shorter than a tick.
    EXPECT_GE(busy, 80u) << threads << " threads";
    EXPECT_LE(busy, 140u) << threads << " threads";
    EXPECT_GE(idle, 950u) << threads << " threads";
    EXPECT_LE(idle, static_cast<size_t>(kJobs * kTicks)) << threads << " threads";
  }
}

// --- HandleMessages on several threads (options.ingest_threads) ---

// One batch of `rank` of a `world`-rank job: steps [first, first + count), each 100 ms with
// 10 ms of input, 30 ms forward and 50 ms backward; a `slow` rank takes 40 ms more forward
// (a compute straggler).
std::string EncodedSteps(const std::string& job, uint64_t first, uint64_t count, uint32_t rank,
                         uint32_t world, bool slow) {
  v1::Batch b;
  b.set_schema_version(kSchemaVersion);
  b.mutable_source()->set_training_job(job);
  b.mutable_source()->set_rank(rank);
  b.mutable_source()->set_world_size(world);
  for (uint64_t step = first; step < first + count; ++step) {
    v1::StepRecord* r = b.add_steps();
    r->set_step(step);
    r->set_dataloader_ns(10'000'000);
    r->set_forward_ns(slow ? 70'000'000 : 30'000'000);
    r->set_backward_ns(50'000'000);
    r->set_step_time_ns(slow ? 140'000'000 : 100'000'000);
  }
  return b.SerializeAsString();
}

// Fixed clocks for HandleMessages (set between calls, read by its threads).
TimePoint g_ingest_now{};
int64_t g_ingest_wall = 0;
TimePoint IngestNow() { return g_ingest_now; }
int64_t IngestWall() { return g_ingest_wall; }
// Evaluations cost nothing: none waits for a budget (the results do not depend on timing).
TimePoint FreeStopwatch() { return TimePoint{}; }

// A telemetry message of one poll, keyed by its training job as every producer keys them.
struct Sent {
  Sent(std::string payload_in, int32_t partition_in, int64_t offset_in)
      : payload(std::move(payload_in)), partition(partition_in), offset(offset_in) {
    v1::Batch b;
    if (b.ParseFromString(payload)) key = b.source().training_job();
  }
  std::string payload;
  int32_t partition = 0;
  int64_t offset = 0;
  std::string key;
};

// The messages of a poll, as HandleMessages takes them (views into `poll`).
std::vector<JobRouter::Message> Messages(const std::vector<Sent>& poll) {
  std::vector<JobRouter::Message> out;
  for (const Sent& s : poll) out.push_back({s.payload, s.partition, s.offset, s.key});
  return out;
}

// A daemon's router with its own sinks.
struct Daemon {
  explicit Daemon(JobRouterOptions o) : router(std::move(o), {&metrics, &snapshots}) {}
  // Handles `poll` on the router's threads (HandleMessages), or, with `one_by_one`, each
  // message in turn (HandleMessage), as a single-threaded ingest did.
  void Handle(const std::vector<Sent>& poll, bool one_by_one) {
    if (one_by_one) {
      for (const Sent& s : poll) {
        router.HandleMessage(s.payload, s.partition, s.offset, IngestNow(), IngestWall());
      }
    } else {
      router.HandleMessages(Messages(poll), &IngestNow, &IngestWall);
    }
  }
  PrometheusRegistry registry;
  DaemonMetrics metrics{&registry, "test", {.min_steps = 1}};
  SnapshotStore snapshots;
  JobRouter router;
};

std::string Num(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

// What a job's snapshot says that the input alone decides.
std::string Describe(const JobSnapshot& s) {
  std::string out = s.training_job + ": world " + std::to_string(s.world_size) + ", seen " +
                    std::to_string(s.ranks_seen) + ", aligned " + std::to_string(s.aligned_steps) +
                    ", timed out " + std::to_string(s.timed_out_steps) + ", window " +
                    (s.has_window ? std::to_string(s.window_first_step) + ".." +
                                        std::to_string(s.window_last_step) + " (" +
                                        std::to_string(s.window_steps) + ")"
                                  : "none") +
                    ", present " + std::to_string(s.last_ranks_present);
  const StepDiagnosis& d = s.step;
  out += std::string(", label ") + std::string(StepLabelName(d.label)) + ", severity " +
         std::string(SeverityName(d.severity)) + ", cause " +
         std::string(StragglerCauseName(d.cause)) + ", diagnosed steps " +
         std::to_string(d.window_steps) + ", culprits";
  for (uint32_t r : d.culprit_ranks) out += " " + std::to_string(r);
  out += ", scores " + Num(d.input_score) + " " + Num(d.compute_score) + " " + Num(d.own_score) +
         ", shares " + Num(d.input_share) + " " + Num(d.wait_share) + " " + Num(d.compute_share) +
         ", lost " + Num(s.lost.total_rank_seconds) + " " +
         Num(s.lost.total_straggler_rank_seconds) + ", phases";
  for (const PhaseStat& p : s.phases) {
    out += " " + std::to_string(p.ranks) + "/" + Num(p.median_seconds) + "/" +
           Num(p.worst_seconds) + "/" + std::to_string(p.worst_rank);
  }
  return out;
}

// Everything observable of `d` that its input alone decides (snapshots, each partition's jobs
// and offset, the table, the event counters), one line each.
std::vector<std::string> Observe(Daemon& d, const std::vector<int32_t>& partitions) {
  std::vector<std::string> out;
  for (const auto& [job, s] : *d.snapshots.Get()) out.push_back(Describe(*s));
  for (int32_t p : partitions) {
    std::string line = "partition " + std::to_string(p) + ":";
    for (const std::string& job : d.router.JobsOf(p)) line += " " + job;
    const std::optional<int64_t> covered = d.router.CoveredOffset(p);
    line += ", covered " + (covered ? std::to_string(*covered) : std::string("none"));
    out.push_back(line);
  }
  const DaemonMetrics& m = d.metrics;
  out.push_back("table: " + std::to_string(d.router.jobs()) + " jobs, " +
                std::to_string(d.router.ranks()) + " ranks, gauge " + Num(m.jobs->Get()));
  out.push_back("events: batches " + Num(m.events_batches->Get()) + ", steps " +
                Num(m.events_steps->Get()) + ", malformed " +
                Num(m.rejected_by_reason[static_cast<int>(RejectReason::kMalformed)]->Get()) +
                ", duplicate " + Num(m.rejected_duplicate->Get()) + ", late " +
                Num(m.rejected_late->Get()) + ", too many jobs " +
                Num(m.rejected_too_many_jobs->Get()) + ", evicted " + Num(m.jobs_evicted->Get()));
  return out;
}

// Every write of a checkpoint, materialised, one line each.
std::vector<std::string> Writes(Checkpoint c) {
  c.Materialize();
  std::vector<std::string> out;
  for (const Checkpoint::Op& op : c.ops()) {
    out.push_back(std::string(StateFamilyName(op.family)) + " " + op.key + " = " +
                  (op.value ? *op.value : std::string("<delete>")) +
                  (op.range_end ? " .. " + *op.range_end : std::string()));
  }
  return out;
}

// Each router's checkpoint of everything it holds now, as its writes.
std::vector<std::string> CheckpointWrites(JobRouter& router) {
  Checkpoint c;
  router.Checkpoint(&c, IngestNow(), IngestWall());
  return Writes(std::move(c));
}

class ParallelIngestTest : public ::testing::TestWithParam<size_t> {
 protected:
  void SetUp() override {
    g_ingest_now = TimePoint{} + std::chrono::hours(1);
    g_ingest_wall = 1'700'000'000'000'000'000;
  }
  // The clocks of poll `k`: a second apart.
  static void AtPoll(int k) {
    g_ingest_now = TimePoint{} + std::chrono::hours(1) + std::chrono::seconds(k);
    g_ingest_wall = 1'700'000'000'000'000'000 + int64_t{k} * 1'000'000'000;
  }
  // Poll `k` on both daemons — one message in turn, and on threads — and their ticks half a
  // second later: both show the same of `partitions`.
  static void HandleBoth(Daemon& serial, Daemon& parallel, const std::vector<Sent>& poll, int k,
                         const std::vector<int32_t>& partitions) {
    AtPoll(k);
    serial.Handle(poll, /*one_by_one=*/true);
    parallel.Handle(poll, /*one_by_one=*/false);
    const TimePoint tick = IngestNow() + std::chrono::milliseconds(500);
    serial.router.Tick(tick, IngestWall());
    parallel.router.Tick(tick, IngestWall());
    EXPECT_EQ(Observe(parallel, partitions), Observe(serial, partitions)) << "poll " << k;
  }
  JobRouterOptions Options(size_t threads) const {
    JobRouterOptions o;
    o.topic = "t";
    o.task.stopwatch = &FreeStopwatch;
    o.task.pipeline.record_changes = true;
    o.ingest_threads = threads;
    return o;
  }
};

// Many jobs of 2 to 4 ranks on 6 partitions of different sizes, their messages interleaved in
// three polls (each with a malformed message and a redelivered one): handled on several threads,
// every job's snapshot after each tick (steps aligned, window, diagnosis), each partition's jobs
// and offset, the table, the event counters and the checkpoint are what handling each message
// in turn gives.
TEST_P(ParallelIngestTest, HandlesAPollAsHandlingEachMessageInTurnWould) {
  constexpr int kJobs = 24, kPartitions = 6, kPolls = 3, kBatchesPerPoll = 5, kStepsPerBatch = 2;
  std::vector<int32_t> partitions;
  for (int32_t p = 0; p < kPartitions; ++p) partitions.push_back(p);
  std::vector<int64_t> next_offset(kPartitions, 0);
  std::vector<std::vector<Sent>> polls(kPolls);
  for (int k = 0; k < kPolls; ++k) {
    std::vector<Sent>& poll = polls[k];
    auto send = [&](std::string payload, int32_t p) {
      poll.push_back({std::move(payload), p, next_offset[p]++});
    };
    for (int b = 0; b < kBatchesPerPoll; ++b) {
      const uint64_t first = static_cast<uint64_t>((k * kBatchesPerPoll + b) * kStepsPerBatch);
      for (int j = 0; j < kJobs; ++j) {
        const int32_t p = j % kPartitions;
        const uint32_t world = static_cast<uint32_t>(p % 3 + 2);
        for (uint32_t r = 0; r < world; ++r) {
          const bool slow = j % 4 != 0 && r == static_cast<uint32_t>(j) % world;
          send(EncodedSteps("job-" + std::to_string(j), first, kStepsPerBatch, r, world, slow), p);
        }
      }
      if (b == 1) {
        send("not a batch", k % kPartitions);
        poll.back().key = "a-key";  // a key, so a thread rejects it (no key: handled in turn)
      }
      if (b == 3) send(poll[1].payload, poll[1].partition);  // redelivered
    }
  }
  Daemon serial(Options(1)), parallel(Options(GetParam()));
  for (int k = 0; k < kPolls; ++k) {
    HandleBoth(serial, parallel, polls[k], k, partitions);
  }
  // What the serial run says, so that the comparison above compared something.
  auto snap = serial.snapshots.Get();
  ASSERT_EQ(snap->size(), static_cast<size_t>(kJobs));
  size_t stragglers = 0;
  for (const auto& [job, s] : *snap) {
    EXPECT_EQ(s->aligned_steps, uint64_t{kPolls * kBatchesPerPoll * kStepsPerBatch}) << job;
    EXPECT_EQ(s->timed_out_steps, 0u) << job;
    EXPECT_NE(s->step.label, StepLabel::kNoData) << job;
    if (!s->step.culprit_ranks.empty()) ++stragglers;
  }
  EXPECT_GE(stragglers, static_cast<size_t>(kJobs / 2)) << "the slow ranks are named";
  EXPECT_EQ(serial.metrics.rejected_duplicate->Get(), kPolls * kStepsPerBatch);  // records
  EXPECT_EQ(serial.metrics.rejected_by_reason[static_cast<int>(RejectReason::kMalformed)]->Get(),
            kPolls);
  for (int32_t p = 0; p < kPartitions; ++p) {
    EXPECT_EQ(serial.router.CoveredOffset(p), next_offset[p]) << p;
  }
  const std::vector<std::string> serial_writes = CheckpointWrites(serial.router);
  EXPECT_GT(serial_writes.size(), static_cast<size_t>(kJobs));
  EXPECT_EQ(CheckpointWrites(parallel.router), serial_writes);
}

// A full table: a new job's message on a thread waits for the whole table, then evicts a
// provisional job as handling each message in turn does; once every job is established, a new
// job's messages are refused (and consumed), while the other partitions' go on.
TEST_P(ParallelIngestTest, AFullTableEvictsAndRefusesAsHandlingEachMessageInTurn) {
  auto options = [&](size_t threads) {
    JobRouterOptions o = Options(threads);
    o.max_jobs = 4;
    o.established_steps = 3;
    return o;
  };
  std::vector<int64_t> next_offset(6, 0);
  auto sent = [&](const std::string& job, uint64_t step, int32_t p) {
    return Sent{EncodedSteps(job, step, 1, 0, 1, false), p, next_offset[p]++};
  };
  // Poll 0: "a", "b", "c" established (3 steps each), "prov" provisional (1 step).
  // Poll 1: "a", "b", "c" go on while "new" (partition 3) arrives: it evicts "prov", and its
  // steps after the first (which waited) follow in order: established.
  // Poll 2: "late" (partition 4) finds only established jobs: refused, 4 times.
  std::vector<std::vector<Sent>> polls(3);
  for (uint64_t step = 0; step < 3; ++step) {
    for (const auto& [job, p] : {std::pair{"a", 0}, {"b", 1}, {"c", 2}}) {
      polls[0].push_back(sent(job, step, p));
    }
  }
  polls[0].push_back(sent("prov", 0, 5));
  for (uint64_t step = 0; step < 4; ++step) {
    for (const auto& [job, p] : {std::pair{"a", 0}, {"new", 3}, {"b", 1}, {"c", 2}}) {
      polls[1].push_back(sent(job, std::string(job) == "new" ? step : step + 3, p));
    }
  }
  for (uint64_t step = 0; step < 4; ++step) {
    for (const auto& [job, p] : {std::pair{"late", 4}, {"a", 0}, {"b", 1}}) {
      polls[2].push_back(sent(job, std::string(job) == "late" ? step : step + 7, p));
    }
  }
  const std::vector<int32_t> partitions = {0, 1, 2, 3, 4, 5};
  Daemon serial(options(1)), parallel(options(GetParam()));
  for (int k = 0; k < 3; ++k) {
    HandleBoth(serial, parallel, polls[k], k, partitions);
    if (k == 1) {
      EXPECT_EQ(parallel.metrics.jobs_evicted->Get(), 1);
      EXPECT_EQ(parallel.router.JobsOf(5), std::vector<std::string>{});
      EXPECT_EQ(parallel.router.JobsOf(3), std::vector<std::string>{"new"});
      EXPECT_EQ(parallel.snapshots.Get()->count("prov"), 0u);
      ASSERT_EQ(parallel.snapshots.Get()->count("new"), 1u);
      EXPECT_EQ(parallel.snapshots.Get()->at("new")->aligned_steps, 4u);
    }
  }
  EXPECT_EQ(parallel.router.jobs(), 4u);
  EXPECT_EQ(parallel.metrics.jobs_evicted->Get(), 1);
  EXPECT_EQ(parallel.metrics.rejected_too_many_jobs->Get(), 4);
  EXPECT_EQ(parallel.snapshots.Get()->count("late"), 0u);
  EXPECT_EQ(parallel.router.CoveredOffset(4), 4) << "refused messages are consumed";
  EXPECT_EQ(parallel.snapshots.Get()->at("a")->aligned_steps, 11u);
  EXPECT_EQ(parallel.snapshots.Get()->at("b")->aligned_steps, 11u);
  EXPECT_EQ(CheckpointWrites(parallel.router), CheckpointWrites(serial.router));
}

// A job's records move from partition 0 to partition 1 in the middle of a poll: handled on
// several threads, it ends up in partition 1's task with every step, as when each message is
// handled in turn.
TEST_P(ParallelIngestTest, AJobWhoseRecordsMoveToAnotherPartitionKeepsItsSteps) {
  std::vector<int64_t> next_offset(3, 0);
  std::vector<std::vector<Sent>> polls(2);
  auto send = [&](int k, const std::string& job, uint64_t first, uint32_t rank, int32_t p) {
    polls[k].push_back(Sent{EncodedSteps(job, first, 2, rank, 2, rank == 1), p, next_offset[p]++});
  };
  // Poll 0: "mover" on partition 0 (steps 0..9), "stay-0", "stay-1", "stay-2" on their own.
  for (uint64_t first = 0; first < 10; first += 2) {
    for (uint32_t r = 0; r < 2; ++r) {
      send(0, "mover", first, r, 0);
      for (int32_t p = 0; p < 3; ++p) send(0, "stay-" + std::to_string(p), first, r, p);
    }
  }
  // Poll 1: "mover" sends steps 10..13 on partition 0, then 14..29 on partition 1, while the
  // others go on.
  for (uint64_t first = 10; first < 30; first += 2) {
    for (uint32_t r = 0; r < 2; ++r) {
      send(1, "mover", first, r, first < 14 ? 0 : 1);
      for (int32_t p = 0; p < 3; ++p) send(1, "stay-" + std::to_string(p), first, r, p);
    }
  }
  const std::vector<int32_t> partitions = {0, 1, 2};
  Daemon serial(Options(1)), parallel(Options(GetParam()));
  for (int k = 0; k < 2; ++k) {
    HandleBoth(serial, parallel, polls[k], k, partitions);
  }
  EXPECT_EQ(parallel.router.JobsOf(0), std::vector<std::string>{"stay-0"});
  EXPECT_EQ(parallel.router.JobsOf(1), (std::vector<std::string>{"mover", "stay-1"}));
  auto snap = parallel.snapshots.Get();
  ASSERT_EQ(snap->count("mover"), 1u);
  EXPECT_EQ(snap->at("mover")->aligned_steps, 30u);
  EXPECT_EQ(snap->at("mover")->timed_out_steps, 0u);
  EXPECT_EQ(snap->at("mover")->step.culprit_ranks, std::vector<uint32_t>{1});
  EXPECT_EQ(parallel.metrics.rejected_late->Get(), 0);
  EXPECT_EQ(parallel.metrics.StepsAligned("mover")->Get(), 30);
  EXPECT_EQ(parallel.router.jobs(), 4u);
  EXPECT_EQ(CheckpointWrites(parallel.router), CheckpointWrites(serial.router));
}

// A job new to the table whose records come on two partitions of one poll (it moves): the
// partitions are handled one message after another, so no thread creates it on the partition it
// leaves for first and drops its older steps as duplicates (with threads racing, 17 of 20 runs
// did).
TEST_P(ParallelIngestTest, ANewJobOnTwoPartitionsOfAPollEndsAsHandlingEachMessageInTurn) {
  std::vector<int64_t> next_offset(3, 0);
  std::vector<Sent> poll;
  auto send = [&](const std::string& job, uint64_t first, uint32_t rank, int32_t p) {
    poll.push_back(Sent{EncodedSteps(job, first, 2, rank, 2, rank == 1), p, next_offset[p]++});
  };
  for (uint64_t first = 0; first < 60; first += 2)
    for (uint32_t r = 0; r < 2; ++r) send("filler", first, r, 0);
  for (uint64_t first = 0; first < 30; first += 2)
    for (uint32_t r = 0; r < 2; ++r) send("mover", first, r, first < 10 ? 0 : 1);
  const std::vector<int32_t> partitions = {0, 1};
  Daemon serial(Options(1)), parallel(Options(GetParam()));
  HandleBoth(serial, parallel, poll, 0, partitions);
  EXPECT_EQ(serial.router.JobsOf(1), std::vector<std::string>{"mover"});
}

INSTANTIATE_TEST_SUITE_P(IngestThreads, ParallelIngestTest, ::testing::Values(2, 4),
                         [](const ::testing::TestParamInfo<size_t>& info) {
                           return std::to_string(info.param) + "Threads";
                         });

}  // namespace
}  // namespace rankwatch
