// rankwatch: the operator's tool. Subcommands: kafka (local broker), simulate (synthetic
// fleet), replay (vendor iteration traces), diagnose (a job's diagnosis from rankwatchd), alerts
// and top (rankwatchd's alerts; a live view of every job), nodes (the fleet view of nodes),
// analyze (GPU timeline analyses of Kineto traces). Bad arguments exit with code 2.
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "common/logging.h"
#include "common/stop_signal.h"

int main(int argc, char** argv) {
  rankwatch::InstallStopSignalHandlers();
  rankwatch::SetupLogging("info");
  CLI::App app{"rankwatch: tools for rankwatch, live diagnosis of distributed training"};
  app.require_subcommand(1);
  app.set_version_flag("--version", RANKWATCH_VERSION);
  std::vector<rankwatch::CommandRunner> commands = {
      rankwatch::AddKafkaCommand(app),    rankwatch::AddSimulateCommand(app),
      rankwatch::AddDiagnoseCommand(app), rankwatch::AddReplayCommand(app),
      rankwatch::AddAgentCommand(app),    rankwatch::AddAnalyzeCommand(app),
      rankwatch::AddAlertsCommand(app),   rankwatch::AddTopCommand(app),
      rankwatch::AddCaptureCommand(app),  rankwatch::AddTimelineCommand(app),
      rankwatch::AddWhatifCommand(app),   rankwatch::AddFlightRecorderCommand(app),
      rankwatch::AddNodesCommand(app),
  };
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }
  for (const auto& run : commands) {
    if (int code = run(); code >= 0) return code;
  }
  return 2;
}
