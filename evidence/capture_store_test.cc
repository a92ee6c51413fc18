#include "evidence/capture_store.h"

#include <gtest/gtest.h>

#include "evidence/control_requests_test_util.h"

namespace rankwatch {
namespace {

constexpr int64_t kSecond = 1'000'000'000;
constexpr int64_t kNow = 1'700'000'000 * kSecond;

v1::Batch Reply(const std::string& job, uint32_t rank, const std::string& id,
                v1::ControlState state, uint64_t events = 0, const std::string& reason = "") {
  v1::Batch b;
  b.mutable_source()->set_training_job(job);
  b.mutable_source()->set_rank(rank);
  v1::ControlReply* r = b.add_control_replies();
  r->set_request_id(id);
  r->set_state(state);
  r->set_reason(reason);
  if (state == v1::CONTROL_DONE) {
    r->set_first_step(40);
    r->set_steps(2);
    r->set_events(events);
    r->set_profiled_step_ns(2 * 30'000'000);
  }
  return b;
}

// Two profiled steps of a rank: forward holds aten::addmm (and an extra aten::mm of `extra_us`),
// backward holds aten::mm.
v1::Batch Events(const std::string& job, uint32_t rank, const std::string& id, int64_t extra_us) {
  v1::Batch b;
  b.mutable_source()->set_training_job(job);
  b.mutable_source()->set_rank(rank);
  b.mutable_trace()->set_capture_id(id);
  b.mutable_trace()->set_source_format("torch.profiler");
  b.add_strings("");
  for (const char* s : {"DistributedDataParallel.forward", "aten::addmm", "aten::mm",
                        "autograd::engine::evaluate_function: MmBackward0", "cpu_op"}) {
    b.add_strings(s);
  }
  auto ev = [&](uint32_t name, int64_t ts_us, int64_t dur_us, int64_t step) {
    v1::KernelEvent* k = b.add_kernels();
    k->set_name(name);
    k->set_category(5);
    k->set_ts_ns(ts_us * 1000);
    k->set_dur_ns(dur_us * 1000);
    k->set_tid(11);
    k->set_stream(-1);
    k->set_step(step);
  };
  for (int64_t step = 40; step < 42; ++step) {
    const int64_t t0 = (step - 40) * 100'000;
    ev(1, t0, 1000 + extra_us, step);
    ev(2, t0 + 10, 500, step);
    if (extra_us > 0) ev(3, t0 + 600, extra_us, step);
    ev(4, t0 + 2000 + extra_us, 800, step);
    ev(3, t0 + 2010 + extra_us, 700, step);
  }
  return b;
}

TEST(CaptureStoreTest, ARequestIsSentAndTheComparisonNamesTheExtraMatrixMultiply) {
  Sent sent;
  CaptureStore store({}, sent.Sender());
  auto c = store.Request("job", {5, 3}, 3, 5, 2, "rankwatch capture", "", nullptr, kNow);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->state(), v1::CAPTURE_REQUESTED);
  ASSERT_EQ(sent.requests.size(), 1u);
  EXPECT_EQ(sent.requests[0].first, "job");
  const v1::ControlRequest& r = sent.requests[0].second;
  EXPECT_EQ(r.id(), c->id());
  EXPECT_EQ(r.training_job(), "job");
  ASSERT_EQ(r.ranks_size(), 2);
  EXPECT_EQ(r.ranks(0), 3u);  // sorted
  EXPECT_EQ(r.capture().steps(), 2u);
  EXPECT_EQ(r.deadline_unix_ns(), kNow + 60 * kSecond);

  store.OnBatch(Reply("job", 3, c->id(), v1::CONTROL_ACCEPTED));
  EXPECT_EQ(store.Get(c->id())->state(), v1::CAPTURE_RUNNING);
  store.OnBatch(Reply("other-job", 5, c->id(), v1::CONTROL_ACCEPTED));  // not this job's
  store.OnBatch(Events("job", 3, c->id(), 3000));
  store.OnBatch(Reply("job", 3, c->id(), v1::CONTROL_DONE, 10));
  store.OnBatch(Events("job", 5, c->id(), 0));
  EXPECT_EQ(store.Get(c->id())->state(), v1::CAPTURE_RUNNING);  // rank 5 not done yet
  store.OnBatch(Reply("job", 5, c->id(), v1::CONTROL_DONE, 8));
  store.OnBatch(Reply("job", 5, c->id(), v1::CONTROL_ACCEPTED));  // late: never moves back

  std::vector<v1::CaptureTrace> traces;
  const std::optional<v1::Capture> done = store.Get(c->id(), &traces);
  ASSERT_TRUE(done.has_value());
  EXPECT_EQ(done->state(), v1::CAPTURE_DONE) << done->reason();
  EXPECT_TRUE(done->reason().empty()) << done->reason();
  ASSERT_EQ(done->ranks_size(), 2);
  EXPECT_EQ(done->ranks(0).role(), "culprit");
  EXPECT_EQ(done->ranks(0).events_received(), 10u);
  EXPECT_EQ(done->ranks(0).first_step(), 40);
  EXPECT_DOUBLE_EQ(done->ranks(0).profiled_step_seconds(), 0.030);
  EXPECT_EQ(done->ranks(1).role(), "reference");
  EXPECT_EQ(done->ranks(1).state(), v1::CONTROL_DONE);
  ASSERT_GT(done->comparison_size(), 0);
  EXPECT_EQ(done->comparison(0).name(), "aten::mm");
  EXPECT_EQ(done->comparison(0).phase(), "forward");
  EXPECT_NEAR(done->comparison(0).culprit_seconds_per_step(), 0.003, 1e-9);
  EXPECT_NEAR(done->comparison(0).reference_seconds_per_step(), 0, 1e-12);
  // The raw events, names remapped into each trace's own table.
  ASSERT_EQ(traces.size(), 2u);
  EXPECT_EQ(traces[0].rank(), 3u);
  EXPECT_EQ(traces[0].events_size(), 10);
  EXPECT_EQ(traces[0].names(traces[0].events(2).name()), "aten::mm");
  EXPECT_EQ(traces[0].names(traces[0].events(0).category()), "cpu_op");
  // The evidence a diagnosis carries: this capture, its comparison cut; none for other jobs,
  // nor for a later capture still running.
  auto later = store.Request("job", {5, 3}, 3, 5, 2, "rankwatch capture", "", nullptr, kNow + 1);
  ASSERT_TRUE(later.ok()) << later.status();
  const std::optional<v1::Capture> evidence = store.LatestComparison("job", 1);
  ASSERT_TRUE(evidence.has_value());
  EXPECT_EQ(evidence->id(), c->id());
  ASSERT_EQ(evidence->comparison_size(), 1);
  EXPECT_EQ(evidence->comparison(0).name(), "aten::mm");
  EXPECT_FALSE(store.LatestComparison("other-job", 10).has_value());
}

TEST(CaptureStoreTest, ARefusalFailsTheCaptureAndSilenceExpiresIt) {
  Sent sent;
  CaptureStore store({}, sent.Sender());
  auto refused = store.Request("job", {1}, -1, -1, 3, "test", "", nullptr, kNow);
  ASSERT_TRUE(refused.ok());
  store.OnBatch(Reply("job", 1, refused->id(), v1::CONTROL_REFUSED, 0, "no_profiler: no torch"));
  EXPECT_EQ(store.Get(refused->id())->state(), v1::CAPTURE_FAILED);
  EXPECT_EQ(store.Get(refused->id())->reason(), "rank 1 refused: no_profiler: no torch");

  auto silent = store.Request("job", {0, 2}, -1, -1, 3, "test", "", nullptr, kNow);
  auto slow = store.Request("job", {4}, -1, -1, 3, "test", "", nullptr, kNow);
  ASSERT_TRUE(silent.ok() && slow.ok());
  store.OnBatch(Reply("job", 4, slow->id(), v1::CONTROL_ACCEPTED));
  store.Expire(kNow + 30 * kSecond);
  EXPECT_EQ(store.Get(silent->id())->state(), v1::CAPTURE_REQUESTED);
  store.Expire(kNow + 61 * kSecond);
  EXPECT_EQ(store.Get(silent->id())->state(), v1::CAPTURE_EXPIRED);
  EXPECT_EQ(store.Get(silent->id())->reason(),
            "no answer from ranks 0, 2 before the request's deadline");
  // Accepted: it may finish until a minute after the deadline.
  EXPECT_EQ(store.Get(slow->id())->state(), v1::CAPTURE_RUNNING);
  store.Expire(kNow + 121 * kSecond);
  EXPECT_EQ(store.Get(slow->id())->state(), v1::CAPTURE_EXPIRED);
  EXPECT_EQ(store.Get(slow->id())->reason(), "rank 4 accepted but did not finish in time");

  const std::vector<v1::Capture> listed = store.List("job");
  ASSERT_EQ(listed.size(), 3u);
  EXPECT_EQ(listed[0].id(), slow->id());  // newest first
  EXPECT_TRUE(store.List("another").empty());
}

TEST(CaptureStoreTest, RanksAreBusyFromAcceptingToTheirLastWordForABoundedTime) {
  Sent sent;
  CaptureStore store({}, sent.Sender());
  EXPECT_TRUE(store.BusyRanks("job", kNow).empty());
  auto c = store.Request("job", {5, 3}, 3, 5, 2, "test", "", nullptr, kNow);
  auto other = store.Request("other-job", {1}, -1, -1, 2, "test", "", nullptr, kNow);
  ASSERT_TRUE(c.ok() && other.ok());
  // Asked, not answered: serving nothing yet (a rank that never reads the request, or hangs
  // before it, is not held up by it).
  EXPECT_TRUE(store.BusyRanks("job", kNow).empty());
  store.OnBatch(Reply("job", 3, c->id(), v1::CONTROL_ACCEPTED));
  store.OnBatch(Reply("job", 5, c->id(), v1::CONTROL_ACCEPTED));
  store.OnBatch(Reply("other-job", 1, other->id(), v1::CONTROL_ACCEPTED));
  EXPECT_EQ(store.BusyRanks("job", kNow + kSecond), (std::vector<uint32_t>{3, 5}));
  store.Expire(kNow + kSecond);  // the tick that sees them accept
  store.OnBatch(Reply("job", 3, c->id(), v1::CONTROL_DONE, 0));
  EXPECT_EQ(store.BusyRanks("job", kNow + 2 * kSecond), (std::vector<uint32_t>{5}));
  store.OnBatch(Reply("job", 5, c->id(), v1::CONTROL_FAILED, 0, "export failed"));
  EXPECT_TRUE(store.BusyRanks("job", kNow + 3 * kSecond).empty());
  // A rank that accepted and then went silent (no step time known: 30 s for the trace's
  // export and upload) is busy no longer than that.
  EXPECT_EQ(store.BusyRanks("other-job", kNow + 30 * kSecond), (std::vector<uint32_t>{1}));
  EXPECT_TRUE(store.BusyRanks("other-job", kNow + 32 * kSecond).empty());
}

TEST(CaptureStoreTest, BadRequestsAndAnUnreachableBrokerAreErrors) {
  Sent sent;
  CaptureStore store({}, sent.Sender());
  JobSnapshot s;
  s.training_job = "job";
  s.world_size = 4;
  EXPECT_FALSE(store.Request("job", {}, -1, -1, 3, "t", "", &s, kNow).ok());
  EXPECT_FALSE(store.Request("job", {4}, -1, -1, 3, "t", "", &s, kNow).ok());    // no rank 4
  EXPECT_FALSE(store.Request("job", {1}, -1, -1, 101, "t", "", &s, kNow).ok());  // too many
  EXPECT_FALSE(store.Request("job", {1}, 2, -1, 3, "t", "", &s, kNow).ok());     // 2 not captured
  sent.status = absl::UnavailableError("broker down");
  auto c = store.Request("job", {1}, -1, -1, 3, "t", "", &s, kNow);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(store.List("").empty());
  EXPECT_TRUE(sent.requests.empty());
}

TEST(CaptureStoreTest, AFiringStragglerAlertCapturesItsCulpritAndATypicalRankOncePerInterval) {
  Sent sent;
  CaptureStore store({}, sent.Sender());
  JobSnapshot s;
  s.training_job = "job";
  s.world_size = 4;
  s.step.culprit_ranks = {2};
  v1::Alert a;
  a.set_id("job|straggler|rank:2");
  a.set_training_job("job");
  a.set_kind(v1::ALERT_STRAGGLER);
  a.set_state(v1::ALERT_PENDING);
  store.OnAlert(a, &s, kNow);  // pending: not yet
  EXPECT_TRUE(sent.requests.empty());
  a.set_state(v1::ALERT_FIRING);
  store.OnAlert(a, &s, kNow);
  ASSERT_EQ(sent.requests.size(), 1u);
  const std::vector<v1::Capture> listed = store.List("job");
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_EQ(listed[0].culprit_rank(), 2);
  EXPECT_NE(listed[0].reference_rank(), 2);
  EXPECT_GE(listed[0].reference_rank(), 0);
  EXPECT_EQ(listed[0].alert_id(), a.id());
  EXPECT_EQ(listed[0].requested_by(), "straggler alert job|straggler|rank:2");
  store.OnAlert(a, &s, kNow + 60 * kSecond);  // within the interval
  EXPECT_EQ(sent.requests.size(), 1u);
  store.OnAlert(a, &s, kNow + 601 * kSecond);
  EXPECT_EQ(sent.requests.size(), 2u);

  // A job without a culprit, another kind of alert, or automatic captures off: none.
  JobSnapshot balanced = s;
  balanced.training_job = "balanced";
  balanced.step.culprit_ranks.clear();
  a.set_training_job("balanced");
  store.OnAlert(a, &balanced, kNow);
  a.set_kind(v1::ALERT_HANG);
  store.OnAlert(a, &s, kNow);
  CaptureStoreOptions off;
  off.auto_capture = false;
  CaptureStore quiet(off, sent.Sender());
  a.set_kind(v1::ALERT_STRAGGLER);
  quiet.OnAlert(a, &s, kNow);
  EXPECT_EQ(sent.requests.size(), 2u);
}

}  // namespace
}  // namespace rankwatch
