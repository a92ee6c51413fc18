#include "daemon/daemon_command_line.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <vector>

#include "daemon/daemon_settings.h"

namespace rankwatch {
namespace {

struct Outcome {
  CommandLine line;
  std::string out;
  std::string err;
};

Outcome Read(std::vector<std::string> args) {
  args.insert(args.begin(), "rankwatchd");
  std::vector<const char*> argv;
  for (const std::string& a : args) argv.push_back(a.c_str());
  std::ostringstream out, err;
  Outcome o;
  o.line = ReadCommandLine(static_cast<int>(argv.size()), argv.data(), "1.2.3", out, err);
  o.out = out.str();
  o.err = err.str();
  return o;
}

std::string WriteTemp(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream(path) << text;
  return path;
}

// Exit code 2 and one line on stderr that names `what`.
void ExpectOneLineNaming(const Outcome& o, const std::string& what) {
  EXPECT_EQ(o.line.exit_code, 2) << o.err;
  EXPECT_EQ(std::count(o.err.begin(), o.err.end(), '\n'), 1) << o.err;
  EXPECT_EQ(o.err.rfind("rankwatchd: ", 0), 0u) << o.err;
  EXPECT_NE(o.err.find(what), std::string::npos) << "'" << what << "' not in: " << o.err;
}

TEST(DaemonCommandLineTest, ListsRepeatTheFlagOrTakeAYamlListAndFlagsReplaceTheFilesList) {
  const std::string path = WriteTemp("lists.yaml",
                                     "alertmanager:\n"
                                     "  - http://am-1:9093\n"
                                     "  - http://am-2:9093\n"
                                     "action: hang:critical=webhook\n"
                                     "action-dry-run: true\n");
  Outcome o = Read({"--config", path});
  ASSERT_EQ(o.line.exit_code, -1) << o.err;
  EXPECT_EQ(o.line.config.alerting.alertmanager,
            (std::vector<std::string>{"http://am-1:9093", "http://am-2:9093"}));
  EXPECT_EQ(o.line.config.alerting.action, (std::vector<std::string>{"hang:critical=webhook"}));
  o = Read({"--config", path, "--alertmanager", "http://a:1", "--alertmanager=http://b:2"});
  ASSERT_EQ(o.line.exit_code, -1) << o.err;
  EXPECT_EQ(o.line.config.alerting.alertmanager,
            (std::vector<std::string>{"http://a:1", "http://b:2"}));
  ExpectOneLineNaming(Read({"--alertmanager", "http://a:1", "--alertmanager", "gopher://b"}),
                      "--alertmanager");
  ExpectOneLineNaming(
      Read({"--config", WriteTemp("badlist.yaml", "action:\n  - hang=webhook,x\n")}),
      "a list item may not hold a comma");
}

TEST(DaemonCommandLineTest, TheFileIsReadFirstAndFlagsWinOverIt) {
  const std::string path = WriteTemp("cli.yaml",
                                     "window-steps: 5\n"
                                     "align-timeout: 300ms\n"
                                     "metrics-listen: 127.0.0.1:1\n"
                                     "memory-diagnosis:\n"
                                     "  window-steps: 200\n");
  // --config anywhere on the line, in either spelling.
  for (const auto& args : std::vector<std::vector<std::string>>{
           {"--window-steps", "7", "--config", path, "--metrics-listen", "127.0.0.1:0"},
           {"--config=" + path, "--window-steps=7", "--metrics-listen", "127.0.0.1:0"}}) {
    const Outcome o = Read(args);
    ASSERT_EQ(o.line.exit_code, -1) << o.err;
    EXPECT_EQ(o.line.config.window_steps, 7);
    EXPECT_EQ(o.line.config.align_timeout, std::chrono::milliseconds(300));
    EXPECT_EQ(o.line.config.metrics_listen.port, 0);
    EXPECT_EQ(o.line.config.memory_window_steps, 200);
    EXPECT_EQ(o.line.config.topic, "rankwatch.telemetry");  // the default
  }
  const Outcome empty = Read({"--control-topic", "", "--ui-listen", ""});
  ASSERT_EQ(empty.line.exit_code, -1) << empty.err;
  EXPECT_EQ(empty.line.config.evidence.control_topic, "");
  EXPECT_FALSE(empty.line.config.ui_listen.has_value());
}

TEST(DaemonCommandLineTest, ABadFlagValueIsOneLineNamingTheFlag) {
  ExpectOneLineNaming(Read({"--capture-steps", "500"}), "--capture-steps: must be within 1..100");
  ExpectOneLineNaming(Read({"--session-timeout", "100ms"}), "--session-timeout");
  ExpectOneLineNaming(Read({"--metrics-listen", "nohost"}), "--metrics-listen");
  ExpectOneLineNaming(Read({"--log-level", "loud"}), "--log-level");
  ExpectOneLineNaming(Read({"--window-steps", "many"}), "--window-steps");
  ExpectOneLineNaming(Read({"--auto-capture", "perhaps"}), "--auto-capture");
  ExpectOneLineNaming(Read({"--grpc-tls-cert", "/nonexistent.pem"}), "--grpc-tls-cert");
  // The flag is checked even when the file gave the same key a good value.
  const std::string path = WriteTemp("good.yaml", "capture-steps: 5\n");
  ExpectOneLineNaming(Read({"--config", path, "--capture-steps", "0"}), "--capture-steps");
}

TEST(DaemonCommandLineTest, ABadFileValueIsOneLineNamingTheFileAndTheKey) {
  const std::string a = WriteTemp("bad-a.yaml", "capture-steps: 500\n");
  ExpectOneLineNaming(Read({"--config", a}), "config " + a + ": key 'capture-steps'");
  const std::string b = WriteTemp("bad-b.yaml", "memory-diagnosis:\n  window-steps: 0\n");
  ExpectOneLineNaming(Read({"--config", b}), "key 'memory-diagnosis.window-steps'");
  const std::string c = WriteTemp("bad-c.yaml", "capture-deadline: 2h\n");
  ExpectOneLineNaming(Read({"--config", c}), "key 'capture-deadline': must be within 1s..1h");
  const std::string d = WriteTemp("bad-d.yaml", "windw-steps: 5\n");
  ExpectOneLineNaming(Read({"--config", d}), "unknown key 'windw-steps'");
  const std::string e = WriteTemp("bad-e.yaml", "topic: [a, b]\n");
  ExpectOneLineNaming(Read({"--config", e}), "key 'topic'");
  const std::string f = WriteTemp("bad-f.yaml", "kafka: SASL\n");
  ExpectOneLineNaming(Read({"--config", f}), "key 'kafka'");
  // A file yaml-cpp cannot parse: its message, on one line.
  const std::string g = WriteTemp("bad-g.yaml", "a: [\n");
  ExpectOneLineNaming(Read({"--config", g}), "config " + g);
  ExpectOneLineNaming(Read({"--config", "/nonexistent/rankwatchd.yaml"}),
                      "/nonexistent/rankwatchd.yaml");
}

TEST(DaemonCommandLineTest, SettingsThatGoTogetherAreCheckedAfterFileAndFlags) {
  const std::string path = WriteTemp("tls.yaml", "grpc-tls-cert: /dev/null\n");
  ExpectOneLineNaming(Read({"--config", path}), "grpc-tls-key");
  EXPECT_EQ(Read({"--config", path, "--grpc-tls-key", "/dev/null"}).line.exit_code, -1);
}

TEST(DaemonCommandLineTest, UnknownFlagsAndFileOnlyKeysAsFlagsAreOneLine) {
  ExpectOneLineNaming(Read({"--windw-steps", "5"}), "--windw-steps");
  ExpectOneLineNaming(Read({"--step-diagnosis.min-steps", "5"}), "--step-diagnosis.min-steps");
  ExpectOneLineNaming(Read({"--window-steps"}), "--window-steps");
}

TEST(DaemonCommandLineTest, HelpListsEveryFlagWithItsDefault) {
  const Outcome o = Read({"--help"});
  EXPECT_EQ(o.line.exit_code, 0);
  EXPECT_EQ(o.err, "");
  for (const Setting& s : DaemonSettings()) {
    if (s.file_only()) {
      EXPECT_EQ(o.out.find(s.flag() + " "), std::string::npos) << s.key;
    } else {
      EXPECT_NE(o.out.find(s.flag() + " " + s.value_name), std::string::npos) << s.key;
    }
  }
  EXPECT_NE(o.out.find("--capture-deadline DURATION=1m"), std::string::npos) << o.out;
  EXPECT_EQ(o.out.find('`'), std::string::npos) << "markdown in --help";
}

TEST(DaemonCommandLineTest, HelpMarkdownAndVersionPrintAndExit) {
  const Outcome md = Read({"--help-markdown"});
  EXPECT_EQ(md.line.exit_code, 0);
  EXPECT_EQ(md.out, DaemonSettingsMarkdown());
  const Outcome version = Read({"--version"});
  EXPECT_EQ(version.line.exit_code, 0);
  EXPECT_EQ(version.out, "1.2.3\n");
}

}  // namespace
}  // namespace rankwatch
