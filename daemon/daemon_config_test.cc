#include "daemon/daemon_config.h"

#include <gtest/gtest.h>

#include <fstream>

namespace rankwatch {
namespace {

std::string WriteTemp(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream(path) << text;
  return path;
}

TEST(DaemonConfigTest, ReadsEveryKey) {
  DaemonConfig c;
  const std::string path = WriteTemp("full.yaml",
                                     "brokers: k1:9092,k2:9092\n"
                                     "topic: t\n"
                                     "group: g\n"
                                     "state-dir: /tmp/s\n"
                                     "metrics-listen: 127.0.0.1:1\n"
                                     "grpc-listen: 127.0.0.1:2\n"
                                     "window-steps: 50\n"
                                     "align-timeout: 500ms\n"
                                     "checkpoint-budget-mib: 64\n"
                                     "instance-id: rw-east-1\n"
                                     "session-timeout: 20s\n"
                                     "kafka:\n"
                                     "  security.protocol: SASL_SSL\n");
  ASSERT_TRUE(LoadDaemonConfigFile(path, &c).ok());
  EXPECT_EQ(c.brokers, "k1:9092,k2:9092");
  EXPECT_EQ(c.window_steps, 50);
  EXPECT_EQ(c.align_timeout, std::chrono::milliseconds(500));
  EXPECT_EQ(c.checkpoint_budget_mib, 64);
  EXPECT_EQ(c.instance_id, "rw-east-1");
  EXPECT_EQ(c.session_timeout, std::chrono::seconds(20));
  EXPECT_EQ(c.kafka.at("security.protocol"), "SASL_SSL");
  EXPECT_EQ(c.log_level, "info");  // untouched default
}

TEST(DaemonConfigTest, DiagnosisThresholdsAreConfigurable) {
  DaemonConfig c;
  const std::string path = WriteTemp("thresholds.yaml",
                                     "step-diagnosis:\n"
                                     "  straggler-warn: 0.15\n"
                                     "  onset-steps: 12\n"
                                     "memory-diagnosis:\n"
                                     "  window-steps: 200\n"
                                     "  pressure-crit: 0.99\n"
                                     "  imbalance-min-pressure: 0.5\n"
                                     "  trend-early-growth: 0.2\n"
                                     "  trend: false\n");
  ASSERT_TRUE(LoadDaemonConfigFile(path, &c).ok());
  EXPECT_DOUBLE_EQ(c.memory_diagnosis.imbalance_min_pressure, 0.5);
  EXPECT_DOUBLE_EQ(c.memory_diagnosis.trend_early_growth, 0.2);
  EXPECT_FALSE(c.memory_diagnosis.trend);
  EXPECT_DOUBLE_EQ(c.step_diagnosis.straggler_warn, 0.15);
  EXPECT_DOUBLE_EQ(c.step_diagnosis.straggler_crit, 0.20);  // untouched default
  EXPECT_EQ(c.step_diagnosis.onset_steps, 12u);
  EXPECT_EQ(c.memory_window_steps, 200);
  EXPECT_DOUBLE_EQ(c.memory_diagnosis.pressure_crit, 0.99);
  absl::Status s =
      LoadDaemonConfigFile(WriteTemp("bad3.yaml", "step-diagnosis:\n  stragler-warn: 1\n"), &c);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("step-diagnosis.stragler-warn"), std::string::npos) << s;
}

TEST(DaemonConfigTest, UnknownKeysAndBadValuesNameTheKey) {
  DaemonConfig c;
  absl::Status s = LoadDaemonConfigFile(WriteTemp("bad.yaml", "windw-steps: 5\n"), &c);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("windw-steps"), std::string::npos);
  s = LoadDaemonConfigFile(WriteTemp("bad2.yaml", "window-steps: lots\n"), &c);
  EXPECT_NE(s.message().find("window-steps"), std::string::npos);
  s = LoadDaemonConfigFile("/nonexistent/rankwatch.yaml", &c);
  EXPECT_NE(s.message().find("/nonexistent/rankwatch.yaml"), std::string::npos);
}

TEST(DaemonConfigTest, TheShippedExampleConfigLoads) {
  DaemonConfig c;
  absl::Status s = LoadDaemonConfigFile(RANKWATCH_SOURCE_DIR "/deploy/rankwatchd.example.yaml", &c);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(c.state_dir, "/var/lib/rankwatch");
  EXPECT_EQ(c.kafka.at("security.protocol"), "SASL_SSL");
  EXPECT_EQ(c.align_timeout, std::chrono::seconds(10));  // parsed as it was read
}

TEST(DaemonConfigTest, ParsesDurations) {
  EXPECT_EQ(*ParseDuration("250ms"), std::chrono::milliseconds(250));
  EXPECT_EQ(*ParseDuration("10s"), std::chrono::seconds(10));
  EXPECT_EQ(*ParseDuration("2m"), std::chrono::minutes(2));
  EXPECT_EQ(*ParseDuration("1.5"), std::chrono::milliseconds(1500));
  EXPECT_FALSE(ParseDuration("fast").ok());
  EXPECT_FALSE(ParseDuration("10 parsecs").ok());
  EXPECT_FALSE(ParseDuration("-1s").ok());
  // int64 nanoseconds hold about 292 years: longer is an error, not an overflow
  // (fuzz_daemon_config).
  EXPECT_FALSE(ParseDuration("1e300").ok());
  EXPECT_FALSE(ParseDuration("10000000h").ok());
  EXPECT_EQ(*ParseDuration("1000h"), std::chrono::hours(1000));
}

TEST(DaemonConfigTest, AKeyThatIsNotANameIsAnError) {
  // A map or a list as a key used to throw out of LoadDaemonConfigFile (fuzz_daemon_config).
  DaemonConfig c;
  absl::Status s = LoadDaemonConfigFile(WriteTemp("mapkey.yaml", "{a: b}: 1\n"), &c);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("not a name"), std::string::npos) << s;
  s = LoadDaemonConfigFile(WriteTemp("listkey.yaml", "? [1, 2]\n: 3\n"), &c);
  EXPECT_FALSE(s.ok());
}

}  // namespace
}  // namespace rankwatch
