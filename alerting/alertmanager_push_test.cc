#include "alerting/alertmanager_push.h"

#include <gtest/gtest.h>

#include "alerting/outbound_test_support.h"

namespace rankwatch {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using SteadyTime = std::chrono::steady_clock::time_point;

constexpr int64_t kSecond = 1'000'000'000;

v1::Alert Straggler(const std::string& job, int rank, v1::AlertState state, int64_t at_s) {
  v1::Alert a;
  a.set_id(job + "|straggler|rank:" + std::to_string(rank));
  a.set_training_job(job);
  a.set_kind(v1::ALERT_STRAGGLER);
  a.set_subject("rank:" + std::to_string(rank));
  a.set_state(state);
  a.set_severity(v1::SEVERITY_WARN);
  a.set_scope(v1::SCOPE_RANK);
  a.set_at_unix_ns(at_s * kSecond);
  v1::StepDiagnosis* step = a.mutable_evidence()->mutable_step();
  step->set_note("rank " + std::to_string(rank) + " is 40% slower in compute");
  step->set_next_step("rankwatch capture --job " + job);
  step->add_culprit_ranks(rank);
  step->add_culprit_pods("trainer-" + std::to_string(rank));
  a.mutable_evidence()->mutable_scheduler()->set_namespace_("ml");
  return a;
}

v1::Alert NodeCulprit(const std::string& node, v1::AlertState state, int64_t at_s) {
  v1::Alert a;
  a.set_id("|node_culprit|node:" + node);
  a.set_kind(v1::ALERT_NODE_CULPRIT);
  a.set_subject("node:" + node);
  a.set_state(state);
  a.set_severity(v1::SEVERITY_CRIT);
  a.set_scope(v1::SCOPE_NODE);
  a.set_at_unix_ns(at_s * kSecond);
  return a;
}

TEST(AlertPresentationTest, LabelsAndAnnotationsOfARankStraggler) {
  const v1::Alert a = Straggler("llm", 17, v1::ALERT_FIRING, 100);
  AlertPresentationOptions o;
  o.ui_url = "https://rw.example.com/";
  o.runbook_url = "https://runbooks.example.com/{alertname}?job={training_job}&kind={kind}";
  const PresentedAlert p = Present(a, o);
  EXPECT_EQ(p.labels, (LabelList{{"alertname", "RankwatchStraggler"},
                                 {"category", "step"},
                                 {"namespace", "ml"},
                                 {"pod", "trainer-17"},
                                 {"rank", "17"},
                                 {"scope", "rank"},
                                 {"severity", "warning"},
                                 {"training_job", "llm"}}));
  EXPECT_EQ(p.annotations,
            (LabelList{{"alert_id", "llm|straggler|rank:17"},
                       {"next_step", "rankwatch capture --job llm"},
                       {"runbook_url",
                        "https://runbooks.example.com/RankwatchStraggler?job=llm&kind=straggler"},
                       {"summary", "rank 17 is 40% slower in compute"}}));
  EXPECT_EQ(p.generator_url, "https://rw.example.com/ui/jobs/llm");
}

TEST(AlertPresentationTest, AFleetAlertHasANodeAndNoJob) {
  const v1::Alert a = NodeCulprit("gpu-3", v1::ALERT_FIRING, 100);
  const PresentedAlert p = Present(a, {.ui_url = "http://rw:8466", .runbook_url = ""});
  EXPECT_EQ(p.labels, (LabelList{{"alertname", "RankwatchNodeCulprit"},
                                 {"category", "fleet"},
                                 {"node", "gpu-3"},
                                 {"scope", "node"},
                                 {"severity", "critical"}}));
  EXPECT_EQ(p.generator_url, "http://rw:8466/ui/nodes/gpu-3");
  // No note: a summary all the same.
  EXPECT_EQ(p.annotations[1],
            (std::pair<std::string, std::string>{"summary", "node_culprit on node:gpu-3"}));
  // A straggler of node scope is the rules' RankwatchNodeStraggler; a job's name is escaped.
  v1::Alert n = Straggler("a b/c", 1, v1::ALERT_FIRING, 1);
  n.set_subject("node:node-1");
  n.set_scope(v1::SCOPE_NODE);
  EXPECT_EQ(AlertName(n), "RankwatchNodeStraggler");
  EXPECT_EQ(Present(n, {.ui_url = "http://rw", .runbook_url = ""}).generator_url,
            "http://rw/ui/jobs/a%20b%2Fc");
}

TEST(AlertmanagerBodyTest, IsAlertmanagersJson) {
  auto a = std::make_shared<v1::Alert>(Straggler("llm", 2, v1::ALERT_FIRING, 100));
  const std::string body = AlertmanagerBody({{a, 100 * kSecond, 340 * kSecond}},
                                            {.ui_url = "http://rw", .runbook_url = ""});
  EXPECT_EQ(body.front(), '[');
  EXPECT_NE(body.find("\"labels\":{\"alertname\":\"RankwatchStraggler\","), std::string::npos)
      << body;
  EXPECT_NE(body.find("\"startsAt\":\"1970-01-01T00:01:40.000Z\""), std::string::npos) << body;
  EXPECT_NE(body.find("\"endsAt\":\"1970-01-01T00:05:40.000Z\""), std::string::npos) << body;
  EXPECT_NE(body.find("\"generatorURL\":\"http://rw/ui/jobs/llm\""), std::string::npos) << body;
  EXPECT_NE(body.find("\"summary\":\"rank 2 is 40% slower in compute\""), std::string::npos);
}

// A push over a hub without a store (alerts published at once) and a fake transport.
class AlertmanagerPushTest : public ::testing::Test {
 protected:
  std::unique_ptr<AlertmanagerPush> Make(AlertHub* hub, const StateStore* store = nullptr,
                                         AlertmanagerPush::Persist persist = nullptr) {
    AlertmanagerPushOptions o;
    o.urls = {"http://am:9093"};
    o.resend_interval = seconds(60);
    registries_.push_back(std::make_unique<PrometheusRegistry>());  // one per daemon start
    auto push = AlertmanagerPush::Create(
        o, hub, store, std::move(persist), registries_.back().get(),
        [calls = calls_] { return std::make_unique<FakeHttpTransport>(calls); });
    EXPECT_TRUE(push.ok()) << push.status();
    return push.ok() ? std::move(*push) : nullptr;
  }
  std::string Render() const { return registries_.back()->Render(); }

  std::vector<std::unique_ptr<PrometheusRegistry>> registries_;
  std::shared_ptr<FakeHttpCalls> calls_ = std::make_shared<FakeHttpCalls>();
  const SteadyTime t0_ = SteadyTime() + std::chrono::hours(1);
  const int64_t unix0_ = 1000 * kSecond;
};

TEST_F(AlertmanagerPushTest, FiringIsResentWhileItFiresAndResolvedEndsIt) {
  AlertHub hub(nullptr, nullptr, {}, {});
  auto push = Make(&hub);
  hub.Append({Straggler("llm", 3, v1::ALERT_FIRING, 990)}, {});
  push->RunOnce(t0_, unix0_);
  auto calls = calls_->Take();
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].url, "http://am:9093/api/v2/alerts");
  EXPECT_NE(calls[0].body.find("\"startsAt\":\"" + Rfc3339(990 * kSecond)), std::string::npos);
  // endsAt: 4 resend intervals ahead.
  EXPECT_NE(calls[0].body.find("\"endsAt\":\"" + Rfc3339(unix0_ + 240 * kSecond)),
            std::string::npos)
      << calls[0].body;
  EXPECT_EQ(push->status()[0].cursor, 1u);
  EXPECT_EQ(push->status()[0].firing, 1u);

  push->RunOnce(t0_ + seconds(30), unix0_ + 30 * kSecond);
  EXPECT_TRUE(calls_->Take().empty());
  push->RunOnce(t0_ + seconds(61), unix0_ + 61 * kSecond);  // the resend
  calls = calls_->Take();
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_NE(calls[0].body.find("\"startsAt\":\"" + Rfc3339(990 * kSecond)), std::string::npos);
  EXPECT_NE(calls[0].body.find("\"endsAt\":\"" + Rfc3339(unix0_ + 301 * kSecond)),
            std::string::npos);

  hub.Append({Straggler("llm", 3, v1::ALERT_RESOLVED, 1070)}, {});
  push->RunOnce(t0_ + seconds(70), unix0_ + 70 * kSecond);
  calls = calls_->Take();
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_NE(calls[0].body.find("\"startsAt\":\"" + Rfc3339(990 * kSecond)), std::string::npos);
  EXPECT_NE(calls[0].body.find("\"endsAt\":\"" + Rfc3339(1070 * kSecond)), std::string::npos);
  EXPECT_EQ(push->status()[0].firing, 0u);
  push->RunOnce(t0_ + seconds(200), unix0_ + 200 * kSecond);
  EXPECT_TRUE(calls_->Take().empty());  // nothing fires: nothing to resend
  EXPECT_NE(Render().find("rankwatch_alertmanager_alerts_sent_total{target=\"http://am:9093\"} 3"),
            std::string::npos)
      << Render();
}

TEST_F(AlertmanagerPushTest, AnOutageLosesNothing) {
  AlertHub hub(nullptr, nullptr, {}, {});
  auto push = Make(&hub);
  hub.Append({Straggler("a", 1, v1::ALERT_FIRING, 990)}, {});
  push->RunOnce(t0_, unix0_);
  ASSERT_EQ(calls_->Take().size(), 1u);
  calls_->Answer(0);  // Alertmanager goes away
  hub.Append({Straggler("b", 2, v1::ALERT_FIRING, 1001)}, {});
  push->RunOnce(t0_ + seconds(1), unix0_ + kSecond);
  EXPECT_EQ(calls_->Take().size(), 1u);
  EXPECT_TRUE(push->status()[0].failing);
  EXPECT_EQ(push->status()[0].cursor, 1u);
  // While it is away: a resolves, and b publishes again; retries back off.
  hub.Append({Straggler("a", 1, v1::ALERT_RESOLVED, 1002)}, {});
  hub.Append({Straggler("b", 2, v1::ALERT_FIRING, 1003)}, {});
  push->RunOnce(t0_ + milliseconds(1500), unix0_ + kSecond * 3 / 2);
  EXPECT_TRUE(calls_->Take().empty());  // within the first backoff (1 s)
  push->RunOnce(t0_ + seconds(2), unix0_ + 2 * kSecond);
  EXPECT_EQ(calls_->Take().size(), 1u);  // failed again: next in 2 s
  push->RunOnce(t0_ + seconds(3), unix0_ + 3 * kSecond);
  EXPECT_TRUE(calls_->Take().empty());
  calls_->Answer(200);  // back
  push->RunOnce(t0_ + seconds(4), unix0_ + 4 * kSecond);
  auto calls = calls_->Take();
  ASSERT_EQ(calls.size(), 2u);
  // The log since the cursor, the newest state of each alert: a resolved (at its resolve time),
  // b firing (since its first firing).
  const std::string& log = calls[0].body;
  EXPECT_NE(log.find("\"training_job\":\"a\"}"), std::string::npos) << log;
  EXPECT_NE(log.find("\"startsAt\":\"" + Rfc3339(990 * kSecond) + "\",\"endsAt\":\"" +
                     Rfc3339(1002 * kSecond)),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("\"startsAt\":\"" + Rfc3339(1001 * kSecond)), std::string::npos) << log;
  EXPECT_EQ(log.find(Rfc3339(1003 * kSecond)), std::string::npos) << log;
  // Then every firing alert again at once (a restarted Alertmanager forgot them): b only.
  const std::string& resend = calls[1].body;
  EXPECT_NE(resend.find("\"training_job\":\"b\""), std::string::npos);
  EXPECT_EQ(resend.find("\"training_job\":\"a\""), std::string::npos);
  EXPECT_FALSE(push->status()[0].failing);
  EXPECT_EQ(push->status()[0].cursor, 4u);
  EXPECT_NE(Render().find("rankwatch_alertmanager_posts_failed_total{target=\"http://am:9093\"} 2"),
            std::string::npos)
      << Render();
}

TEST_F(AlertmanagerPushTest, AlertsTheDaemonNoLongerTracksAreEndedAndFleetAlertsKept) {
  AlertHub hub(nullptr, nullptr, {}, {});
  auto push = Make(&hub);
  hub.Append(
      {Straggler("gone", 1, v1::ALERT_FIRING, 990), NodeCulprit("gpu-3", v1::ALERT_FIRING, 995)},
      {});
  push->RunOnce(t0_, unix0_);
  ASSERT_EQ(calls_->Take().size(), 1u);
  hub.SetFiring("gone", {});  // the job was removed without resolving
  push->RunOnce(t0_ + seconds(61), unix0_ + 61 * kSecond);
  auto calls = calls_->Take();
  ASSERT_EQ(calls.size(), 1u);
  // The job's alert ends now; the node's (no job) goes on.
  EXPECT_NE(calls[0].body.find("\"endsAt\":\"" + Rfc3339(unix0_ + 61 * kSecond)), std::string::npos)
      << calls[0].body;
  EXPECT_NE(calls[0].body.find("\"node\":\"gpu-3\""), std::string::npos);
  EXPECT_EQ(push->status()[0].firing, 1u);
}

TEST_F(AlertmanagerPushTest, ARefusedBatchIsDroppedNotRetried) {
  AlertHub hub(nullptr, nullptr, {}, {});
  auto push = Make(&hub);
  calls_->Answer(400);
  hub.Append({Straggler("a", 1, v1::ALERT_FIRING, 990)}, {});
  push->RunOnce(t0_, unix0_);
  EXPECT_EQ(calls_->Take().size(), 1u);  // and not again
  EXPECT_EQ(push->status()[0].cursor, 1u);
  EXPECT_FALSE(push->status()[0].failing);
}

// Restarts: the cursor and the firing set come back from the store.
class AlertmanagerPushStoreTest : public AlertmanagerPushTest {
 protected:
  std::unique_ptr<AlertmanagerPush> MakeStored() {
    return Make(stored_.hub(), stored_.store(), stored_.Persist());
  }
  void Append(std::vector<v1::Alert> alerts) { stored_.Append(std::move(alerts)); }

  StoredAlertHub stored_{"am-push-test"};
};

TEST_F(AlertmanagerPushStoreTest, ARestartResendsWhatWasNotDeliveredAndTheFiringSet) {
  Append({Straggler("old", 1, v1::ALERT_FIRING, 900)});  // before the target was configured
  auto push = MakeStored();
  EXPECT_EQ(push->status()[0].cursor, 1u);  // a new target starts at the newest alert
  Append({Straggler("a", 1, v1::ALERT_FIRING, 990)});
  push->RunOnce(t0_, unix0_);
  ASSERT_EQ(calls_->Take().size(), 1u);
  calls_->Answer(503);
  Append({Straggler("b", 2, v1::ALERT_FIRING, 995)});
  push->RunOnce(t0_ + seconds(1), unix0_ + kSecond);
  ASSERT_EQ(calls_->Take().size(), 1u);
  push.reset();
  stored_.Drain();
  stored_.Reopen();  // the daemon restarts; its jobs' firing alerts are restored
  stored_.hub()->SetFiring("a", {"a|straggler|rank:1"});
  stored_.hub()->SetFiring("b", {"b|straggler|rank:2"});
  calls_->Answer(200);
  push = MakeStored();
  EXPECT_EQ(push->status()[0].cursor, 2u);
  EXPECT_EQ(push->status()[0].firing, 1u);
  push->RunOnce(t0_, unix0_ + 100 * kSecond);
  auto calls = calls_->Take();
  ASSERT_EQ(calls.size(), 2u);
  // The alert not delivered, from the stored log; then both firing ones, a since its firing.
  EXPECT_NE(calls[0].body.find("\"training_job\":\"b\""), std::string::npos);
  EXPECT_EQ(calls[0].body.find("\"training_job\":\"a\""), std::string::npos);
  EXPECT_NE(calls[1].body.find("\"startsAt\":\"" + Rfc3339(990 * kSecond)), std::string::npos);
  EXPECT_NE(calls[1].body.find("\"training_job\":\"b\""), std::string::npos);
  EXPECT_EQ(calls[1].body.find("\"training_job\":\"old\""), std::string::npos);
  EXPECT_EQ(push->status()[0].cursor, 3u);
}

}  // namespace
}  // namespace rankwatch
