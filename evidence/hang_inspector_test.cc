#include "evidence/hang_inspector.h"

#include <gtest/gtest.h>

#include "evidence/control_requests_test_util.h"
#include "operators/step_time_diagnosis.h"

namespace rankwatch {
namespace {

constexpr int64_t kSecond = 1'000'000'000;
constexpr int64_t kNow = 1'700'000'000 * kSecond;

std::shared_ptr<const JobSnapshot> Snapshot(const std::string& job, uint32_t world_size,
                                            uint64_t aligned_steps, bool hung) {
  auto s = std::make_shared<JobSnapshot>();
  s->training_job = job;
  s->world_size = world_size;
  s->aligned_steps = aligned_steps;
  s->step.label = hung ? StepLabel::kHang : StepLabel::kBalanced;
  s->step.seconds_since_last_aligned = hung ? 31 : 0;
  return s;
}

// The training thread of a DDP rank, in `function` of train.py at `line` (innermost), called
// from main(); `library` adds torch frames inside it.
v1::ThreadStack Training(const std::string& function, uint32_t line, bool library = false) {
  v1::ThreadStack t;
  t.set_name("MainThread");
  t.set_thread_id(1);
  t.set_training(true);
  auto frame = [&](const std::string& file, uint32_t l, const std::string& fn) {
    v1::StackFrame* f = t.add_frames();
    f->set_file(file);
    f->set_line(l);
    f->set_function(fn);
  };
  frame("/job/train.py", 90, "<module>");
  frame("/job/train.py", 70, "main");
  frame("/job/train.py", line, function);
  if (library) {
    frame("/usr/lib/python3/dist-packages/torch/_tensor.py", 396, "backward");
    frame("/usr/lib/python3/dist-packages/torch/autograd/__init__.py", 197, "backward");
  }
  return t;
}

v1::CollectiveCounter Counter(uint64_t entered, uint64_t completed) {
  v1::CollectiveCounter c;
  c.set_group("default");
  c.set_group_size(4);
  c.set_entered(entered);
  c.set_completed(completed);
  return c;
}

v1::Batch Answer(const std::string& job, uint32_t rank, const std::string& id,
                 v1::ControlState state, const v1::ThreadStack* stack = nullptr,
                 std::optional<v1::CollectiveCounter> counter = std::nullopt) {
  v1::Batch b;
  b.mutable_source()->set_training_job(job);
  b.mutable_source()->set_rank(rank);
  v1::ControlReply* r = b.add_control_replies();
  r->set_request_id(id);
  r->set_state(state);
  if (stack != nullptr) {
    v1::ThreadStack* helper = r->add_stacks();  // another thread, listed first
    helper->set_name("pin_memory");
    helper->add_frames()->set_function("_worker");
    *r->add_stacks() = *stack;
  }
  if (counter) *r->add_collectives() = *counter;
  return b;
}

std::vector<uint32_t> Ranks(const google::protobuf::RepeatedField<uint32_t>& r) {
  return {r.begin(), r.end()};
}

TEST(HangInspectorTest, AHungJobIsAskedOnceAndTheRankBehindOnCollectivesIsNamed) {
  Sent sent;
  HangInspector inspector({}, sent.Sender());
  inspector.OnSnapshots({Snapshot("job", 4, 120, true)}, kNow);
  ASSERT_EQ(sent.requests.size(), 1u);
  const v1::ControlRequest q = sent.requests[0].second;  // a copy: the vector grows below
  EXPECT_EQ(sent.requests[0].first, "job");
  EXPECT_TRUE(q.has_stacks());
  EXPECT_EQ(q.ranks_size(), 0);  // every rank
  EXPECT_EQ(q.stacks().max_frames(), 64u);
  EXPECT_EQ(q.deadline_unix_ns(), kNow + 10 * kSecond);
  // The same hang evaluated again is not asked again.
  inspector.OnSnapshots({Snapshot("job", 4, 120, true)}, kNow + kSecond);
  EXPECT_EQ(sent.requests.size(), 1u);
  // Awaiting answers: what is known so far.
  auto pending = inspector.Get("job");
  ASSERT_TRUE(pending.has_value());
  EXPECT_EQ(pending->settled_unix_ns(), 0);
  EXPECT_EQ(pending->ranks_asked(), 4u);

  // Rank 3 is stuck in load_shard before the allreduce; ranks 0-2 wait in backward's allreduce.
  const v1::ThreadStack stuck = Training("load_shard", 57);
  const v1::ThreadStack waiting = Training("train_step", 40, true);
  for (uint32_t r = 0; r < 4; ++r) {
    inspector.OnBatch(Answer("job", r, q.id(), v1::CONTROL_ACCEPTED));
  }
  for (uint32_t r = 0; r < 3; ++r) {
    inspector.OnBatch(Answer("job", r, q.id(), v1::CONTROL_DONE, &waiting, Counter(58, 57)));
  }
  inspector.OnSnapshots({}, kNow + 2 * kSecond);
  EXPECT_TRUE(inspector.TakeSettled().empty());  // rank 3 has not answered yet
  inspector.OnBatch(Answer("job", 3, q.id(), v1::CONTROL_DONE, &stuck, Counter(57, 57)));
  inspector.OnSnapshots({}, kNow + 3 * kSecond);
  EXPECT_EQ(inspector.TakeSettled(), std::vector<std::string>{"job"});
  EXPECT_TRUE(inspector.TakeSettled().empty());  // handed out once

  auto h = inspector.Get("job");
  ASSERT_TRUE(h.has_value());
  EXPECT_EQ(h->request_id(), q.id());
  EXPECT_EQ(h->settled_unix_ns(), kNow + 3 * kSecond);
  EXPECT_EQ(h->aligned_steps(), 120u);
  EXPECT_EQ(h->ranks_answered(), 4u);
  ASSERT_EQ(h->groups_size(), 2);
  EXPECT_EQ(Ranks(h->groups(0).ranks()), std::vector<uint32_t>{3});  // smallest group first
  EXPECT_EQ(h->groups(0).where(), "train.py:57 in load_shard");
  EXPECT_EQ(h->groups(0).frames_size(), 3);
  EXPECT_EQ(h->groups(0).frames(2).function(), "load_shard");
  EXPECT_EQ(Ranks(h->groups(1).ranks()), (std::vector<uint32_t>{0, 1, 2}));
  EXPECT_EQ(h->groups(1).where(),
            "train.py:40 in train_step \u2192 \u2026 \u2192 __init__.py:197 in backward");
  EXPECT_EQ(Ranks(h->culprit_ranks()), std::vector<uint32_t>{3});
  ASSERT_EQ(h->collectives_size(), 1);
  EXPECT_EQ(h->collectives(0).entered(), 58u);
  EXPECT_EQ(Ranks(h->collectives(0).behind_ranks()), std::vector<uint32_t>{3});
  EXPECT_EQ(Ranks(h->collectives(0).waiting_ranks()), (std::vector<uint32_t>{0, 1, 2}));
  EXPECT_FALSE(h->same_place());
  EXPECT_EQ(h->gone_ranks_size(), 0);
  EXPECT_EQ(h->summary(),
            "rank 3 never entered the collective the others wait in (ranks 0\u20132 waiting); "
            "rank 3: train.py:57 in load_shard; ranks 0\u20132: train.py:40 in train_step \u2192 "
            "\u2026 \u2192 __init__.py:197 in backward");

  // Partial steps timing out (ranks missing) are not progress: the inquiry stays, not asked again.
  auto partial = std::make_shared<JobSnapshot>(*Snapshot("job", 4, 128, false));
  partial->timed_out_steps = 8;
  inspector.OnSnapshots({partial}, kNow + 12 * kSecond);
  auto hung_again = std::make_shared<JobSnapshot>(*Snapshot("job", 4, 128, true));
  hung_again->timed_out_steps = 8;
  inspector.OnSnapshots({hung_again}, kNow + 18 * kSecond);
  EXPECT_EQ(sent.requests.size(), 1u);
  ASSERT_TRUE(inspector.Get("job").has_value());
  EXPECT_EQ(inspector.Get("job")->request_id(), q.id());

  // Progress: forgotten. A later hang is asked again.
  inspector.OnSnapshots({Snapshot("job", 4, 121, false)}, kNow + 20 * kSecond);
  EXPECT_FALSE(inspector.Get("job").has_value());
  inspector.OnSnapshots({Snapshot("job", 4, 300, true)}, kNow + 60 * kSecond);
  ASSERT_EQ(sent.requests.size(), 2u);
  EXPECT_NE(sent.requests[1].second.id(), q.id());
  const HangInspectorCounters c = inspector.counters();
  EXPECT_EQ(c.requests, 2u);
  EXPECT_EQ(c.settled_all, 1u);
}

TEST(HangInspectorTest, RanksInTheSamePlaceNameNoCulprit) {
  std::map<uint32_t, HangInspector::RankAnswer> answers;
  for (uint32_t r = 0; r < 4; ++r) answers[r] = {0, {Counter(10, 10)}};
  const std::vector<v1::ThreadStack> stacks = {Training("wait_for_barrier_file", 33)};
  const std::vector<HangInspector::Heard> heard(4, HangInspector::Heard::kFinal);
  const v1::HangStacks h = HangInspector::Summarize(answers, stacks, heard);
  EXPECT_TRUE(h.same_place());
  EXPECT_EQ(h.culprit_ranks_size(), 0);
  ASSERT_EQ(h.groups_size(), 1);
  EXPECT_EQ(Ranks(h.groups(0).ranks()), (std::vector<uint32_t>{0, 1, 2, 3}));
  ASSERT_EQ(h.collectives_size(), 1);
  EXPECT_EQ(h.collectives(0).behind_ranks_size(), 0);
  EXPECT_EQ(h.collectives(0).waiting_ranks_size(), 0);
  EXPECT_EQ(h.summary(),
            "every rank that answered is in the same place: train.py:33 in "
            "wait_for_barrier_file; no rank is behind on collectives");
}

TEST(HangInspectorTest, ARankThatNeverAnsweredIsGoneAndOneThatOnlySaidItIsAliveIsSilent) {
  Sent sent;
  HangInspector inspector({}, sent.Sender());
  inspector.OnSnapshots({Snapshot("job", 4, 50, true)}, kNow);
  ASSERT_EQ(sent.requests.size(), 1u);
  const std::string id = sent.requests[0].second.id();
  const v1::ThreadStack waiting = Training("train_step", 40, true);
  inspector.OnBatch(Answer("job", 0, id, v1::CONTROL_DONE, &waiting, Counter(9, 8)));
  inspector.OnBatch(Answer("job", 1, id, v1::CONTROL_DONE, &waiting, Counter(9, 8)));
  inspector.OnBatch(Answer("job", 2, id, v1::CONTROL_ACCEPTED));  // alive, no stacks
  // Replies to other requests, of other jobs, or from ranks out of range change nothing.
  inspector.OnBatch(Answer("job", 3, "stk-other", v1::CONTROL_DONE, &waiting));
  inspector.OnBatch(Answer("other", 3, id, v1::CONTROL_DONE, &waiting));
  inspector.OnBatch(Answer("job", 9, id, v1::CONTROL_DONE, &waiting));
  inspector.OnSnapshots({}, kNow + 9 * kSecond);
  EXPECT_TRUE(inspector.TakeSettled().empty());
  inspector.OnSnapshots({}, kNow + 10 * kSecond);  // the deadline
  EXPECT_EQ(inspector.TakeSettled(), std::vector<std::string>{"job"});
  auto h = inspector.Get("job");
  ASSERT_TRUE(h.has_value());
  EXPECT_EQ(h->ranks_answered(), 2u);
  EXPECT_EQ(Ranks(h->gone_ranks()), std::vector<uint32_t>{3});
  EXPECT_EQ(Ranks(h->silent_ranks()), std::vector<uint32_t>{2});
  EXPECT_EQ(h->culprit_ranks_size(), 0);  // rank 3 is gone, not stuck
  EXPECT_FALSE(h->same_place() && h->gone_ranks_size() == 0);
  EXPECT_NE(h->summary().find("rank 3: gone"), std::string::npos) << h->summary();
  EXPECT_NE(h->summary().find("rank 2: alive, no stacks"), std::string::npos) << h->summary();
  EXPECT_EQ(inspector.counters().settled_partial, 1u);

  // The job goes away: so does its inquiry.
  inspector.Forget("job");
  EXPECT_FALSE(inspector.Get("job").has_value());
}

TEST(HangInspectorTest, ARequestThatCannotBeSentSettlesSayingSo) {
  Sent sent;
  sent.status = absl::UnavailableError("local queue full");
  HangInspector inspector({}, sent.Sender());
  inspector.OnSnapshots({Snapshot("job", 2, 50, true)}, kNow);
  auto h = inspector.Get("job");
  ASSERT_TRUE(h.has_value());
  EXPECT_GT(h->settled_unix_ns(), 0);
  EXPECT_NE(h->summary().find("could not be sent: local queue full"), std::string::npos);
  EXPECT_EQ(inspector.counters().send_failures, 1u);
  // Not retried for the same hang.
  sent.status = absl::OkStatus();
  inspector.OnSnapshots({Snapshot("job", 2, 50, true)}, kNow + kSecond);
  EXPECT_TRUE(sent.requests.empty());
}

TEST(HangInspectorTest, DistinctStacksBeyondTheLimitAreGroupedAsOther) {
  Sent sent;
  HangInspectorOptions options;
  options.max_groups = 2;
  HangInspector inspector(options, sent.Sender());
  inspector.OnSnapshots({Snapshot("job", 4, 50, true)}, kNow);
  const std::string id = sent.requests.at(0).second.id();
  for (uint32_t r = 0; r < 4; ++r) {
    const v1::ThreadStack t = Training("f" + std::to_string(r), 10 + r);
    inspector.OnBatch(Answer("job", r, id, v1::CONTROL_DONE, &t));
  }
  inspector.OnSnapshots({}, kNow + kSecond);
  auto h = inspector.Get("job");
  ASSERT_TRUE(h.has_value());
  ASSERT_EQ(h->groups_size(), 3);
  EXPECT_EQ(Ranks(h->groups(2).ranks()), (std::vector<uint32_t>{2, 3}));
  EXPECT_EQ(h->groups(2).where(), "(one of more stacks than are kept)");
}

}  // namespace
}  // namespace rankwatch
