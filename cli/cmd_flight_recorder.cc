// `rankwatch flight-recorder [--json] [--ranks] [--collectives] [--world-size N] PATH...`: why a
// hung job hangs, from the Flight Recorder dumps its ranks wrote (PyTorch's NCCL watchdog, on a
// timeout), offline: the same reader and analysis the daemon runs live (flight_recorder/). PATH is
// a folder of dumps, the dump prefix (TORCH_NCCL_DEBUG_INFO_TEMP_FILE) or files.
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "flight_recorder/fr_analysis.h"
#include "flight_recorder/fr_files.h"
#include "flight_recorder/fr_report.h"

namespace rankwatch {
namespace {

struct FlightRecorderFlags {
  std::vector<std::string> paths;
  bool json = false;
  bool per_rank = false;
  bool collectives = false;
  uint32_t world_size = 0;
};

int RunFlightRecorder(const FlightRecorderFlags& f) {
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  std::vector<std::filesystem::path> paths(f.paths.begin(), f.paths.end());
  auto dumps = fr::LoadDumps(paths);
  if (!dumps.ok()) {
    std::fprintf(stderr, "rankwatch flight-recorder: %s\n",
                 std::string(dumps.status().message()).c_str());
    return 2;
  }
  const auto t1 = Clock::now();
  fr::FrAnalysisOptions options;
  options.world_size = f.world_size;
  const fr::FrVerdict v = fr::AnalyzeFlightRecorder(*dumps, options);
  const auto t2 = Clock::now();
  if (f.json) {
    std::string json = fr::VerdictJson(v);
    if (f.collectives) {
      // One more member of the object: "collectives": [...].
      while (!json.empty() && (json.back() == '\n' || json.back() == '}')) json.pop_back();
      json += ",\"collectives\":" + fr::CollectivesJson(fr::MatchCollectives(*dumps)) + "}\n";
    }
    std::fputs(json.c_str(), stdout);
    return 0;
  }
  for (const fr::RankDump& d : *dumps)
    if (d.state == fr::DumpState::kUnreadable)
      std::fprintf(stderr, "rankwatch flight-recorder: rank %u: %s: %s\n", d.rank, d.source.c_str(),
                   d.error.c_str());
  std::printf("%zu dumps of %u ranks (read in %.2f s, analysed in %.3f s)\n", dumps->size(),
              v.world_size, std::chrono::duration<double>(t1 - t0).count(),
              std::chrono::duration<double>(t2 - t1).count());
  fr::ReportOptions ro;
  ro.per_rank = f.per_rank;
  std::fputs(fr::VerdictText(v, ro).c_str(), stdout);
  if (f.collectives)
    std::fputs(("\n" + fr::CollectivesText(fr::MatchCollectives(*dumps))).c_str(), stdout);
  return 0;
}

}  // namespace

CommandRunner AddFlightRecorderCommand(CLI::App& app) {
  auto f = std::make_shared<FlightRecorderFlags>();
  CLI::App* cmd = app.add_subcommand(
      "flight-recorder",
      "why a hung job hangs, from its ranks' PyTorch Flight Recorder dumps, offline "
      "(docs/flight-recorder.md)");
  cmd->add_flag("--json", f->json, "print one JSON object");
  cmd->add_flag("--ranks", f->per_rank, "also one line per rank (its last operation per group)");
  cmd->add_flag("--collectives", f->collectives,
                "also every collective of the dumps matched across its group's members, as "
                "PyTorch's fr_trace does (failing ones first)");
  cmd->add_option("--world-size", f->world_size,
                  "ranks in the job (default: the largest rank any dump names + 1)");
  cmd->add_option("paths", f->paths,
                  "a folder of dumps, the dump prefix (TORCH_NCCL_DEBUG_INFO_TEMP_FILE) or files")
      ->required();
  return [cmd, f]() -> int { return cmd->parsed() ? RunFlightRecorder(*f) : -1; };
}

}  // namespace rankwatch
