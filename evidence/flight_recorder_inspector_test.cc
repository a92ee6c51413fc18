#include "evidence/flight_recorder_inspector.h"

#include <gtest/gtest.h>

#include "common/wall_clock.h"
#include "evidence/control_requests_test_util.h"
#include "flight_recorder/fr_proto.h"
#include "flight_recorder/fr_test_dumps.h"
#include "operators/step_time_diagnosis.h"

namespace rankwatch {
namespace {

constexpr int64_t kSecond = 1'000'000'000;

std::shared_ptr<const JobSnapshot> Job(const std::string& job, uint32_t world_size,
                                       uint64_t aligned_steps, bool hung) {
  auto s = std::make_shared<JobSnapshot>();
  s->training_job = job;
  s->world_size = world_size;
  s->aligned_steps = aligned_steps;
  s->step.label = hung ? StepLabel::kHang : StepLabel::kBalanced;
  s->step.seconds_since_last_aligned = hung ? 31 : 0;
  return s;
}

// Drives the inspector as the runtime does: the evaluated jobs are also the latest.
struct Ticker {
  FlightRecorderInspector* inspector;
  std::vector<v1::Alert> Tick(int64_t now, std::vector<std::shared_ptr<const JobSnapshot>> jobs,
                              std::vector<v1::Alert> alerts = {},
                              std::vector<std::string> removed = {}) {
    auto latest = std::make_shared<JobSnapshotMap>();
    for (const auto& s : jobs) (*latest)[s->training_job] = s;
    TickView t;
    t.now_unix_ns = now;
    t.evaluated = &jobs;
    t.removed = &removed;
    t.latest = latest;
    inspector->OnTick(t, &alerts);
    return alerts;
  }
};

// One rank's dump as its node agent publishes it.
v1::Batch DumpBatch(const std::string& job, uint32_t world_size, const fr::FrDump& dump,
                    const std::string& node = "node-a") {
  v1::Batch b;
  b.mutable_source()->set_training_job(job);
  b.mutable_source()->set_rank(static_cast<uint32_t>(dump.rank));
  b.mutable_source()->set_world_size(world_size);
  v1::FlightRecorderDump* d = b.add_flight_recorder_dumps();
  fr::DumpToProto(dump, {}, d);
  d->set_rank(static_cast<uint32_t>(dump.rank));
  d->set_node(node);
  d->set_source("/tmp/nccl_trace_rank_" + std::to_string(dump.rank));
  return b;
}

v1::Batch UnreadableBatch(const std::string& job, uint32_t world_size, uint32_t rank) {
  v1::Batch b;
  b.mutable_source()->set_training_job(job);
  b.mutable_source()->set_rank(rank);
  b.mutable_source()->set_world_size(world_size);
  v1::FlightRecorderDump* d = b.add_flight_recorder_dumps();
  fr::UnreadableToProto("not a Flight Recorder dump", {}, d);
  d->set_rank(rank);
  return b;
}

v1::Alert HangAlert(const std::string& job) {
  v1::Alert a;
  a.set_id("hang-" + job);
  a.set_training_job(job);
  a.set_kind(v1::ALERT_HANG);
  a.set_state(v1::ALERT_FIRING);
  a.mutable_evidence()->set_training_job(job);
  return a;
}

std::vector<uint32_t> Ranks(const google::protobuf::RepeatedField<uint32_t>& r) {
  return {r.begin(), r.end()};
}

TEST(FlightRecorderInspectorTest, AHungJobIsAskedOnceAndItsDumpsNameTheRankThatHoldsIt) {
  Sent sent;
  FlightRecorderInspector inspector({}, sent.Sender());
  Ticker t{&inspector};
  const int64_t now = WallNowUnixNs();
  // The hang alert fires before any dump came: no verdict in it.
  std::vector<v1::Alert> out = t.Tick(now, {Job("job", 4, 120, true)}, {HangAlert("job")});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_FALSE(out[0].evidence().has_flight_recorder());
  ASSERT_EQ(sent.requests.size(), 1u);
  const v1::ControlRequest q = sent.requests[0].second;
  EXPECT_EQ(sent.requests[0].first, "job");
  EXPECT_TRUE(q.has_flight_recorder());
  EXPECT_EQ(q.ranks_size(), 0);  // every rank
  EXPECT_EQ(q.deadline_unix_ns(), now + 60 * kSecond);
  t.Tick(now, {Job("job", 4, 120, true)});
  EXPECT_EQ(sent.requests.size(), 1u);  // one request a hang

  const std::vector<fr::FrDump> dumps = fr::testing::HungJobDumps();
  for (uint32_t r = 0; r < 3; ++r) inspector.OnBatch(DumpBatch("job", 4, dumps[r], "node-a"));
  EXPECT_TRUE(t.Tick(now, {Job("job", 4, 120, true)}).empty());
  EXPECT_FALSE(inspector.Get("job").has_value());  // 3 of 4, settle not passed
  inspector.OnBatch(DumpBatch("job", 4, dumps[3], "node-b"));
  out = t.Tick(now + kSecond, {Job("job", 4, 120, true)});
  // Every rank's dump came: analyzed at once, and the hang alert published again with it.
  auto v = inspector.Get("job");
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(v->dumps(), 4u);
  EXPECT_EQ(v->world_size(), 4u);
  EXPECT_EQ(v->analyzed_unix_ns(), now + kSecond);
  EXPECT_GT(v->last_dump_unix_ns(), 0);
  EXPECT_EQ(Ranks(v->read()), (std::vector<uint32_t>{0, 1, 2, 3}));
  ASSERT_GE(v->culprits_size(), 1);
  EXPECT_EQ(v->culprits(0).rank(), 3u);
  EXPECT_EQ(v->culprits(0).group_desc(), "TENSOR_MODEL_PARALLEL_GROUP");
  EXPECT_EQ(v->culprits(0).op().seq(), 5);
  ASSERT_GE(v->ranks_size(), 1);
  EXPECT_EQ(v->ranks(0).rank(), 3u);  // the culprit's row first
  EXPECT_EQ(v->ranks(0).node(), "node-b");
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].id(), "hang-job");
  EXPECT_EQ(out[0].state(), v1::ALERT_FIRING);
  EXPECT_EQ(out[0].at_unix_ns(), now + kSecond);
  EXPECT_EQ(out[0].evidence().flight_recorder().culprits(0).rank(), 3u);
  // Published once; a later hang alert of the job carries it.
  EXPECT_TRUE(t.Tick(now + 2 * kSecond, {Job("job", 4, 120, true)}).empty());
  out = t.Tick(now + 3 * kSecond, {Job("job", 4, 120, true)}, {HangAlert("job")});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].evidence().flight_recorder().analyzed_unix_ns(), now + kSecond);
  EXPECT_EQ(inspector.counters().analyses, 1u);

  // Progress after the dumps: that hang is over, its verdict goes. A later hang is asked again.
  t.Tick(now + 4 * kSecond, {Job("job", 4, 121, false)});
  EXPECT_FALSE(inspector.Get("job").has_value());
  t.Tick(now + 60 * kSecond, {Job("job", 4, 300, true)});
  ASSERT_EQ(sent.requests.size(), 2u);
  EXPECT_NE(sent.requests[1].second.id(), q.id());
  EXPECT_EQ(inspector.counters().requests, 2u);
  EXPECT_EQ(inspector.counters().dumps, 4u);
}

TEST(FlightRecorderInspectorTest, MissingDumpsSettleAndLaterDumpsAreAnalyzedAgain) {
  FlightRecorderInspector inspector({}, nullptr);  // no control topic: dumps still count
  Ticker t{&inspector};
  const int64_t now = WallNowUnixNs();
  const std::vector<fr::FrDump> dumps = fr::testing::HungJobDumps();
  for (uint32_t r = 0; r < 2; ++r) inspector.OnBatch(DumpBatch("job", 4, dumps[r]));
  t.Tick(now, {Job("job", 4, 10, true)});
  EXPECT_FALSE(inspector.Get("job").has_value());
  t.Tick(now + 3 * kSecond, {Job("job", 4, 10, true)});  // settle (2 s) passed
  auto v = inspector.Get("job");
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(Ranks(v->missing()), (std::vector<uint32_t>{2, 3}));
  EXPECT_EQ(v->dumps(), 2u);
  // One more: analyzed again once it settles.
  inspector.OnBatch(DumpBatch("job", 4, dumps[2]));
  t.Tick(WallNowUnixNs(), {Job("job", 4, 10, true)});
  EXPECT_EQ(inspector.counters().analyses, 1u);
  t.Tick(WallNowUnixNs() + 3 * kSecond, {Job("job", 4, 10, true)});
  EXPECT_EQ(inspector.counters().analyses, 2u);
  EXPECT_EQ(Ranks(inspector.Get("job")->missing()), std::vector<uint32_t>{3});
  // Rank 3's file is unreadable: the last one, analyzed at once.
  inspector.OnBatch(UnreadableBatch("job", 4, 3));
  t.Tick(WallNowUnixNs(), {Job("job", 4, 10, true)});
  EXPECT_EQ(inspector.counters().analyses, 3u);
  v = inspector.Get("job");
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(Ranks(v->unreadable()), std::vector<uint32_t>{3});
  EXPECT_EQ(v->missing_size(), 0);
  EXPECT_EQ(v->dumps(), 4u);
  // A removed job is forgotten.
  t.Tick(now + 4 * kSecond, {}, {}, {"job"});
  EXPECT_FALSE(inspector.Get("job").has_value());
}

TEST(FlightRecorderInspectorTest, DumpsAreBoundedByJobsAndBytes) {
  const fr::FrDump dump = fr::testing::HungJobDump(0);
  const size_t one =
      FlightRecorderInspector::KeptBytes(DumpBatch("a", 4, dump).flight_recorder_dumps(0));
  FlightRecorderInspectorOptions o;
  o.max_jobs = 2;
  o.max_bytes = 3 * one;
  FlightRecorderInspector inspector(o, nullptr);
  Ticker t{&inspector};
  const int64_t now = WallNowUnixNs();
  for (const std::string job : {"a", "b"}) {
    for (uint32_t r = 0; r < 2; ++r) {
      fr::FrDump d = fr::testing::HungJobDump(r);
      inspector.OnBatch(DumpBatch(job, 4, d));
    }
  }
  // Four dumps do not fit in three: job a (the oldest) made room for b's second.
  t.Tick(now + 3 * kSecond, {});
  EXPECT_FALSE(inspector.Get("a").has_value());
  ASSERT_TRUE(inspector.Get("b").has_value());
  EXPECT_EQ(inspector.Get("b")->dumps(), 2u);
  // A third job evicts b (two jobs at most); a rewritten dump replaces the older one.
  inspector.OnBatch(DumpBatch("c", 4, dump));
  inspector.OnBatch(DumpBatch("c", 4, dump));
  t.Tick(now + 6 * kSecond, {});
  EXPECT_FALSE(inspector.Get("b").has_value());
  EXPECT_EQ(inspector.Get("c")->dumps(), 1u);
  // A dump larger than everything allowed is dropped.
  FlightRecorderInspectorOptions tiny;
  tiny.max_bytes = one / 2;
  FlightRecorderInspector small(tiny, nullptr);
  small.OnBatch(DumpBatch("a", 4, dump));
  EXPECT_EQ(small.counters().dumps_dropped, 1u);
  EXPECT_EQ(small.counters().dumps, 0u);
}

}  // namespace
}  // namespace rankwatch
