// The subcommands of the `rankwatch` tool. Each registers its flags on `app` and returns the
// function that runs it after parsing (exit code as result).
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

namespace rankwatch {

using CommandRunner = std::function<int()>;

CommandRunner AddKafkaCommand(CLI::App& app);
CommandRunner AddSimulateCommand(CLI::App& app);
CommandRunner AddDiagnoseCommand(CLI::App& app);
CommandRunner AddReplayCommand(CLI::App& app);
CommandRunner AddAgentCommand(CLI::App& app);
CommandRunner AddAnalyzeCommand(CLI::App& app);
CommandRunner AddAlertsCommand(CLI::App& app);
CommandRunner AddTopCommand(CLI::App& app);
CommandRunner AddCaptureCommand(CLI::App& app);
CommandRunner AddTimelineCommand(CLI::App& app);
CommandRunner AddWhatifCommand(CLI::App& app);
CommandRunner AddFlightRecorderCommand(CLI::App& app);
CommandRunner AddNodesCommand(CLI::App& app);

}  // namespace rankwatch
