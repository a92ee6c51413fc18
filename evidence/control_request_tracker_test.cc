#include "evidence/control_request_tracker.h"

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

namespace rankwatch {
namespace {

constexpr int64_t kSecond = 1'000'000'000;
constexpr int64_t kNow = 1'700'000'000 * kSecond;

v1::ControlReply Reply(const std::string& id, v1::ControlState state) {
  v1::ControlReply r;
  r.set_request_id(id);
  r.set_state(state);
  return r;
}

// The sequence an id ends with ("<prefix>-<ms>-<sequence>").
uint64_t SequenceOf(const std::string& id) { return std::stoull(id.substr(id.rfind('-') + 1)); }

TEST(ControlRequestTrackerTest, IdsAreUniqueAndOrderedAndCarryTheTimeAndDeadline) {
  ControlRequestTracker tracker("cap", std::chrono::seconds(60));
  const v1::ControlRequest first = tracker.Open("job", {3, 5}, kNow);
  EXPECT_EQ(first.id(), "cap-" + std::to_string(kNow / 1'000'000) + "-1");
  EXPECT_EQ(first.training_job(), "job");
  EXPECT_EQ(std::vector<uint32_t>(first.ranks().begin(), first.ranks().end()),
            (std::vector<uint32_t>{3, 5}));
  EXPECT_EQ(first.issued_unix_ns(), kNow);
  EXPECT_EQ(first.deadline_unix_ns(), kNow + 60 * kSecond);
  EXPECT_EQ(first.action_case(), v1::ControlRequest::ACTION_NOT_SET);  // the caller's

  // Many requests in the same millisecond, across jobs: every id differs, in order.
  std::set<std::string> ids = {first.id()};
  uint64_t last = SequenceOf(first.id());
  for (int i = 0; i < 100; ++i) {
    const std::string id = tracker.Open(i % 2 ? "job" : "other", {0}, kNow).id();
    EXPECT_TRUE(ids.insert(id).second) << id;
    EXPECT_GT(SequenceOf(id), last);
    last = SequenceOf(id);
  }
  EXPECT_EQ(tracker.open_requests(), 101u);

  const ControlRequestTracker::Request* r = tracker.Find(first.id());
  ASSERT_NE(r, nullptr);
  EXPECT_FALSE(r->PastDeadline(kNow + 60 * kSecond - 1));
  EXPECT_TRUE(r->PastDeadline(kNow + 60 * kSecond));
}

TEST(ControlRequestTrackerTest, ARequestToEveryRankNamesNoneAndTracksEach) {
  ControlRequestTracker tracker("stk", std::chrono::seconds(10));
  const v1::ControlRequest q = tracker.OpenToEveryRank("job", 4, kNow);
  EXPECT_EQ(q.ranks_size(), 0);
  EXPECT_EQ(q.deadline_unix_ns(), kNow + 10 * kSecond);
  EXPECT_EQ(q.id().rfind("stk-", 0), 0u) << q.id();
  const ControlRequestTracker::Request* r = tracker.Find(q.id());
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->ranks, (std::vector<uint32_t>{0, 1, 2, 3}));
  EXPECT_EQ(r->RanksIn(v1::CONTROL_STATE_UNSPECIFIED), (std::vector<uint32_t>{0, 1, 2, 3}));
  EXPECT_FALSE(r->AllFinal());
  EXPECT_NE(tracker.Apply("job", 3, Reply(q.id(), v1::CONTROL_ACCEPTED)), nullptr);
  EXPECT_EQ(tracker.Apply("job", 4, Reply(q.id(), v1::CONTROL_DONE)), nullptr);  // not asked
  EXPECT_EQ(r->StateOf(3), v1::CONTROL_ACCEPTED);
  EXPECT_EQ(r->StateOf(4), v1::CONTROL_STATE_UNSPECIFIED);
}

TEST(ControlRequestTrackerTest, ARanksStateNeverMovesBack) {
  ControlRequestTracker tracker("cap", std::chrono::seconds(60));
  const std::string id = tracker.Open("job", {0, 1, 2}, kNow).id();
  // Nothing, then ACCEPTED, then a last word.
  EXPECT_NE(tracker.Apply("job", 0, Reply(id, v1::CONTROL_ACCEPTED)), nullptr);
  EXPECT_NE(tracker.Apply("job", 0, Reply(id, v1::CONTROL_ACCEPTED)), nullptr);  // redelivered
  EXPECT_NE(tracker.Apply("job", 0, Reply(id, v1::CONTROL_DONE)), nullptr);
  // After the last word, an ACCEPTED redelivered late or another last word changes nothing.
  EXPECT_EQ(tracker.Apply("job", 0, Reply(id, v1::CONTROL_ACCEPTED)), nullptr);
  EXPECT_EQ(tracker.Apply("job", 0, Reply(id, v1::CONTROL_FAILED)), nullptr);
  EXPECT_EQ(tracker.Apply("job", 1, Reply(id, v1::CONTROL_ACCEPTED))->StateOf(1),
            v1::CONTROL_ACCEPTED);
  // A reply without a state does not reset one.
  EXPECT_EQ(tracker.Apply("job", 1, Reply(id, v1::CONTROL_STATE_UNSPECIFIED)), nullptr);
  // A refusal is a last word too, straight from nothing.
  EXPECT_NE(tracker.Apply("job", 2, Reply(id, v1::CONTROL_REFUSED)), nullptr);
  const ControlRequestTracker::Request* r = tracker.Find(id);
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->StateOf(0), v1::CONTROL_DONE);
  EXPECT_EQ(r->StateOf(1), v1::CONTROL_ACCEPTED);
  EXPECT_EQ(r->StateOf(2), v1::CONTROL_REFUSED);
  EXPECT_EQ(r->final_replies, 2u);
  EXPECT_FALSE(r->AllFinal());
  EXPECT_EQ(r->RanksIn(v1::CONTROL_ACCEPTED), std::vector<uint32_t>{1});
  EXPECT_NE(tracker.Apply("job", 1, Reply(id, v1::CONTROL_FAILED)), nullptr);
  EXPECT_TRUE(r->AllFinal());
}

TEST(ControlRequestTrackerTest, RepliesAreRoutedByRequestIdAndUnknownOnesIgnored) {
  ControlRequestTracker tracker("stk", std::chrono::seconds(10));
  const std::string a = tracker.Open("job-a", {0, 1}, kNow).id();
  const std::string b = tracker.Open("job-b", {0, 1}, kNow).id();
  const ControlRequestTracker::Request* got = tracker.Apply("job-b", 1, Reply(b, v1::CONTROL_DONE));
  ASSERT_NE(got, nullptr);
  EXPECT_EQ(got->id, b);
  EXPECT_EQ(got->training_job, "job-b");
  EXPECT_EQ(tracker.Find(a)->StateOf(1), v1::CONTROL_STATE_UNSPECIFIED);  // only b moved
  // Another daemon's request, a reply naming another job's request, a closed request: ignored.
  EXPECT_EQ(tracker.Apply("job-a", 0, Reply("stk-1-99", v1::CONTROL_DONE)), nullptr);
  EXPECT_EQ(tracker.Apply("job-a", 0, Reply(b, v1::CONTROL_DONE)), nullptr);
  EXPECT_EQ(tracker.Find(b)->StateOf(0), v1::CONTROL_STATE_UNSPECIFIED);
  tracker.Close(a);
  EXPECT_EQ(tracker.Find(a), nullptr);
  EXPECT_EQ(tracker.Apply("job-a", 0, Reply(a, v1::CONTROL_DONE)), nullptr);
  tracker.Close(a);  // again: a no-op
  EXPECT_EQ(tracker.open_requests(), 1u);
}

}  // namespace
}  // namespace rankwatch
