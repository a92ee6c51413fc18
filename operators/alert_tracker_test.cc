#include "operators/alert_tracker.h"

#include <gtest/gtest.h>

#include <algorithm>

namespace rankwatch {
namespace {

std::shared_ptr<const JobSnapshot> Straggler(const std::string& job, uint32_t rank) {
  auto s = std::make_shared<JobSnapshot>();
  s->training_job = job;
  s->step.label = StepLabel::kComputeStraggler;
  s->step.cause = StragglerCause::kCompute;
  s->step.severity = Severity::kCrit;
  s->step.scope = CulpritScope::kRank;
  s->step.culprit_ranks = {rank};
  return s;
}

std::shared_ptr<const JobSnapshot> Healthy(const std::string& job) {
  auto s = std::make_shared<JobSnapshot>();
  s->training_job = job;
  s->step.label = StepLabel::kBalanced;
  s->memory.label = MemoryLabel::kBalanced;
  return s;
}

TEST(AlertTrackerTest, PendingThenFiringThenResolved) {
  AlertTracker t({.fire_after = 3, .resolve_after = 10});
  auto e = t.Evaluate(Straggler("j", 17), 100);
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0].state, AlertState::kPending);
  EXPECT_EQ(e[0].id, "j|straggler|rank:17");
  EXPECT_EQ(e[0].cause, StragglerCause::kCompute);
  EXPECT_EQ(e[0].sequence, 1u);
  EXPECT_TRUE(t.Evaluate(Straggler("j", 17), 101).empty());
  e = t.Evaluate(Straggler("j", 17), 102);
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0].state, AlertState::kFiring);
  EXPECT_EQ(e[0].sequence, 2u);
  EXPECT_EQ(e[0].evidence->step.culprit_ranks, std::vector<uint32_t>{17});
  // Nine clean evaluations keep it firing; the tenth resolves it.
  for (int i = 0; i < 9; ++i) EXPECT_TRUE(t.Evaluate(Healthy("j"), 103 + i).empty());
  e = t.Evaluate(Healthy("j"), 200);
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0].state, AlertState::kResolved);
  EXPECT_EQ(e[0].sequence, 3u);
  EXPECT_EQ(e[0].at_unix_ns, 200);
  EXPECT_EQ(t.active(), 0u);
}

TEST(AlertTrackerTest, ARestoredJobNeitherForgetsNorRefiresItsAlerts) {
  AlertTracker before({.fire_after = 3, .resolve_after = 10});
  for (int i = 0; i < 3; ++i) before.Evaluate(Straggler("j", 4), i);
  before.Evaluate(Straggler("other", 1), 5);
  const state::v1::AlertTrackerState saved = before.ExportJob("j");
  ASSERT_EQ(saved.alerts_size(), 1);

  AlertTracker after({.fire_after = 3, .resolve_after = 10});
  after.RestoreJob(saved);
  EXPECT_EQ(after.Firing("j").at(AlertKind::kStraggler), 1);
  EXPECT_TRUE(after.Firing("other").empty());                  // only the job that was restored
  EXPECT_TRUE(after.Evaluate(Straggler("j", 4), 10).empty());  // still firing: no new event
  for (int i = 0; i < 9; ++i) EXPECT_TRUE(after.Evaluate(Healthy("j"), 11 + i).empty());
  auto e = after.Evaluate(Healthy("j"), 30);
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0].state, AlertState::kResolved);
  EXPECT_TRUE(e[0].fired);
  EXPECT_EQ(e[0].id, "j|straggler|rank:4");
}

// A snapshot whose window ends at `last_step`.
std::shared_ptr<const JobSnapshot> At(std::shared_ptr<const JobSnapshot> s, uint64_t last_step) {
  auto copy = std::make_shared<JobSnapshot>(*s);
  copy->window_last_step = last_step;
  copy->window_steps = static_cast<uint32_t>(std::min<uint64_t>(last_step + 1, 20));
  return copy;
}

TEST(AlertTrackerTest, StepsReplayedAfterARestoreAreNotEvaluatedAgain) {
  // Before the restart: a straggler over steps 10-12 fires, clean steps 13-22 resolve it; the
  // state is stored with the resolution (evaluated through step 22).
  AlertTracker before({.fire_after = 3, .resolve_after = 10});
  for (uint64_t step = 10; step <= 12; ++step) before.Evaluate(At(Straggler("j", 4), step), 1);
  for (uint64_t step = 13; step <= 22; ++step) before.Evaluate(At(Healthy("j"), step), 2);
  EXPECT_EQ(before.active(), 0u);
  const state::v1::AlertTrackerState saved = before.ExportJob("j");
  EXPECT_EQ(saved.evaluated_through_step(), 22u);

  // After it: the job's windows come back from an older checkpoint, and its input from step 9
  // on is read again. The straggler steps are not a new alert...
  AlertTracker after({.fire_after = 3, .resolve_after = 10}, 100);
  after.RestoreJob(saved);
  for (uint64_t step = 9; step <= 12; ++step) {
    EXPECT_TRUE(after.Evaluate(At(Straggler("j", 4), step), 3).empty()) << step;
  }
  for (uint64_t step = 13; step < 22; ++step)
    EXPECT_TRUE(after.Evaluate(At(Healthy("j"), step), 4).empty());
  EXPECT_EQ(after.active(), 0u);
  // ...while new steps are evaluated as usual: from step 22 on (the last one evaluated before
  // is evaluated again, as a silent job's evaluations are).
  EXPECT_TRUE(after.Evaluate(At(Healthy("j"), 22), 5).empty());
  auto e = after.Evaluate(At(Straggler("j", 6), 23), 6);
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0].state, AlertState::kPending);
  EXPECT_EQ(e[0].id, "j|straggler|rank:6");
  EXPECT_EQ(e[0].sequence, 100u);
  // Once the replay is over, the job's windows never skip again (a job whose steps start over).
  EXPECT_EQ(after.Evaluate(At(Straggler("j", 6), 1), 7).size(), 0u);  // counts: 2nd evaluation
  EXPECT_EQ(after.Evaluate(At(Straggler("j", 6), 2), 8).size(), 1u);  // 3rd: firing
}

TEST(AlertTrackerTest, TheRestoredWindowIsNotEvaluatedWhileTheReplayWaits) {
  // A restarted daemon re-evaluates its restored jobs (every second while they are silent)
  // before the consumer group gives it their partitions: those evaluations do not count
  // either, and the replay that follows fires nothing again.
  AlertTracker before({.fire_after = 3, .resolve_after = 10});
  for (uint64_t step = 10; step <= 12; ++step) before.Evaluate(At(Straggler("j", 4), step), 1);
  for (uint64_t step = 13; step <= 22; ++step) before.Evaluate(At(Healthy("j"), step), 2);
  AlertTracker after({.fire_after = 3, .resolve_after = 10});
  after.RestoreJob(before.ExportJob("j"));
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(after.Evaluate(At(Straggler("j", 4), 10), 3 + i).empty());
  for (uint64_t step = 11; step <= 21; ++step) {
    EXPECT_TRUE(after.Evaluate(At(step <= 12 ? Straggler("j", 4) : Healthy("j"), step), 9).empty());
  }
  EXPECT_EQ(after.active(), 0u);
}

TEST(AlertTrackerTest, AStateWithoutAStepReplaysNothing) {
  // A state written before evaluated_through_step existed (or of a job never evaluated with a
  // window): every evaluation after the restore counts, as before.
  AlertTracker before({.fire_after = 3, .resolve_after = 10});
  for (int i = 0; i < 3; ++i) before.Evaluate(Straggler("j", 4), i);
  const state::v1::AlertTrackerState saved = before.ExportJob("j");
  EXPECT_EQ(saved.evaluated_through_step(), 0u);
  AlertTracker after({.fire_after = 3, .resolve_after = 10});
  after.RestoreJob(saved);
  for (int i = 0; i < 9; ++i) EXPECT_TRUE(after.Evaluate(At(Healthy("j"), 5), 11 + i).empty());
  EXPECT_EQ(after.Evaluate(At(Healthy("j"), 5), 30).size(), 1u);  // resolved
}

TEST(AlertTrackerTest, AFlappingConditionNeverFiresTwiceWhileActive) {
  AlertTracker t({.fire_after = 1, .resolve_after = 3});
  EXPECT_EQ(t.Evaluate(Straggler("j", 2), 0).size(), 2u);  // pending and firing at once
  for (int i = 0; i < 5; ++i) {
    EXPECT_TRUE(t.Evaluate(Healthy("j"), 1).empty());       // one or two clean ones...
    EXPECT_TRUE(t.Evaluate(Straggler("j", 2), 2).empty());  // ...then back: still the same alert
  }
  EXPECT_EQ(t.active(), 1u);
}

TEST(AlertTrackerTest, APendingConditionThatGoesAwayResolvesAtOnce) {
  AlertTracker t;
  t.Evaluate(Straggler("j", 2), 0);
  auto e = t.Evaluate(Healthy("j"), 1);
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0].state, AlertState::kResolved);
}

TEST(AlertTrackerTest, SubjectsAndJobsAreSeparateAlertsWithOneSequence) {
  AlertTracker t({.fire_after = 1, .resolve_after = 1});
  auto a = t.Evaluate(Straggler("a", 1), 0);
  auto b = t.Evaluate(Straggler("b", 1), 0);
  auto a2 = t.Evaluate(Straggler("a", 5), 0);  // the culprit changed: rank 1 resolves, rank 5 fires
  ASSERT_EQ(a.size(), 2u);
  ASSERT_EQ(b.size(), 2u);
  ASSERT_EQ(a2.size(), 3u);
  EXPECT_EQ(a2[0].id, "a|straggler|rank:5");
  EXPECT_EQ(a2[2].id, "a|straggler|rank:1");
  EXPECT_EQ(a2[2].state, AlertState::kResolved);
  uint64_t last = 0;
  for (const auto* v : {&a, &b, &a2}) {
    for (const AlertEvent& e : *v) {
      EXPECT_GT(e.sequence, last);
      last = e.sequence;
    }
  }
  EXPECT_EQ(t.active(), 2u);  // a|rank:5 and b|rank:1
}

TEST(AlertTrackerTest, AMemoryCreepOfOneRankIsThatRanksAlert) {
  AlertTracker t({.fire_after = 1, .resolve_after = 1});
  auto s = std::make_shared<JobSnapshot>(*Healthy("j"));
  s->memory.label = MemoryLabel::kCreep;
  s->memory.severity = Severity::kCrit;
  s->memory.creep_scope = CreepScope::kRank;
  s->memory.creep_rank = 6;
  // fire_after 1: pending, then firing at once.
  auto e = t.Evaluate(s, 0);
  ASSERT_EQ(e.size(), 2u);
  EXPECT_EQ(e[0].id, "j|memory_creep|rank:6");
  EXPECT_EQ(e[1].state, AlertState::kFiring);
  // Every rank's creep is the job's: the rank's alert resolves, the job's fires.
  auto all = std::make_shared<JobSnapshot>(*s);
  all->memory.creep_scope = CreepScope::kJob;
  std::vector<std::string> ids;
  for (const AlertEvent& x : t.Evaluate(all, 1)) {
    ids.push_back(x.id + " " + std::string(AlertStateName(x.state)));
  }
  EXPECT_EQ(ids,
            (std::vector<std::string>{"j|memory_creep|job pending", "j|memory_creep|job firing",
                                      "j|memory_creep|rank:6 resolved"}));
}

TEST(AlertTrackerTest, EveryKindFromItsDiagnosis) {
  AlertTracker t({.fire_after = 1, .resolve_after = 1});
  auto s = std::make_shared<JobSnapshot>();
  s->training_job = "j|odd";
  s->step.label = StepLabel::kHang;
  s->step.severity = Severity::kCrit;
  s->memory.label = MemoryLabel::kHighPressure;
  s->memory.kind = MemoryKind::kReserved;
  s->memory.kinds[1].worst_rank = 9;
  auto e = t.Evaluate(s, 0);
  ASSERT_EQ(e.size(), 4u);
  EXPECT_EQ(e[0].id, "j|odd|hang|job");
  EXPECT_EQ(e[2].id, "j|odd|memory_pressure|rank:9");
  auto node = std::make_shared<JobSnapshot>(*Straggler("j|odd", 3));
  node->step.scope = CulpritScope::kNode;
  node->step.culprit_node = "node-0";
  node->step.label = StepLabel::kStraggler;
  node->step.cause = StragglerCause::kBoth;
  e = t.Evaluate(node, 1);
  ASSERT_EQ(e.size(), 4u);  // straggler pending + firing, hang and pressure resolved
  EXPECT_EQ(e[0].id, "j|odd|straggler|node:node-0");
  EXPECT_EQ(e[0].cause, StragglerCause::kBoth);
  EXPECT_EQ(t.ForgetJob("j|odd", 2).size(), 1u);
  EXPECT_EQ(t.active(), 0u);
}

// A straggler on `rank` (node "n<rank / 8>") over a window ending at `last_step`, costing
// `lost` rank-seconds a step since `since`.
std::shared_ptr<const JobSnapshot> Costly(const std::string& job, uint32_t rank, uint64_t last_step,
                                          double lost, uint64_t since = 1) {
  auto s = std::const_pointer_cast<JobSnapshot>(Straggler(job, rank));
  auto nodes = std::make_shared<std::vector<std::string>>();
  for (uint32_t r = 0; r < 16; ++r) nodes->push_back("n" + std::to_string(r / 8));
  s->rank_nodes = nodes;
  s->window_steps = static_cast<uint32_t>(std::min<uint64_t>(last_step, 100));
  s->window_first_step = last_step - s->window_steps + 1;
  s->window_last_step = last_step;
  s->step.straggler.present = true;
  s->step.straggler.rank = rank;
  s->step.straggler.lost_rank_seconds_per_step = lost;
  s->step.straggler.since_step = since;
  s->scheduler.k8s_namespace = "team-a";
  return s;
}

std::shared_ptr<const JobSnapshot> HealthyAt(const std::string& job, uint64_t last_step) {
  auto s = std::const_pointer_cast<JobSnapshot>(Healthy(job));
  s->rank_nodes = Costly(job, 0, 1, 0)->rank_nodes;
  s->window_steps = 50;
  s->window_first_step = last_step - 49;
  s->window_last_step = last_step;
  return s;
}

TEST(AlertTrackerTest, AFiringStragglerChargesItsNodeAnEpisodeAndItsCostPerStep) {
  AlertTracker t({.fire_after = 3, .resolve_after = 2});
  t.Evaluate(Costly("j", 9, 10, 2.0), 100);
  t.Evaluate(Costly("j", 9, 20, 2.0), 101);
  EXPECT_TRUE(t.TakeNodeCharges().empty());               // pending: no charge
  t.Evaluate(Costly("j", 9, 30, 2.0, /*since=*/5), 102);  // fires
  std::vector<NodeCharge> c = t.TakeNodeCharges();
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].training_job, "j");
  EXPECT_EQ(c[0].node, "n1");
  EXPECT_EQ(c[0].episodes, 1u);
  EXPECT_EQ(c[0].ranks, std::vector<uint32_t>{9});
  EXPECT_TRUE(c[0].firing);
  EXPECT_EQ(c[0].k8s_namespace, "team-a");
  EXPECT_DOUBLE_EQ(c[0].lost_rank_seconds, 2.0 * 26);  // steps 5..30: its onset on
  EXPECT_EQ(c[0].first_unix_ns, 102);
  // Ten more steps at 3 rank-seconds each.
  t.Evaluate(Costly("j", 9, 40, 3.0), 103);
  c = t.TakeNodeCharges();
  ASSERT_EQ(c.size(), 1u);
  EXPECT_DOUBLE_EQ(c[0].lost_rank_seconds, 52 + 30);
  EXPECT_EQ(c[0].last_unix_ns, 103);
  // Clean, but not yet resolved: the steps are not charged.
  t.Evaluate(HealthyAt("j", 50), 104);
  c = t.TakeNodeCharges();
  EXPECT_TRUE(c.empty());
  t.Evaluate(HealthyAt("j", 60), 105);  // resolves: the node stops firing
  c = t.TakeNodeCharges();
  ASSERT_EQ(c.size(), 1u);
  EXPECT_FALSE(c[0].firing);
  EXPECT_DOUBLE_EQ(c[0].lost_rank_seconds, 82);
  // A second episode on another rank of the same node: one record, two episodes; the steps
  // between the episodes are not charged.
  for (int i = 0; i < 3; ++i) t.Evaluate(Costly("j", 12, 70 + i, 1.0, 70), 106 + i);
  c = t.TakeNodeCharges();
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].episodes, 2u);
  EXPECT_EQ(c[0].ranks, (std::vector<uint32_t>{9, 12}));
  EXPECT_DOUBLE_EQ(c[0].lost_rank_seconds, 82 + 3);  // steps 70, 71, 72
}

TEST(AlertTrackerTest, NodeChargesMoveWithTheJobAndEndWhenItIsForgotten) {
  AlertTracker before({.fire_after = 1, .resolve_after = 10});
  before.Evaluate(Costly("j", 2, 10, 1.0, 10), 1);
  before.TakeNodeCharges();
  AlertTracker after({.fire_after = 1, .resolve_after = 10});
  after.RestoreJob(before.ExportJob("j"));
  ASSERT_EQ(after.NodeCharges("j").size(), 1u);
  EXPECT_EQ(after.NodeCharges("j")[0].node, "n0");
  EXPECT_EQ(after.NodeCharges("j")[0].charged_through_step, 10u);
  // The restored tracker charges from where the other stopped.
  after.Evaluate(Costly("j", 2, 15, 1.0, 10), 2);
  std::vector<NodeCharge> c = after.TakeNodeCharges();
  ASSERT_EQ(c.size(), 1u);
  EXPECT_DOUBLE_EQ(c[0].lost_rank_seconds, 1.0 + 5);
  EXPECT_EQ(c[0].episodes, 1u);  // not fired again
  after.ForgetJob("j", 3);
  c = after.TakeNodeCharges();
  ASSERT_EQ(c.size(), 1u);
  EXPECT_FALSE(c[0].firing);
  EXPECT_EQ(c[0].last_unix_ns, 3);
  EXPECT_TRUE(after.NodeCharges("j").empty());
}

TEST(AlertTrackerTest, ANodeScopeStragglerChargesTheNodeWithItsRanks) {
  AlertTracker t({.fire_after = 1, .resolve_after = 10});
  auto s = std::const_pointer_cast<JobSnapshot>(Costly("j", 8, 10, 4.0, 10));
  s->step.scope = CulpritScope::kNode;
  s->step.culprit_node = "n1";
  s->step.culprit_ranks = {8, 9, 10};
  t.Evaluate(s, 1);
  std::vector<NodeCharge> c = t.TakeNodeCharges();
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].node, "n1");
  EXPECT_EQ(c[0].ranks, (std::vector<uint32_t>{8, 9, 10}));
  EXPECT_DOUBLE_EQ(c[0].lost_rank_seconds, 4.0);
}

TEST(AlertTrackerTest, ARankWithoutAKnownNodeChargesNothing) {
  AlertTracker t({.fire_after = 1, .resolve_after = 10});
  t.Evaluate(Straggler("j", 3), 1);  // no rank_nodes
  EXPECT_TRUE(t.TakeNodeCharges().empty());
}

}  // namespace
}  // namespace rankwatch
