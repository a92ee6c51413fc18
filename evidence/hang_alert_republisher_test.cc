#include "evidence/hang_alert_republisher.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace rankwatch {
namespace {

v1::Alert Hang(const std::string& job, v1::AlertState state, bool evidence = true) {
  v1::Alert a;
  a.set_id(job + "/hang");
  a.set_kind(v1::ALERT_HANG);
  a.set_state(state);
  a.set_training_job(job);
  a.set_at_unix_ns(100);
  if (evidence) a.mutable_evidence()->set_training_job(job);
  return a;
}

// Fills the summary of the hang stacks with `text` (empty: has nothing).
HangAlertRepublisher::Fill Stacks(const std::string& text) {
  return [text](const std::string&, v1::Alert* a) {
    if (text.empty()) return false;
    a->mutable_evidence()->mutable_hang_stacks()->set_summary(text);
    return true;
  };
}

TEST(HangAlertRepublisherTest, FillsHangAlertsWithEvidenceAndRepublishesTheNewest) {
  HangAlertRepublisher republisher;
  v1::Alert other = Hang("a", v1::ALERT_FIRING);
  other.set_kind(v1::ALERT_STRAGGLER);
  std::vector<v1::Alert> alerts = {Hang("a", v1::ALERT_PENDING), other,
                                   Hang("b", v1::ALERT_FIRING, false)};
  republisher.Attach(&alerts, Stacks("first"));
  EXPECT_EQ(alerts[0].evidence().hang_stacks().summary(), "first");
  EXPECT_FALSE(alerts[1].evidence().has_hang_stacks());  // not a hang alert
  EXPECT_FALSE(alerts[2].has_evidence());                // none to fill

  std::vector<v1::Alert> later;
  // Evidence that came later: the newest hang alert again, at the new time.
  EXPECT_TRUE(republisher.Republish("a", 200, Stacks("second"), &later));
  ASSERT_EQ(later.size(), 1u);
  EXPECT_EQ(later[0].id(), "a/hang");
  EXPECT_EQ(later[0].state(), v1::ALERT_PENDING);
  EXPECT_EQ(later[0].at_unix_ns(), 200);
  EXPECT_EQ(later[0].evidence().hang_stacks().summary(), "second");
  // Nothing new to put in, an alert without evidence, a job without a hang alert: nothing.
  EXPECT_FALSE(republisher.Republish("a", 300, Stacks(""), &later));
  EXPECT_FALSE(republisher.Republish("b", 300, Stacks("x"), &later));
  EXPECT_FALSE(republisher.Republish("c", 300, Stacks("x"), &later));
  EXPECT_EQ(later.size(), 1u);

  // A resolved alert, or a forgotten job, is not published again.
  std::vector<v1::Alert> resolved = {Hang("a", v1::ALERT_RESOLVED)};
  republisher.Attach(&resolved, Stacks("third"));
  EXPECT_FALSE(resolved[0].evidence().has_hang_stacks());
  EXPECT_FALSE(republisher.Republish("a", 400, Stacks("x"), &later));
  std::vector<v1::Alert> again = {Hang("d", v1::ALERT_FIRING)};
  republisher.Attach(&again, Stacks(""));
  republisher.Forget("d");
  EXPECT_FALSE(republisher.Republish("d", 400, Stacks("x"), &later));
}

}  // namespace
}  // namespace rankwatch
