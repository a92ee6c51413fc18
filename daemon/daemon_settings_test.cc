#include "daemon/daemon_settings.h"

#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <set>
#include <sstream>

namespace rankwatch {
namespace {

// A valid value unlike the default for every setting: the table must not grow a row without one.
const std::map<std::string, std::string>& Samples() {
  static const auto* samples = new std::map<std::string, std::string>{
      {"brokers", "k1:9092"},
      {"topic", "t"},
      {"group", "g"},
      {"state-dir", "/tmp/s"},
      {"metrics-listen", "127.0.0.1:1"},
      {"grpc-listen", "[::1]:2"},
      {"ui-listen", ""},
      {"window-steps", "50"},
      {"align-timeout", "500ms"},
      {"hang-timeout", "2m"},
      {"checkpoint-interval", "250ms"},
      {"checkpoint-budget-mib", "64"},
      {"checkpoint-input-mib", "64"},
      {"ingest-threads", "3"},
      {"changelog-topic", "c"},
      {"control-topic", ""},
      {"hang-stacks", "false"},
      {"flight-recorder", "false"},
      {"flight-recorder-settle", "5s"},
      {"auto-capture", "false"},
      {"capture-steps", "7"},
      {"capture-interval", "30s"},
      {"capture-deadline", "4s"},
      {"job-ttl", "30s"},
      {"job-retention", "5s"},
      {"embedded-partitions", "3"},
      {"max-jobs", "12"},
      {"max-ranks", "13"},
      {"job-min-steps", "3"},
      {"max-exported-jobs", "14"},
      {"nodes-topic", "fleet.nodes"},
      {"node-horizon", "2h"},
      {"node-alert-window", "30m"},
      {"node-alert-jobs", "4"},
      {"max-exported-nodes", "7"},
      {"alert-subscriber-queue", "16"},
      {"alertmanager", "http://am-1:9093,https://am-2:9093/prefix"},
      {"alertmanager-ca", "/dev/null"},
      {"alertmanager-basic-auth-file", "/dev/null"},
      {"alertmanager-bearer-token-file", "/dev/zero"},
      {"alertmanager-resend-interval", "30s"},
      {"ui-external-url", "https://rankwatch.example.com"},
      {"alert-runbook-url", "https://runbooks.example.com/{alertname}"},
      {"action", "hang:critical=webhook,*=observe"},
      {"action-webhook", "http://hooks:8080/rankwatch"},
      {"action-secret-file", "/dev/null"},
      {"action-ca", "/dev/null"},
      {"action-dry-run", "true"},
      {"action-evidence-wait", "10s"},
      {"grpc-tls-cert", "/dev/null"},
      {"grpc-tls-key", "/dev/zero"},
      {"grpc-tls-client-ca", "/proc/self/status"},
      {"log-level", "warn"},
      {"instance-id", "rw-east-1"},
      {"session-timeout", "20s"},
      {"step-diagnosis.min-steps", "9"},
      {"step-diagnosis.straggler-warn", "0.15"},
      {"step-diagnosis.straggler-crit", "0.3"},
      {"step-diagnosis.input-share-warn", "0.25"},
      {"step-diagnosis.input-share-crit", "0.35"},
      {"step-diagnosis.wait-share-warn", "0.11"},
      {"step-diagnosis.wait-share-crit", "0.22"},
      {"step-diagnosis.compute-share-warn", "0.85"},
      {"step-diagnosis.compute-share-crit", "0.92"},
      {"step-diagnosis.bound-max-skew", "0.07"},
      {"step-diagnosis.onset-steps", "12"},
      {"step-diagnosis.sync-max-step-skew", "0.03"},
      {"step-diagnosis.node-fraction", "0.75"},
      {"step-diagnosis.hang-timeout-steps", "6"},
      {"memory-diagnosis.window-steps", "200"},
      {"memory-diagnosis.min-steps", "40"},
      {"memory-diagnosis.pressure-warn", "0.9"},
      {"memory-diagnosis.pressure-crit", "0.99"},
      {"memory-diagnosis.imbalance-warn", "0.13"},
      {"memory-diagnosis.imbalance-crit", "0.21"},
      {"memory-diagnosis.imbalance-min-pressure", "0.5"},
      {"memory-diagnosis.trend", "false"},
      {"step-diagnosis.statistical", "false"},
      {"step-diagnosis.straggler-z", "4.5"},
      {"step-diagnosis.straggler-min-excess", "0.05"},
      {"step-diagnosis.straggler-crit-lost-ranks", "16"},
      {"step-diagnosis.pattern-stall-sigma", "8"},
      {"step-diagnosis.pattern-stall-share", "0.5"},
      {"step-diagnosis.pattern-min-stalls", "4"},
      {"step-diagnosis.pattern-drift-fit", "0.6"},
      {"memory-diagnosis.trend-min-steps", "300"},
      {"memory-diagnosis.trend-min-points", "40"},
      {"memory-diagnosis.trend-steady-ratio", "0.6"},
      {"memory-diagnosis.trend-noise", "5"},
      {"memory-diagnosis.trend-min-growth-bytes", "1048576"},
      {"memory-diagnosis.trend-early-growth", "0.2"},
      {"memory-diagnosis.trend-confirmed-growth", "0.3"},
      {"memory-diagnosis.trend-last-half", "false"},
      {"memory-diagnosis.rank-trend", "false"},
      {"memory-diagnosis.rank-window", "false"},
      {"whatif.window-steps", "32"},
      {"whatif.decompose-min-slowdown", "1.1"},
      {"whatif.min-steps", "6"},
      {"whatif.warn-slowdown", "1.08"},
      {"whatif.crit-slowdown", "1.3"},
      {"whatif.explain-share", "0.6"},
      {"whatif.moving-max-share", "0.7"},
      {"whatif.min-stage-excess", "0.1"},
      {"whatif.exit-slowdown", "1.02"},
      {"whatif.crit-exit-slowdown", "1.12"},
      {"whatif.keep-share", "0.3"},
      {"whatif.hold-steps", "24"},
  };
  return *samples;
}

// Every row's value in `config`.
std::map<std::string, std::string> Values(const DaemonConfig& config) {
  std::map<std::string, std::string> values;
  for (const Setting& s : DaemonSettings()) values[s.key] = s.get(config);
  return values;
}

TEST(DaemonSettingsTest, EachSettingIsOneRowWithHelp) {
  std::set<std::string> keys;
  for (const Setting& s : DaemonSettings()) {
    EXPECT_TRUE(keys.insert(s.key).second) << s.key << " is declared twice";
    EXPECT_FALSE(s.help.empty()) << s.key;
    EXPECT_EQ(s.help.find('|'), std::string::npos) << s.key << ": a markdown column separator";
    const std::string section = s.section();
    if (!section.empty()) {
      bool declared = false;
      for (const SettingSection& known : DaemonSettingSections()) declared |= known.name == section;
      EXPECT_TRUE(declared) << s.key << ": section " << section << " is not declared";
    }
  }
  EXPECT_NE(FindDaemonSetting("memory-diagnosis.window-steps"), nullptr);
  EXPECT_EQ(FindDaemonSetting("window-step"), nullptr);
}

TEST(DaemonSettingsTest, EveryDefaultReadsBackAsItself) {
  // --help and the docs print the defaults; each must be a value its own parser accepts.
  const DaemonConfig defaults;
  for (const Setting& s : DaemonSettings()) {
    if (s.is_map) continue;
    DaemonConfig c;
    ASSERT_TRUE(s.set(s.get(defaults), &c).ok()) << s.key << " = '" << s.get(defaults) << "'";
    EXPECT_EQ(Values(c), Values(defaults)) << s.key;
  }
}

TEST(DaemonSettingsTest, EachRowSetsItsOwnFieldAndNoOther) {
  const DaemonConfig defaults;
  const std::map<std::string, std::string> before = Values(defaults);
  for (const Setting& s : DaemonSettings()) {
    if (s.is_map) continue;
    auto sample = Samples().find(s.key);
    ASSERT_NE(sample, Samples().end()) << "no sample value for " << s.key;
    DaemonConfig c;
    ASSERT_TRUE(s.set(sample->second, &c).ok()) << s.key << " = " << sample->second;
    std::map<std::string, std::string> expected = before;
    expected[s.key] = sample->second;
    EXPECT_EQ(Values(c), expected) << s.key;
    EXPECT_NE(s.get(c), s.get(defaults)) << s.key << ": the sample is the default";
  }
  EXPECT_EQ(Samples().size(), DaemonSettings().size() - 1);  // all but `kafka`
}

TEST(DaemonSettingsTest, TheTypedFieldsGetTheParsedValues) {
  DaemonConfig c;
  ASSERT_TRUE(FindDaemonSetting("hang-timeout")->set("2m", &c).ok());
  EXPECT_EQ(c.step_diagnosis.hang_timeout_min, std::chrono::minutes(2));
  ASSERT_TRUE(FindDaemonSetting("grpc-listen")->set("[::1]:2", &c).ok());
  EXPECT_EQ(c.grpc_listen.host, "::1");
  EXPECT_EQ(c.grpc_listen.port, 2);
  ASSERT_TRUE(FindDaemonSetting("ui-listen")->set("", &c).ok());
  EXPECT_FALSE(c.ui_listen.has_value());
  ASSERT_TRUE(FindDaemonSetting("session-timeout")->set("20s", &c).ok());
  EXPECT_EQ(c.session_timeout, std::chrono::seconds(20));
  ASSERT_TRUE(FindDaemonSetting("memory-diagnosis.trend")->set("off", &c).ok());
  EXPECT_FALSE(c.memory_diagnosis.trend);
  ASSERT_TRUE(FindDaemonSetting("step-diagnosis.onset-steps")->set("12", &c).ok());
  EXPECT_EQ(c.step_diagnosis.onset_steps, 12u);
  // Lists: comma-separated items, spaces around them dropped.
  ASSERT_TRUE(FindDaemonSetting("alertmanager")->set(" http://a:1 , http://b:2,", &c).ok());
  EXPECT_EQ(c.alerting.alertmanager, (std::vector<std::string>{"http://a:1", "http://b:2"}));
  EXPECT_TRUE(FindDaemonSetting("alertmanager")->is_list);
  EXPECT_FALSE(FindDaemonSetting("alertmanager-ca")->is_list);
}

TEST(DaemonSettingsTest, BadValuesAreRejectedWithWhatIsWrongAndLeaveTheConfigAlone) {
  const std::vector<std::tuple<std::string, std::string, std::string>> cases = {
      {"capture-steps", "0", "must be within 1..100, not 0"},
      {"capture-steps", "101", "must be within 1..100, not 101"},
      {"capture-steps", "many", "'many' is not a whole number"},
      {"capture-deadline", "500ms", "must be within 1s..1h, not 500ms"},
      {"capture-deadline", "2h", "must be within 1s..1h, not 2h"},
      {"session-timeout", "100ms", "must be within 1s..1h"},
      {"window-steps", "0", "must be at least 1"},
      {"window-steps", "99999999999", "out of range"},
      {"memory-diagnosis.window-steps", "0", "must be at least 1"},
      {"checkpoint-budget-mib", "65537", "must be within 1..65536"},
      {"checkpoint-input-mib", "0", "must be within 1..65536"},
      {"ingest-threads", "0", "must be within 1..64"},
      {"alert-subscriber-queue", "0", "must be at least 1"},
      {"max-jobs", "0", "must be at least 1"},
      {"max-ranks", "-1", "must be at least 1"},
      {"job-min-steps", "0", "must be within 1..1000000, not 0"},
      {"max-exported-jobs", "-1", "must be at least 0"},
      {"node-horizon", "10s", "must be within"},
      {"node-alert-window", "soon", "bad duration"},
      {"node-alert-jobs", "-1", "must be within 0..100000"},
      {"max-exported-nodes", "100001", "must be within 0..100000"},
      {"embedded-partitions", "0", "must be within 1..1000"},
      {"align-timeout", "soon", "bad duration"},
      {"job-ttl", "-1s", "bad duration"},
      {"log-level", "loud", "unknown log level 'loud'"},
      {"instance-id", "a b", "not a Kafka instance id"},
      {"grpc-tls-cert", "/nonexistent/cert.pem", "cannot read '/nonexistent/cert.pem'"},
      {"metrics-listen", "nohost", "must be host:port"},
      {"ui-listen", "127.0.0.1:99999", "bad port"},
      {"hang-stacks", "maybe", "not true or false"},
      {"topic", "", "must not be empty"},
      {"step-diagnosis.straggler-warn", "nan", "not finite"},
      {"step-diagnosis.straggler-warn", "-0.1", "must be at least 0"},
      {"step-diagnosis.input-share-warn", "1.5", "must be within 0..1"},
      {"step-diagnosis.min-steps", "-1", "out of range"},
      {"memory-diagnosis.trend-noise", "4x", "not a number"},
      {"alertmanager", "http://am:9093,ftp://am", "the scheme must be http or https"},
      {"alertmanager", "http://admin:pw@am:9093", "credentials go in a file"},
      {"alertmanager-resend-interval", "0s", "must be within 1s..1h"},
      {"alertmanager-bearer-token-file", "/nonexistent/token", "cannot read"},
      {"action", "hang=restart", "unknown action 'restart'"},
      {"action", "oom:critical=webhook", "unknown alert kind 'oom'"},
      {"action", "hang:urgent=webhook", "unknown severity 'urgent'"},
      {"action-webhook", "hooks:8080", "is not an http(s):// URL"},
      {"action-evidence-wait", "11m", "must be within 0s..10m"},
  };
  for (const auto& [key, text, message] : cases) {
    const Setting* s = FindDaemonSetting(key);
    ASSERT_NE(s, nullptr) << key;
    DaemonConfig c;
    const absl::Status status = s->set(text, &c);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << key << " = " << text;
    EXPECT_NE(status.message().find(message), std::string::npos) << key << ": " << status;
    EXPECT_EQ(Values(c), Values(DaemonConfig{})) << key;
  }
}

TEST(DaemonSettingsTest, SettingsThatGoTogetherAreCheckedTogether) {
  DaemonConfig c;
  EXPECT_TRUE(CheckDaemonConfig(c).ok());
  c.grpc_tls_cert = "/dev/null";
  absl::Status s = CheckDaemonConfig(c);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("grpc-tls-key"), std::string::npos) << s;
  c.grpc_tls_key = "/dev/null";
  EXPECT_TRUE(CheckDaemonConfig(c).ok());
  c = DaemonConfig{};
  c.grpc_tls_client_ca = "/dev/null";
  EXPECT_FALSE(CheckDaemonConfig(c).ok());
  // Alertmanager: one kind of credentials.
  c = DaemonConfig{};
  c.alerting.alertmanager_basic_auth_file = c.alerting.alertmanager_bearer_token_file = "/dev/null";
  EXPECT_FALSE(CheckDaemonConfig(c).ok());
  // A webhook action needs a webhook, and a webhook the secret (but for a dry run).
  c = DaemonConfig{};
  c.alerting.action = {"straggler=observe"};
  EXPECT_TRUE(CheckDaemonConfig(c).ok());
  c.alerting.action = {"hang=webhook"};
  s = CheckDaemonConfig(c);
  EXPECT_NE(s.message().find("action-webhook"), std::string::npos) << s;
  c.alerting.action_webhook = {"http://hooks/"};
  s = CheckDaemonConfig(c);
  EXPECT_NE(s.message().find("action-secret-file"), std::string::npos) << s;
  c.alerting.action_dry_run = true;
  EXPECT_TRUE(CheckDaemonConfig(c).ok());
  c.alerting.action_dry_run = false;
  c.alerting.action_secret_file = "/dev/null";
  EXPECT_TRUE(CheckDaemonConfig(c).ok());
}

TEST(DaemonSettingsTest, DurationsPrintInTheirLargestWholeUnit) {
  using namespace std::chrono;
  EXPECT_EQ(SettingValue<Duration>::Format(hours(1)), "1h");
  EXPECT_EQ(SettingValue<Duration>::Format(minutes(10)), "10m");
  EXPECT_EQ(SettingValue<Duration>::Format(seconds(90)), "90s");
  EXPECT_EQ(SettingValue<Duration>::Format(milliseconds(250)), "250ms");
  EXPECT_EQ(SettingValue<Duration>::Format(microseconds(1500)), "0.0015");
  EXPECT_EQ(*SettingValue<Duration>::Parse("0.0015"), microseconds(1500));
  EXPECT_EQ(SettingValue<Duration>::Format(Duration::zero()), "0s");
}

// The flag table of docs/operating.md is this table's markdown (rankwatchd --help-markdown).
TEST(DaemonSettingsTest, TheOperatingGuideListsEverySettingAsDeclared) {
  const std::string path = RANKWATCH_SOURCE_DIR "/docs/operating.md";
  std::ifstream file(path);
  ASSERT_TRUE(file) << path;
  std::stringstream text;
  text << file.rdbuf();
  const std::string doc = text.str();
  const std::string begin = "<!-- settings table: begin";
  const std::string end = "<!-- settings table: end -->";
  const size_t b = doc.find(begin);
  const size_t e = doc.find(end);
  ASSERT_NE(b, std::string::npos) << path << " has no '" << begin << "' line";
  ASSERT_NE(e, std::string::npos) << path << " has no '" << end << "' line";
  const size_t table = doc.find('\n', b) + 1;
  ASSERT_LE(table, e);
  EXPECT_EQ(doc.substr(table, e - table), DaemonSettingsMarkdown())
      << path << " differs from the settings table: replace the lines between the markers with "
      << "the output of `build/bin/rankwatchd --help-markdown`";
}

}  // namespace
}  // namespace rankwatch
