// The timeline read from a real StateStore (RocksDB in a temporary directory) with steps stored
// as the daemon's checkpoints store them, and its Chrome trace form parsed back as JSON.
#include "serving/timeline.h"

#include <gtest/gtest.h>
#include <simdjson.h>

#include <unistd.h>

#include <filesystem>
#include <map>
#include <set>

#include "alerting/alert_hub.h"
#include "common/json_string.h"
#include "operators/step_codec.h"
#include "state/job_state_store.h"

namespace rankwatch {
namespace {

constexpr int64_t kMs = 1'000'000;
constexpr int64_t kT0 = 1'700'000'000'000'000'000;  // unix ns

// Rank r of step s: 10 ms dataloader, 30 ms forward, 50 ms backward, 10 ms optimizer, 20 ms
// collective, a 160 ms step; rank 3 takes 60 ms more in forward, and the others wait for it.
StepSample Sample(uint64_t step, uint32_t rank) {
  StepSample s;
  s.step = step;
  s.rank = rank;
  s.Set(Phase::kDataloader, 10 * kMs);
  s.Set(Phase::kForward, (rank == 3 ? 90 : 30) * kMs);
  s.Set(Phase::kBackward, 50 * kMs);
  s.Set(Phase::kOptimizer, 10 * kMs);
  s.Set(Phase::kCollective, 20 * kMs);
  s.Set(Phase::kStep, 160 * kMs);
  s.Set(Phase::kWait, 160 * kMs - s.Get(Phase::kDataloader) - s.Get(Phase::kForward) -
                          s.Get(Phase::kBackward) - s.Get(Phase::kOptimizer));
  s.end_unix_ns = kT0 + static_cast<int64_t>(step) * 160 * kMs;
  return s;
}

class TimelineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) /
           ("timeline_test_" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir_);
    auto store = StateStore::Open({dir_});
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
    // Steps 1..20 of an 8-rank job on 2 nodes, samples stored out of rank order.
    std::vector<state::v1::StoredStep> steps;
    for (uint64_t step = 1; step <= 20; ++step) {
      AlignedStep a;
      a.step = step;
      a.world_size = 8;
      for (uint32_t r : {5u, 0u, 7u, 3u, 1u, 6u, 2u, 4u}) a.samples.push_back(Sample(step, r));
      steps.push_back(EncodeStep(a));
    }
    // Another job whose name extends this one's: its steps must not be read.
    std::vector<state::v1::StoredStep> other;
    AlignedStep b;
    b.step = 7;
    b.world_size = 1;
    b.samples.push_back(Sample(7, 0));
    other.push_back(EncodeStep(b));
    Checkpoint c;
    state::v1::JobMeta meta;
    meta.set_training_job("job");
    job_state::PutJob("job", meta, std::move(steps), 1, &c);
    meta.set_training_job("job2");
    job_state::PutJob("job2", meta, std::move(other), 1, &c);
    ASSERT_TRUE(store_->Commit(c).ok());

    snapshot_.training_job = "job";
    snapshot_.world_size = 8;
    snapshot_.has_window = true;
    snapshot_.window_first_step = 31;  // live, ahead of the last checkpoint
    snapshot_.window_last_step = 40;
    snapshot_.window_steps = 10;
    snapshot_.rank_nodes =
        std::make_shared<const std::vector<std::string>>(std::vector<std::string>{
            "node-a", "node-a", "node-a", "node-a", "node-b", "node-b", "node-b", "node-b"});
    snapshot_.step.culprit_ranks = {3};
  }
  void TearDown() override {
    store_.reset();
    std::filesystem::remove_all(dir_);
  }

  std::filesystem::path dir_;
  std::unique_ptr<StateStore> store_;
  JobSnapshot snapshot_;
};

TEST_F(TimelineTest, ReadsTheNewestStoredWindowByDefaultRankByRank) {
  auto t = BuildTimeline(snapshot_, v1::GetTimelineRequest(), *store_, nullptr, nullptr);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->training_job(), "job");
  EXPECT_EQ(t->world_size(), 8u);
  EXPECT_EQ(t->stored_first_step(), 1u);
  EXPECT_EQ(t->stored_last_step(), 20u);
  EXPECT_FALSE(t->truncated());
  ASSERT_EQ(t->steps_size(), 10);
  EXPECT_EQ(t->steps(0).step(), 11u);
  EXPECT_EQ(t->steps(9).step(), 20u);
  ASSERT_EQ(t->rank_nodes_size(), 8);
  EXPECT_EQ(t->rank_nodes(4), "node-b");
  ASSERT_EQ(t->culprit_ranks_size(), 1);
  const v1::TimelineStep& s = t->steps(0);
  ASSERT_EQ(s.ranks_size(), 8);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(s.ranks(i).rank(), static_cast<uint32_t>(i));
  std::map<v1::Phase, int64_t> phases;
  for (const v1::TimelinePhase& p : s.ranks(3).phases()) phases[p.phase()] = p.ns();
  EXPECT_EQ(phases[v1::PHASE_FORWARD], 90 * kMs);
  EXPECT_EQ(phases[v1::PHASE_STEP], 160 * kMs);
  EXPECT_EQ(phases[v1::PHASE_COLLECTIVE], 20 * kMs);
  EXPECT_EQ(s.ranks(3).end_unix_ns(), kT0 + 11 * 160 * kMs);
}

// The store is up to one checkpoint behind the live window: an alert raised at a step not yet
// stored is still listed when no last step is asked for, and left out of a closed range.
TEST_F(TimelineTest, ListsAnAlertRaisedAfterTheNewestStoredStepUnlessARangeEndsBefore) {
  AlertHub hub(nullptr, nullptr, {}, {});
  std::vector<v1::Alert> raised;
  for (uint64_t step : {15u, 25u}) {
    v1::Alert a;
    a.set_id("straggler/job/rank:3/" + std::to_string(step));
    a.set_training_job("job");
    a.set_kind(v1::ALERT_STRAGGLER);
    a.set_state(v1::ALERT_FIRING);
    a.set_subject("rank:3");
    a.set_at_unix_ns(kT0 + static_cast<int64_t>(step) * 160 * kMs);
    a.mutable_evidence()->mutable_step()->mutable_window()->set_last_step(step);
    raised.push_back(std::move(a));
  }
  hub.Append(std::move(raised), Checkpoint());
  ASSERT_TRUE(hub.Flush().ok());

  auto steps_of = [](const v1::Timeline& t) {
    std::vector<uint64_t> out;
    for (const v1::TimelineAlert& a : t.alerts()) out.push_back(a.step());
    return out;
  };
  auto newest = BuildTimeline(snapshot_, v1::GetTimelineRequest(), *store_, &hub, nullptr);
  ASSERT_TRUE(newest.ok()) << newest.status();
  ASSERT_EQ(newest->steps(newest->steps_size() - 1).step(), 20u);
  EXPECT_EQ(steps_of(*newest), (std::vector<uint64_t>{15, 25}));

  v1::GetTimelineRequest from;
  from.set_first_step(12);
  auto open = BuildTimeline(snapshot_, from, *store_, &hub, nullptr);
  ASSERT_TRUE(open.ok()) << open.status();
  EXPECT_EQ(steps_of(*open), (std::vector<uint64_t>{15, 25}));

  v1::GetTimelineRequest closed;
  closed.set_first_step(12);
  closed.set_last_step(20);
  auto range = BuildTimeline(snapshot_, closed, *store_, &hub, nullptr);
  ASSERT_TRUE(range.ok()) << range.status();
  EXPECT_EQ(steps_of(*range), (std::vector<uint64_t>{15}));

  // In the trace, the unstored step's alert is on its rank's track at its time.
  const std::string trace = TimelineChromeTrace(*newest, TimelineGrouping::kNode);
  EXPECT_NE(trace.find("straggler firing: rank:3"), std::string::npos);
}

TEST_F(TimelineTest, ReadsTheRangeAskedForAndKeepsTheNewestThatFit) {
  v1::GetTimelineRequest r;
  r.set_first_step(3);
  r.set_last_step(5);
  auto t = BuildTimeline(snapshot_, r, *store_, nullptr, nullptr);
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->steps_size(), 3);
  EXPECT_EQ(t->steps(0).step(), 3u);

  r.clear_last_step();  // from 3 to the newest
  r.set_max_rank_steps(8 * 4);
  t = BuildTimeline(snapshot_, r, *store_, nullptr, nullptr);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_TRUE(t->truncated());
  ASSERT_EQ(t->steps_size(), 4);
  EXPECT_EQ(t->steps(0).step(), 17u);
  EXPECT_EQ(t->steps(3).step(), 20u);

  r.set_first_step(30);  // nothing stored there
  t = BuildTimeline(snapshot_, r, *store_, nullptr, nullptr);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->steps_size(), 0);
  EXPECT_EQ(t->stored_last_step(), 20u);

  r.set_first_step(9);
  r.set_last_step(8);
  EXPECT_EQ(BuildTimeline(snapshot_, r, *store_, nullptr, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(TimelineTest, ChromeTraceHasATrackPerRankGroupedByNode) {
  auto t = BuildTimeline(snapshot_, v1::GetTimelineRequest(), *store_, nullptr, nullptr);
  ASSERT_TRUE(t.ok()) << t.status();
  // An alert on the culprit and a capture of it and of a typical rank.
  v1::TimelineAlert* ta = t->add_alerts();
  ta->set_step(15);
  v1::Alert* a = ta->mutable_alert();
  a->set_id("a1");
  a->set_kind(v1::ALERT_STRAGGLER);
  a->set_state(v1::ALERT_FIRING);
  a->set_subject("rank:3");
  a->set_at_unix_ns(kT0 + 99 * 160 * kMs);  // the daemon's clock: placed by its step instead
  v1::Capture* c = t->add_captures();
  c->set_id("cap-1");
  c->set_requested_unix_ns(kT0 + 16 * 160 * kMs);
  v1::CaptureRank* cr = c->add_ranks();
  cr->set_rank(3);
  cr->set_first_step(16);
  cr = c->add_ranks();
  cr->set_rank(5);
  cr->set_first_step(-1);  // has not begun: when it was asked for

  for (TimelineGrouping grouping : {TimelineGrouping::kNode, TimelineGrouping::kRank}) {
    const std::string json = TimelineChromeTrace(*t, grouping);
    simdjson::dom::parser parser;
    simdjson::dom::element doc;
    ASSERT_EQ(parser.parse(json).get(doc), simdjson::SUCCESS) << json.substr(0, 500);
    simdjson::dom::array events;
    ASSERT_EQ(doc["traceEvents"].get(events), simdjson::SUCCESS);
    std::map<int64_t, std::string> process_names;
    std::map<std::pair<int64_t, int64_t>, std::string> thread_names;
    std::map<std::string, int> slices;  // name -> count
    std::map<int64_t, int64_t> pid_of_rank;
    int64_t forward_ns_rank3 = 0, forward_ns_rank0 = 0;
    std::map<std::string, double> instants;  // name@tid -> ts (us)
    for (simdjson::dom::element e : events) {
      std::string_view ph, name;
      ASSERT_EQ(e["ph"].get(ph), simdjson::SUCCESS);
      ASSERT_EQ(e["name"].get(name), simdjson::SUCCESS);
      int64_t pid = 0, tid = 0;
      ASSERT_EQ(e["pid"].get(pid), simdjson::SUCCESS);
      if (ph == "M") {
        std::string_view value;
        if (name == "process_name") {
          ASSERT_EQ(e["args"]["name"].get(value), simdjson::SUCCESS);
          process_names[pid] = std::string(value);
        } else if (name == "thread_name") {
          ASSERT_EQ(e["tid"].get(tid), simdjson::SUCCESS);
          ASSERT_EQ(e["args"]["name"].get(value), simdjson::SUCCESS);
          thread_names[{pid, tid}] = std::string(value);
        }
        continue;
      }
      ASSERT_EQ(e["tid"].get(tid), simdjson::SUCCESS);
      double ts = 0;
      ASSERT_EQ(e["ts"].get(ts), simdjson::SUCCESS);
      if (ph == "X") {
        double dur = 0;
        ASSERT_EQ(e["dur"].get(dur), simdjson::SUCCESS);
        EXPECT_GE(dur, 0);
        ++slices[std::string(name)];
        pid_of_rank[tid] = pid;
        if (name == "forward" && tid == 3) forward_ns_rank3 += static_cast<int64_t>(dur * 1e3);
        if (name == "forward" && tid == 0) forward_ns_rank0 += static_cast<int64_t>(dur * 1e3);
      } else {
        EXPECT_EQ(ph, "i");
        instants[std::string(name) + "@" + std::to_string(tid)] = ts;
      }
    }
    // One track per rank, named, each with a slice per step and its phases.
    EXPECT_EQ(thread_names.size(), 8u);
    EXPECT_EQ(slices["step 11"], 8);
    EXPECT_EQ(slices["forward"], 80);
    EXPECT_EQ(slices["dataloader"], 80);
    EXPECT_EQ(slices["wait"], 70);  // rank 3 waits for nobody
    EXPECT_EQ(forward_ns_rank3, 10 * 90 * kMs);
    EXPECT_EQ(forward_ns_rank0, 10 * 30 * kMs);
    // The alert at the end of its step on its rank; the capture where rank 3's profiled step
    // began, and when it was asked for on rank 5, which had not begun.
    const double us = 1e-3;
    ASSERT_TRUE(instants.count("straggler firing: rank:3@3")) << instants.begin()->first;
    EXPECT_NEAR(instants["straggler firing: rank:3@3"], (kT0 + 15 * 160 * kMs) * us, 1);
    ASSERT_TRUE(instants.count("capture cap-1@3"));
    EXPECT_NEAR(instants["capture cap-1@3"], (kT0 + 15 * 160 * kMs) * us, 1);
    ASSERT_TRUE(instants.count("capture cap-1@5"));
    EXPECT_NEAR(instants["capture cap-1@5"], (kT0 + 16 * 160 * kMs) * us, 1);
    if (grouping == TimelineGrouping::kNode) {
      ASSERT_EQ(process_names.size(), 2u);
      EXPECT_EQ(process_names[1], "node node-a");
      EXPECT_EQ(process_names[2], "node node-b");
      for (int64_t r = 0; r < 8; ++r) EXPECT_EQ(pid_of_rank[r], r < 4 ? 1 : 2) << "rank " << r;
      EXPECT_EQ((thread_names[{1, 3}]), "rank 3 culprit");
    } else {
      ASSERT_EQ(process_names.size(), 1u);
      EXPECT_EQ(process_names[1], "job job");
      EXPECT_EQ((thread_names[{1, 5}]), "rank 5 (node-b)");
    }
  }
}

TEST(JsonStringTest, EscapesQuotesBackslashesAndControlCharacters) {
  EXPECT_EQ(JsonString("a\"b\\c\n\x01"), "\"a\\\"b\\\\c\\u000a\\u0001\"");
}

}  // namespace
}  // namespace rankwatch
