#include "fleet/node_ledger.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <set>

#include "rankwatch/state/v1/job_state.pb.h"

namespace rankwatch {
namespace {

constexpr int64_t kHour = int64_t{3600} * 1'000'000'000;
constexpr int64_t kT0 = int64_t{1'800'000'000} * 1'000'000'000;  // a wall clock, 2027

NodeCharge MakeCharge(const std::string& job, const std::string& node, double lost, int64_t at,
                      uint32_t episodes = 1, bool firing = true) {
  NodeCharge c;
  c.training_job = job;
  c.node = node;
  c.episodes = episodes;
  c.lost_rank_seconds = lost;
  c.first_unix_ns = at;
  c.last_unix_ns = at;
  c.ranks = {3};
  c.firing = firing;
  return c;
}

v1::NodeRecord Record(const NodeCharge& c) {
  v1::NodeRecord r;
  r.set_node(c.node);
  v1::NodeJob* j = r.add_by_job();
  j->set_training_job(c.training_job);
  j->set_episodes(c.episodes);
  j->set_lost_rank_seconds(c.lost_rank_seconds);
  j->set_first_unix_ns(c.first_unix_ns);
  j->set_last_unix_ns(c.last_unix_ns);
  j->set_firing(c.firing);
  return r;
}

v1::ListNodesResponse Top(const NodeLedger& l, int64_t now, const std::string& node = "") {
  v1::ListNodesRequest q;
  q.set_node(node);
  return l.ListNodes(q, now);
}

const auto kOwnsAll = [](const std::string&) { return true; };

TEST(NodeLedgerTest, SumsEachNodesJobsAndRanksNodesByCost) {
  NodeLedger l({});
  l.Charge({MakeCharge("a", "gpu-1", 100, kT0), MakeCharge("b", "gpu-1", 50, kT0 + 10),
            MakeCharge("c", "gpu-2", 400, kT0 + 20)});
  l.Charge({MakeCharge("d", "gpu-1", 5, kT0 + 30, 2)});
  const v1::ListNodesResponse top = Top(l, kT0 + kHour);
  ASSERT_EQ(top.nodes_size(), 2);
  EXPECT_EQ(top.nodes_total(), 2u);
  EXPECT_EQ(top.nodes(0).node(), "gpu-2");  // the costliest first
  EXPECT_EQ(top.nodes(1).node(), "gpu-1");
  EXPECT_EQ(top.nodes(1).jobs(), 3u);
  EXPECT_EQ(top.nodes(1).episodes(), 4u);
  EXPECT_DOUBLE_EQ(top.nodes(1).lost_rank_seconds(), 155);
  EXPECT_EQ(top.nodes(1).first_unix_ns(), kT0);
  EXPECT_EQ(top.nodes(1).last_unix_ns(), kT0 + 30);
  EXPECT_EQ(top.nodes(1).by_job_size(), 0);  // jobs only when one node is asked for

  const v1::ListNodesResponse one = Top(l, kT0 + kHour, "gpu-1");
  ASSERT_EQ(one.nodes_size(), 1);
  ASSERT_EQ(one.nodes(0).by_job_size(), 3);
  EXPECT_EQ(one.nodes(0).by_job(0).training_job(), "d");  // newest first
  EXPECT_EQ(one.nodes(0).by_job(2).training_job(), "a");
  EXPECT_EQ(one.nodes(0).by_job(2).ranks(0), 3u);
  EXPECT_EQ(Top(l, kT0, "gpu-9").nodes_size(), 0);
}

TEST(NodeLedgerTest, TheNewestRecordOfAJobWinsWhateverTheOrder) {
  NodeLedger l({});
  const NodeCharge newer = MakeCharge("a", "gpu-1", 80, kT0 + 100, 2);
  const NodeCharge older = MakeCharge("a", "gpu-1", 30, kT0 + 50, 1);
  EXPECT_TRUE(l.Apply(Record(newer)));
  EXPECT_FALSE(l.Apply(Record(older)));  // late: ignored
  EXPECT_FALSE(l.Apply(Record(newer)));  // again: nothing changes
  EXPECT_DOUBLE_EQ(Top(l, kT0 + kHour).nodes(0).lost_rank_seconds(), 80);
  EXPECT_EQ(Top(l, kT0 + kHour).nodes(0).episodes(), 2u);
  // Records that are not whole are ignored.
  v1::NodeRecord empty;
  EXPECT_FALSE(l.Apply(empty));
  v1::NodeRecord no_job = Record(newer);
  no_job.mutable_by_job(0)->clear_training_job();
  EXPECT_FALSE(l.Apply(no_job));
  EXPECT_EQ(l.records(), 1u);
}

TEST(NodeLedgerTest, OnlyOwnChargesArePublishedAndEachKeyOnce) {
  NodeLedger l({});
  l.Charge({MakeCharge("a", "gpu-1", 10, kT0)});
  l.Charge({MakeCharge("a", "gpu-1", 20, kT0 + 1)});
  l.Apply(Record(MakeCharge("b", "gpu-1", 5, kT0)));  // another instance's
  const std::vector<v1::NodeRecord> out = l.TakeUnpublished();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].by_job(0).training_job(), "a");
  EXPECT_DOUBLE_EQ(out[0].by_job(0).lost_rank_seconds(), 20);  // the newest
  EXPECT_TRUE(l.TakeUnpublished().empty());
}

TEST(NodeLedgerTest, RecordsOlderThanTheHorizonAndBeyondTheBoundGo) {
  NodeLedgerOptions o;
  o.horizon = std::chrono::hours(2);
  o.max_records = 3;
  NodeLedger l(o);
  l.Charge({MakeCharge("a", "gpu-1", 1, kT0), MakeCharge("b", "gpu-2", 1, kT0 + kHour),
            MakeCharge("c", "gpu-3", 1, kT0 + kHour + 1),
            MakeCharge("d", "gpu-4", 1, kT0 + kHour + 2)});
  EXPECT_EQ(l.records(), 3u);  // "a", the oldest, went
  EXPECT_EQ(Top(l, kT0 + kHour, "gpu-1").nodes_size(), 0);
  // Not pruned yet, but a query does not count records past the horizon.
  EXPECT_EQ(Top(l, kT0 + 3 * kHour + 1).nodes_total(), 2u);
  l.Prune(kT0 + 3 * kHour + 1);
  EXPECT_EQ(l.records(), 2u);
}

TEST(NodeLedgerTest, TheNodeAlertFiresAtNJobsWithinTheWindowOnTheOwningInstanceOnly) {
  NodeLedgerOptions o;
  o.alert_jobs = 3;
  o.alert_window = std::chrono::hours(24);
  NodeLedger l(o);
  l.Charge({MakeCharge("a", "gpu-17", 3600 * 20, kT0),
            MakeCharge("b", "gpu-17", 3600 * 11, kT0 + kHour)});
  Checkpoint state;
  EXPECT_TRUE(l.EvaluateAlerts(kT0 + kHour, kOwnsAll, &state).empty());
  EXPECT_TRUE(state.empty());
  l.Charge({MakeCharge("c", "gpu-17", 3600 * 10, kT0 + 2 * kHour)});
  // Another instance owns gpu-17: nothing here.
  EXPECT_TRUE(l.EvaluateAlerts(
                   kT0 + 2 * kHour, [](const std::string&) { return false; }, &state)
                  .empty());
  std::vector<v1::Alert> fired = l.EvaluateAlerts(kT0 + 2 * kHour, kOwnsAll, &state);
  ASSERT_EQ(fired.size(), 1u);
  const v1::Alert& a = fired[0];
  EXPECT_EQ(a.kind(), v1::ALERT_NODE_CULPRIT);
  EXPECT_EQ(a.state(), v1::ALERT_FIRING);
  EXPECT_EQ(a.subject(), "node:gpu-17");
  EXPECT_EQ(a.training_job(), "");
  EXPECT_EQ(a.evidence().step().culprit_node(), "gpu-17");
  EXPECT_EQ(a.evidence().step().note(),
            "node gpu-17: culprit of 3 jobs in 24 h, 41.0 rank-hours lost: drain it");
  EXPECT_NE(a.evidence().step().next_step().find("c, b, a"), std::string::npos)
      << a.evidence().step().next_step();
  EXPECT_FALSE(state.empty());
  EXPECT_TRUE(Top(l, kT0 + 2 * kHour).nodes(0).alert_firing());
  EXPECT_EQ(l.firing(), 1u);
  EXPECT_EQ(l.FiringAlertIds(), std::vector<std::string>{a.id()});
  EXPECT_EQ(a.id(), "fleet|node_culprit|node:gpu-17");
  // Firing once: later evaluations say nothing while it holds.
  EXPECT_TRUE(l.EvaluateAlerts(kT0 + 3 * kHour, kOwnsAll, nullptr).empty());
  // "a" leaves the window 24 h after its last charge: 2 jobs, resolved.
  std::vector<v1::Alert> resolved = l.EvaluateAlerts(kT0 + 25 * kHour, kOwnsAll, nullptr);
  ASSERT_EQ(resolved.size(), 1u);
  EXPECT_EQ(resolved[0].state(), v1::ALERT_RESOLVED);
  EXPECT_EQ(resolved[0].id(), a.id());
  EXPECT_EQ(l.firing(), 0u);
}

TEST(NodeLedgerTest, AnInstanceThatComesToOwnAFiringNodeNeitherFiresItAgainNorForgetsIt) {
  NodeLedger a({}), b({});
  const std::vector<NodeCharge> charges = {
      MakeCharge("x", "n", 1, kT0), MakeCharge("y", "n", 1, kT0), MakeCharge("z", "n", 1, kT0)};
  a.Charge(charges);
  ASSERT_EQ(a.EvaluateAlerts(kT0, kOwnsAll, nullptr).size(), 1u);
  // What `a` publishes (its charges, and the alert's transition) reaches `b`.
  const std::vector<v1::NodeRecord> published = a.TakeUnpublished();
  ASSERT_EQ(published.size(), 4u);
  EXPECT_EQ(published.back().by_job_size(), 0);
  EXPECT_TRUE(published.back().alert_firing());
  for (const v1::NodeRecord& r : published) EXPECT_TRUE(b.Apply(r));
  EXPECT_TRUE(Top(b, kT0).nodes(0).alert_firing());
  // `b` owns the node now (a rebalance): no second firing.
  EXPECT_TRUE(b.EvaluateAlerts(kT0 + 1, kOwnsAll, nullptr).empty());
  // Past the window it resolves it, and `a` hears so.
  std::vector<v1::Alert> resolved = b.EvaluateAlerts(kT0 + 25 * kHour, kOwnsAll, nullptr);
  ASSERT_EQ(resolved.size(), 1u);
  EXPECT_EQ(resolved[0].state(), v1::ALERT_RESOLVED);
  for (const v1::NodeRecord& r : b.TakeUnpublished()) a.Apply(r);
  EXPECT_EQ(a.firing(), 0u);
  // An older transition arriving late changes nothing.
  EXPECT_FALSE(b.Apply(published.back()));
  EXPECT_EQ(b.firing(), 0u);
}

TEST(NodeLedgerTest, NoNodeAlertWhenTurnedOff) {
  NodeLedgerOptions o;
  o.alert_jobs = 0;
  NodeLedger l(o);
  l.Charge(
      {MakeCharge("a", "n", 1, kT0), MakeCharge("b", "n", 1, kT0), MakeCharge("c", "n", 1, kT0)});
  EXPECT_TRUE(l.EvaluateAlerts(kT0, kOwnsAll, nullptr).empty());
}

class NodeLedgerStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("node-ledger-test-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    auto store = StateStore::Open({dir_});
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
  }
  void TearDown() override {
    store_.reset();
    std::filesystem::remove_all(dir_);
  }
  std::filesystem::path dir_;
  std::unique_ptr<StateStore> store_;
};

TEST_F(NodeLedgerStoreTest, ARestartedLedgerHasEveryRecordAndDoesNotFireAgain) {
  NodeLedger before({});
  before.Charge({MakeCharge("a", "gpu-1", 10, kT0), MakeCharge("b", "gpu-1", 20, kT0),
                 MakeCharge("c", "gpu-1", 30, kT0), MakeCharge("x", "gpu-2", 1, kT0)});
  before.Apply(Record(MakeCharge("y", "gpu-2", 2, kT0)));  // read from the topic: stored too
  Checkpoint state;
  ASSERT_EQ(before.EvaluateAlerts(kT0, kOwnsAll, &state).size(), 1u);
  ASSERT_TRUE(store_->Commit(state).ok());
  ASSERT_TRUE(store_->Commit(before.TakeUnsaved()).ok());
  EXPECT_TRUE(before.TakeUnsaved().empty());

  NodeLedger after({});
  ASSERT_TRUE(after.LoadFrom(*store_).ok());
  const v1::ListNodesResponse a = Top(after, kT0 + 1);
  const v1::ListNodesResponse b = Top(before, kT0 + 1);
  EXPECT_EQ(a.SerializeAsString(), b.SerializeAsString());
  EXPECT_EQ(after.records(), 5u);
  EXPECT_TRUE(after.EvaluateAlerts(kT0 + 1, kOwnsAll, nullptr).empty());  // still firing
  EXPECT_EQ(after.firing(), 1u);
  // Loaded records are not stored again, nor published (the jobs' trackers publish their own
  // charges again); the node alert's transition is published again.
  EXPECT_TRUE(after.TakeUnsaved().empty());
  const std::vector<v1::NodeRecord> again = after.TakeUnpublished();
  ASSERT_EQ(again.size(), 1u);
  EXPECT_EQ(again[0].by_job_size(), 0);
  EXPECT_TRUE(again[0].alert_firing());
}

TEST_F(NodeLedgerStoreTest, ForgottenRecordsAreDeletedFromTheStore) {
  NodeLedgerOptions o;
  o.horizon = std::chrono::hours(1);
  NodeLedger l(o);
  l.Charge({MakeCharge("a", "gpu-1", 10, kT0), MakeCharge("b", "gpu-1", 10, kT0 + kHour)});
  ASSERT_TRUE(store_->Commit(l.TakeUnsaved()).ok());
  l.Prune(kT0 + kHour + 1);
  ASSERT_TRUE(store_->Commit(l.TakeUnsaved()).ok());
  NodeLedger again(o);
  ASSERT_TRUE(again.LoadFrom(*store_).ok());
  EXPECT_EQ(again.records(), 1u);
}

// The keys of the outbox markers the store holds.
std::set<std::string> OutboxKeys(const StateStore& store) {
  std::set<std::string> keys;
  EXPECT_TRUE(store
                  .ForEach(StateFamily::kMetadata, kNodeOutboxKeyPrefix,
                           [&](std::string_view k, std::string_view) { keys.emplace(k); })
                  .ok());
  return keys;
}

TEST_F(NodeLedgerStoreTest,
       AChargeNotDeliveredBeforeARestartIsPublishedAgainOnceTheViewIsComplete) {
  NodeLedger before({});
  before.EnableOutbox();
  before.Charge({MakeCharge("a", "gpu-1", 10, kT0), MakeCharge("b", "gpu-2", 20, kT0)});
  ASSERT_EQ(before.TakeUnpublished().size(), 2u);
  EXPECT_EQ(before.undelivered(), 2u);
  before.Delivered("gpu-2", "b", kT0);  // b's charge reached the topic, a's did not
  // A newer charge of b: an acknowledgement of the older one does not clear it.
  before.Charge({MakeCharge("b", "gpu-2", 25, kT0 + 5)});
  before.Delivered("gpu-2", "b", kT0);
  EXPECT_EQ(before.undelivered(), 2u);
  before.Delivered("gpu-2", "b", kT0 + 5);
  EXPECT_EQ(before.undelivered(), 1u);
  ASSERT_TRUE(store_->Commit(before.TakeUnsaved()).ok());
  EXPECT_EQ(OutboxKeys(*store_).size(), 1u);

  // Killed; restarted: a's charge is published again, once the nodes topic was read (the view
  // complete), as the newest record of its key then.
  NodeLedger after({});
  ASSERT_TRUE(after.LoadFrom(*store_).ok());
  after.EnableOutbox();
  EXPECT_TRUE(after.TakeUnpublished().empty()) << "not before the view is complete";
  after.Apply(Record(MakeCharge("a", "gpu-1", 12, kT0 + 7)));  // a newer one, from the topic
  after.SetComplete(true);
  const std::vector<v1::NodeRecord> again = after.TakeUnpublished();
  ASSERT_EQ(again.size(), 1u);
  EXPECT_EQ(again[0].node(), "gpu-1");
  EXPECT_EQ(again[0].by_job(0).training_job(), "a");
  EXPECT_EQ(again[0].by_job(0).lost_rank_seconds(), 12);
  EXPECT_TRUE(after.TakeUnpublished().empty());
  // Delivered now: its marker goes.
  after.Delivered("gpu-1", "a", kT0 + 7);
  ASSERT_TRUE(store_->Commit(after.TakeUnsaved()).ok());
  EXPECT_TRUE(OutboxKeys(*store_).empty());
}

TEST_F(NodeLedgerStoreTest, WithoutANodesTopicNothingWaitsForDelivery) {
  NodeLedger with_topic({});
  with_topic.EnableOutbox();
  with_topic.Charge({MakeCharge("a", "gpu-1", 10, kT0)});
  ASSERT_TRUE(store_->Commit(with_topic.TakeUnsaved()).ok());
  ASSERT_EQ(OutboxKeys(*store_).size(), 1u);
  // Restarted without a nodes topic: the marker is deleted, nothing is kept.
  NodeLedger alone({});
  ASSERT_TRUE(alone.LoadFrom(*store_).ok());
  alone.SetComplete(true);
  EXPECT_TRUE(alone.TakeUnpublished().empty());
  alone.Charge({MakeCharge("b", "gpu-1", 10, kT0)});
  EXPECT_EQ(alone.undelivered(), 0u);
  ASSERT_TRUE(store_->Commit(alone.TakeUnsaved()).ok());
  EXPECT_TRUE(OutboxKeys(*store_).empty());
}

TEST(NodeLedgerTest, AForgottenRecordLeavesTheOutbox) {
  NodeLedgerOptions o;
  o.horizon = std::chrono::hours(1);
  NodeLedger l(o);
  l.EnableOutbox();
  l.Charge({MakeCharge("a", "gpu-1", 10, kT0)});
  EXPECT_EQ(l.undelivered(), 1u);
  l.Prune(kT0 + 2 * kHour);
  EXPECT_EQ(l.undelivered(), 0u);
}

TEST(PartitionOfNodeTest, StableAndSpread) {
  EXPECT_EQ(PartitionOfNode("gpu-17", 12), PartitionOfNode("gpu-17", 12));
  EXPECT_EQ(PartitionOfNode("gpu-17", 0), 0);
  std::set<int32_t> seen;
  for (int i = 0; i < 200; ++i) {
    const int32_t p = PartitionOfNode("node-" + std::to_string(i), 8);
    ASSERT_GE(p, 0);
    ASSERT_LT(p, 8);
    seen.insert(p);
  }
  EXPECT_EQ(seen.size(), 8u);
  // FNV-1a 64 of "a" is 0xaf63dc4c8601ec8c: the partition a build of another version computes.
  EXPECT_EQ(PartitionOfNode("a", 1000), static_cast<int32_t>(0xaf63dc4c8601ec8cull % 1000));
}

}  // namespace
}  // namespace rankwatch
