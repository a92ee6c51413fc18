#include "alerting/alert_actions.h"

#include <gtest/gtest.h>

#include <fstream>

#include "alerting/outbound_test_support.h"

namespace rankwatch {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using SteadyTime = std::chrono::steady_clock::time_point;
using Record = state::v1::ActionRecord;

constexpr int64_t kSecond = 1'000'000'000;

v1::Alert MakeAlert(const std::string& job, v1::AlertKind kind, v1::Severity severity,
                    v1::AlertState state) {
  v1::Alert a;
  a.set_id(job + "|" + std::string(AlertKindLabel(kind)) + "|job");
  a.set_training_job(job);
  a.set_kind(kind);
  a.set_subject("job");
  a.set_state(state);
  a.set_severity(severity);
  a.set_at_unix_ns(100 * kSecond);
  a.mutable_evidence()->mutable_step()->set_note(job + " is in trouble");
  return a;
}

v1::Alert WithStacks(v1::Alert a) {
  v1::HangStacks* s = a.mutable_evidence()->mutable_hang_stacks();
  s->set_request_id("r-1");
  s->set_settled_unix_ns(105 * kSecond);
  s->set_summary("rank 3 is in load_shard (train.py:57); ranks 0-2 wait in allreduce");
  v1::StackGroup* g = s->add_groups();
  g->add_ranks(3);
  g->set_where("train.py:57 in load_shard");
  return a;
}

TEST(ActionRuleTest, ParsesAndMatches) {
  auto r = ParseActionRule("hang:critical=webhook");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->kind, v1::ALERT_HANG);
  EXPECT_EQ(r->min_severity, v1::SEVERITY_CRIT);
  EXPECT_EQ(r->action, ActionRule::Action::kWebhook);
  EXPECT_TRUE(r->Matches(MakeAlert("j", v1::ALERT_HANG, v1::SEVERITY_CRIT, v1::ALERT_FIRING)));
  EXPECT_FALSE(r->Matches(MakeAlert("j", v1::ALERT_HANG, v1::SEVERITY_WARN, v1::ALERT_FIRING)));
  EXPECT_FALSE(
      r->Matches(MakeAlert("j", v1::ALERT_STRAGGLER, v1::SEVERITY_CRIT, v1::ALERT_FIRING)));
  r = ParseActionRule("*:warning=webhook");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(
      r->Matches(MakeAlert("j", v1::ALERT_NODE_CULPRIT, v1::SEVERITY_CRIT, v1::ALERT_FIRING)));
  EXPECT_FALSE(r->Matches(MakeAlert("j", v1::ALERT_HANG, v1::SEVERITY_INFO, v1::ALERT_FIRING)));
  r = ParseActionRule("memory_creep=observe");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->action, ActionRule::Action::kObserve);
  EXPECT_EQ(r->min_severity, v1::SEVERITY_UNSPECIFIED);
  for (const auto& [text, why] : std::vector<std::pair<std::string, std::string>>{
           {"hang", "no '='"},
           {"hang=restart", "unknown action 'restart'"},
           {"oom=webhook", "unknown alert kind 'oom'"},
           {"hang:urgent=webhook", "unknown severity 'urgent'"}}) {
    auto bad = ParseActionRule(text);
    ASSERT_FALSE(bad.ok()) << text;
    EXPECT_NE(bad.status().message().find(why), std::string::npos) << bad.status();
  }
}

class AlertActionsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    secret_path_ = std::filesystem::temp_directory_path() /
                   ("alert-actions-secret-" + std::to_string(::getpid()));
    std::ofstream(secret_path_) << "s3cret\n";
  }
  void TearDown() override { std::filesystem::remove(secret_path_); }

  AlertActionsOptions Options(std::vector<std::string> rules) {
    AlertActionsOptions o;
    for (const std::string& text : rules) o.rules.push_back(*ParseActionRule(text));
    o.webhooks = {"http://hooks:8080/rankwatch"};
    o.secret_file = secret_path_.string();
    o.evidence_wait = seconds(30);
    o.max_attempts = 3;
    return o;
  }
  std::unique_ptr<AlertActions> Make(AlertActionsOptions o, AlertHub* hub,
                                     const StateStore* store = nullptr,
                                     AlertActions::Persist persist = nullptr) {
    registries_.push_back(std::make_unique<PrometheusRegistry>());
    auto a =
        AlertActions::Create(std::move(o), hub, store, std::move(persist), registries_.back().get(),
                             std::make_unique<FakeHttpTransport>(calls_));
    EXPECT_TRUE(a.ok()) << a.status();
    return a.ok() ? std::move(*a) : nullptr;
  }
  std::string Render() const { return registries_.back()->Render(); }

  std::filesystem::path secret_path_;
  std::vector<std::unique_ptr<PrometheusRegistry>> registries_;
  std::shared_ptr<FakeHttpCalls> calls_ = std::make_shared<FakeHttpCalls>();
  const SteadyTime t0_ = SteadyTime() + std::chrono::hours(1);
  const int64_t unix0_ = 1000 * kSecond;
};

TEST_F(AlertActionsTest, OneSignedCallPerFiringNotPerPublication) {
  AlertHub hub(nullptr, nullptr, {}, {});
  auto actions = Make(Options({"input_bound=observe", "*:warning=webhook"}), &hub);
  const v1::Alert s = MakeAlert("j", v1::ALERT_STRAGGLER, v1::SEVERITY_WARN, v1::ALERT_FIRING);
  hub.Append({s, MakeAlert("j", v1::ALERT_INPUT_BOUND, v1::SEVERITY_CRIT, v1::ALERT_FIRING),
              MakeAlert("j", v1::ALERT_WAIT_HEAVY, v1::SEVERITY_INFO, v1::ALERT_FIRING)},
             {});
  actions->RunOnce(t0_, unix0_);
  auto calls = calls_->Take();
  ASSERT_EQ(calls.size(), 1u);  // input_bound observed, wait_heavy below warning
  const auto& call = calls[0];
  EXPECT_EQ(call.url, "http://hooks:8080/rankwatch");
  EXPECT_EQ(call.Header("X-Rankwatch-Signature"), "sha256=" + HmacSha256Hex("s3cret", call.body));
  EXPECT_NE(call.Header("X-Rankwatch-Signature"), "sha256=" + HmacSha256Hex("other", call.body));
  EXPECT_EQ(call.Header("X-Rankwatch-Delivery"), "j|straggler|job@1");
  EXPECT_NE(call.body.find("\"rule\":\"*:warning=webhook\""), std::string::npos) << call.body;
  EXPECT_NE(call.body.find("\"summary\":\"j is in trouble\""), std::string::npos);
  EXPECT_NE(call.body.find("\"alert\":{\"id\":\"j|straggler|job\""), std::string::npos);

  hub.Append({s}, {});  // the same firing published again (with a capture, say)
  actions->RunOnce(t0_ + seconds(1), unix0_ + kSecond);
  EXPECT_TRUE(calls_->Take().empty());
  hub.Append({MakeAlert("j", v1::ALERT_STRAGGLER, v1::SEVERITY_WARN, v1::ALERT_RESOLVED), s}, {});
  actions->RunOnce(t0_ + seconds(2), unix0_ + 2 * kSecond);
  calls = calls_->Take();
  ASSERT_EQ(calls.size(), 1u);  // a new firing
  EXPECT_EQ(calls[0].Header("X-Rankwatch-Delivery"), "j|straggler|job@6");
  const auto records = actions->records();
  ASSERT_EQ(records.size(), 1u);  // the first one resolved
  EXPECT_EQ(records[0].outcome(), Record::DELIVERED);
  EXPECT_EQ(records[0].firing_sequence(), 6u);
  EXPECT_NE(
      Render().find("rankwatch_alert_actions_total{kind=\"straggler\",outcome=\"delivered\"} 2"),
      std::string::npos)
      << Render();
}

TEST_F(AlertActionsTest, AHangWaitsForItsStacks) {
  AlertHub hub(nullptr, nullptr, {}, {});
  auto actions = Make(Options({"hang:critical=webhook"}), &hub);
  const v1::Alert hang = MakeAlert("h", v1::ALERT_HANG, v1::SEVERITY_CRIT, v1::ALERT_FIRING);
  hub.Append({hang}, {});
  actions->RunOnce(t0_, unix0_);
  EXPECT_TRUE(calls_->Take().empty());
  hub.Append({WithStacks(hang)}, {});  // its stacks came: published again with them
  actions->RunOnce(t0_ + seconds(5), unix0_ + 5 * kSecond);
  auto calls = calls_->Take();
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_NE(calls[0].body.find("\"hang_stacks\":true"), std::string::npos) << calls[0].body;
  EXPECT_NE(calls[0].body.find("train.py:57 in load_shard"), std::string::npos);
  EXPECT_EQ(calls[0].Header("X-Rankwatch-Delivery"), "h|hang|job@1");
  EXPECT_TRUE(actions->records()[0].with_stacks());
  EXPECT_EQ(actions->records()[0].sent_sequence(), 2u);
}

TEST_F(AlertActionsTest, AHangWithoutStacksGoesAfterTheWait) {
  AlertHub hub(nullptr, nullptr, {}, {});
  auto actions = Make(Options({"hang=webhook"}), &hub);
  hub.Append({MakeAlert("h", v1::ALERT_HANG, v1::SEVERITY_CRIT, v1::ALERT_FIRING)}, {});
  actions->RunOnce(t0_, unix0_);
  actions->RunOnce(t0_ + seconds(29), unix0_ + 29 * kSecond);
  EXPECT_TRUE(calls_->Take().empty());
  actions->RunOnce(t0_ + seconds(30), unix0_ + 30 * kSecond);
  auto calls = calls_->Take();
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_NE(calls[0].body.find("\"hang_stacks\":false"), std::string::npos);
}

TEST_F(AlertActionsTest, FailedCallsAreRetriedWithBackoffWithTheSameBodyThenFail) {
  AlertHub hub(nullptr, nullptr, {}, {});
  auto actions = Make(Options({"straggler=webhook"}), &hub);
  calls_->Answer(503);
  hub.Append({MakeAlert("j", v1::ALERT_STRAGGLER, v1::SEVERITY_WARN, v1::ALERT_FIRING)}, {});
  actions->RunOnce(t0_, unix0_);
  actions->RunOnce(t0_ + milliseconds(900), unix0_);
  actions->RunOnce(t0_ + seconds(1), unix0_);  // 1 s after the first
  actions->RunOnce(t0_ + seconds(2), unix0_);  // within 2 s of the second
  actions->RunOnce(t0_ + seconds(3), unix0_);
  auto calls = calls_->Take();
  ASSERT_EQ(calls.size(), 3u);
  EXPECT_EQ(calls[0].body, calls[2].body);
  EXPECT_EQ(calls[0].Header("X-Rankwatch-Signature"), calls[2].Header("X-Rankwatch-Signature"));
  const Record r = actions->records()[0];
  EXPECT_EQ(r.outcome(), Record::FAILED);
  EXPECT_EQ(r.attempts(), 3u);
  EXPECT_NE(r.detail().find("HTTP 503"), std::string::npos) << r.detail();
  actions->RunOnce(t0_ + seconds(100), unix0_);
  EXPECT_TRUE(calls_->Take().empty());
}

TEST_F(AlertActionsTest, DryRunCallsNothingAndAResolvedAlertCancelsItsAction) {
  AlertHub hub(nullptr, nullptr, {}, {});
  AlertActionsOptions o = Options({"*=webhook"});
  o.dry_run = true;
  auto actions = Make(o, &hub);
  hub.Append({MakeAlert("j", v1::ALERT_STRAGGLER, v1::SEVERITY_WARN, v1::ALERT_FIRING),
              MakeAlert("h", v1::ALERT_HANG, v1::SEVERITY_CRIT, v1::ALERT_FIRING)},
             {});
  actions->RunOnce(t0_, unix0_);
  hub.Append({MakeAlert("h", v1::ALERT_HANG, v1::SEVERITY_CRIT, v1::ALERT_RESOLVED)}, {});
  actions->RunOnce(t0_ + seconds(60), unix0_);
  EXPECT_TRUE(calls_->Take().empty());
  const auto records = actions->records();
  ASSERT_EQ(records.size(), 1u);  // the hang's resolved: gone from the open ones
  EXPECT_EQ(records[0].outcome(), Record::DRY_RUN);
  const std::string metrics = Render();
  EXPECT_NE(metrics.find("rankwatch_alert_actions_total{kind=\"hang\",outcome=\"cancelled\"} 1"),
            std::string::npos)
      << metrics;
}

TEST_F(AlertActionsTest, AFiringThatEndsWithoutAResolveHereIsReleased) {
  AlertHub hub(nullptr, nullptr, {}, {});
  auto actions = Make(Options({"straggler=webhook"}), &hub);
  const v1::Alert s = MakeAlert("j", v1::ALERT_STRAGGLER, v1::SEVERITY_WARN, v1::ALERT_FIRING);
  const v1::Alert other = MakeAlert("k", v1::ALERT_STRAGGLER, v1::SEVERITY_WARN, v1::ALERT_FIRING);
  hub.Append({s, other}, {});
  actions->RunOnce(t0_, unix0_);
  ASSERT_EQ(calls_->Take().size(), 2u);
  ASSERT_EQ(actions->records().size(), 2u);
  // Job j moves to another instance (which resolves its alert in its own log): the hub stops
  // tracking it. Its firing is released at the next check; k's, still tracked, stays.
  hub.SetFiring("j", {});
  actions->RunOnce(t0_ + seconds(1), unix0_ + kSecond);
  const auto records = actions->records();
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(records[0].alert_id(), "k|straggler|job");
  // The job comes back and its alert fires again here: a new firing, acted on.
  hub.Append({s}, {});
  actions->RunOnce(t0_ + seconds(2), unix0_ + 2 * kSecond);
  auto calls = calls_->Take();
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].Header("X-Rankwatch-Delivery"), "j|straggler|job@3");
}

TEST_F(AlertActionsTest, APendingActionOfAFiringThatEndedElsewhereIsDeliveredThenReleased) {
  AlertHub hub(nullptr, nullptr, {}, {});
  auto actions = Make(Options({"hang=webhook"}), &hub);
  hub.Append({MakeAlert("h", v1::ALERT_HANG, v1::SEVERITY_CRIT, v1::ALERT_FIRING)}, {});
  actions->RunOnce(t0_, unix0_);  // waits for its stacks
  hub.SetFiring("h", {});
  actions->RunOnce(t0_ + seconds(1), unix0_ + kSecond);
  ASSERT_EQ(actions->records().size(), 1u) << "the firing happened: its action is still owed";
  actions->RunOnce(t0_ + seconds(30), unix0_ + 30 * kSecond);
  EXPECT_EQ(calls_->Take().size(), 1u);
  EXPECT_TRUE(actions->records().empty());
}

class AlertActionsStoreTest : public AlertActionsTest {
 protected:
  std::unique_ptr<AlertActions> MakeStored() {
    return Make(Options({"*=webhook"}), stored_.hub(), stored_.store(), stored_.Persist());
  }
  void Append(std::vector<v1::Alert> alerts) { stored_.Append(std::move(alerts)); }

  StoredAlertHub stored_{"alert-actions-test"};
};

TEST_F(AlertActionsStoreTest, ARestartActsOnceAndFinishesWhatWasPending) {
  Append({MakeAlert("old", v1::ALERT_STRAGGLER, v1::SEVERITY_WARN, v1::ALERT_FIRING)});
  auto actions = MakeStored();  // configured now: "old" fired before
  const v1::Alert s = MakeAlert("j", v1::ALERT_STRAGGLER, v1::SEVERITY_WARN, v1::ALERT_FIRING);
  const v1::Alert hang = MakeAlert("h", v1::ALERT_HANG, v1::SEVERITY_CRIT, v1::ALERT_FIRING);
  Append({s, hang});
  actions->RunOnce(t0_, unix0_);
  ASSERT_EQ(calls_->Take().size(), 1u);  // the straggler; the hang waits for its stacks
  actions.reset();
  stored_.Drain();
  stored_.Reopen();  // the daemon restarts
  actions = MakeStored();
  ASSERT_EQ(actions->records().size(), 2u);
  Append({s, WithStacks(hang)});  // both published again
  actions->RunOnce(t0_, unix0_);
  auto calls = calls_->Take();
  ASSERT_EQ(calls.size(), 1u);  // the hang, with its stacks; the straggler not again
  EXPECT_EQ(calls[0].Header("X-Rankwatch-Delivery"), "h|hang|job@3");
  EXPECT_NE(calls[0].body.find("\"hang_stacks\":true"), std::string::npos);
  for (const Record& r : actions->records()) EXPECT_EQ(r.outcome(), Record::DELIVERED);
  // As ListActions answers: by job, from the store.
  actions->Stop();
  stored_.Drain();
  auto stored = StoredActions(*stored_.store(), "h", 10);
  ASSERT_TRUE(stored.ok()) << stored.status();
  ASSERT_EQ(stored->size(), 1u);
  EXPECT_EQ((*stored)[0].alert_id(), "h|hang|job");
  EXPECT_EQ((*stored)[0].outcome(), "delivered");
  EXPECT_EQ((*stored)[0].sent_sequence(), 5u);
  EXPECT_TRUE((*stored)[0].with_stacks());
  EXPECT_EQ(StoredActions(*stored_.store(), "", 1)->size(), 1u);  // the newest only
  EXPECT_EQ(StoredActions(*stored_.store(), "", 10)->size(), 2u);
}

TEST_F(AlertActionsStoreTest, AFiringNoLongerTrackedAfterARestartIsReleasedAndStoredSo) {
  Append({MakeAlert("old", v1::ALERT_STRAGGLER, v1::SEVERITY_WARN, v1::ALERT_FIRING)});
  auto actions = MakeStored();
  Append({MakeAlert("j", v1::ALERT_STRAGGLER, v1::SEVERITY_WARN, v1::ALERT_FIRING)});
  actions->RunOnce(t0_, unix0_);
  ASSERT_EQ(calls_->Take().size(), 1u);
  actions.reset();
  stored_.Drain();
  stored_.Reopen();  // restarted; job j went to another instance meanwhile: nobody tracks it
  actions = MakeStored();
  ASSERT_EQ(actions->records().size(), 1u);
  actions->RunOnce(t0_, unix0_);
  EXPECT_TRUE(actions->records().empty());
  EXPECT_TRUE(calls_->Take().empty());
  actions->Stop();
  stored_.Drain();
  auto stored = StoredActions(*stored_.store(), "j", 10);
  ASSERT_TRUE(stored.ok()) << stored.status();
  ASSERT_EQ(stored->size(), 1u);
  EXPECT_TRUE((*stored)[0].resolved());
  EXPECT_EQ((*stored)[0].outcome(), "delivered");
  // Restarted again: nothing left open.
  actions.reset();
  stored_.Reopen();
  actions = MakeStored();
  EXPECT_TRUE(actions->records().empty());
}

}  // namespace
}  // namespace rankwatch
