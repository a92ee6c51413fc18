// `rankwatch top --server ADDR`: a live view of every training job rankwatchd diagnoses —
// diagnosis and severity, worst rank(s), step-time skew, wait and input shares, memory state,
// firing alerts — redrawn every second. Plain ANSI (home + clear), so it works over SSH and
// in tmux; without a terminal (or with --once) frames are printed one after another.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <thread>

#include "cli/commands.h"
#include "cli/grpc_client.h"
#include "common/stop_signal.h"
#include "rankwatch/v1/service.grpc.pb.h"

namespace rankwatch {
namespace {

struct TopFlags {
  GrpcClientFlags client;
  double interval_s = 1;
  bool once = false;
};

std::string Word(std::string s, const std::string& prefix) {
  if (s.rfind(prefix, 0) == 0) s = s.substr(prefix.size());
  for (char& c : s) c = static_cast<char>(std::tolower(c));
  return s;
}

std::string Ranks(const v1::JobSummary& j) {
  if (j.culprit_ranks_size() == 0) return "-";
  std::string out;
  for (int i = 0; i < j.culprit_ranks_size() && i < 4; ++i) {
    if (!out.empty()) out += ",";
    out += std::to_string(j.culprit_ranks(i));
  }
  if (j.culprit_ranks_size() > 4) out += ",…";
  // One culprit in a named pod: "42 trainer-worker-5".
  if (j.culprit_ranks_size() == 1 && j.culprit_pods_size() == 1 && !j.culprit_pods(0).empty()) {
    out += " " + j.culprit_pods(0);
  }
  return out;
}

void Draw(const v1::ListJobsResponse& jobs, const std::string& server, bool clear) {
  if (clear) std::printf("\x1b[H\x1b[2J");
  std::printf("rankwatch top — %s — %d jobs\n\n", server.c_str(), jobs.jobs_size());
  std::printf("%-24s %7s %9s  %-20s %-5s %-10s %6s %6s %6s %6s %-14s  %-18s %s\n", "JOB", "RANKS",
              "STEPS", "DIAGNOSIS", "SEV", "WORST", "SKEW", "WAIT", "INPUT", "LOST", "COSTLIEST",
              "MEMORY", "FIRING");
  for (const v1::JobSummary& j : jobs.jobs()) {
    std::string firing;
    for (const std::string& id : j.firing_alerts()) {
      // id = job|kind|subject: show kind@subject
      const size_t a = id.find('|');
      const size_t b = id.find('|', a + 1);
      if (!firing.empty()) firing += " ";
      firing += a == std::string::npos || b == std::string::npos
                    ? id
                    : id.substr(a + 1, b - a - 1) + "@" + id.substr(b + 1);
    }
    // Lost time since start, as a share of the job's rank-seconds, and the rank that cost most.
    const v1::LostTime& l = j.lost_time();
    const double lost = l.total_rank_seconds() > 0
                            ? (l.total_straggler_rank_seconds() + l.total_hang_rank_seconds()) /
                                  l.total_rank_seconds()
                            : 0;
    char costliest[64] = "-";
    if (l.top_size() > 0 && l.total_rank_seconds() > 0) {
      std::snprintf(costliest, sizeof(costliest), "r%u %.1f%%", l.top(0).rank(),
                    l.top(0).total_rank_seconds() / l.total_rank_seconds() * 100);
    }
    std::printf(
        "%-24.24s %3u/%-3u %9llu  %-20s %-5s %-10s %5.1f%% %5.1f%% %5.1f%% %5.1f%% %-14s  %-18s "
        "%s\n",
        j.training_job().c_str(), j.ranks_seen(), j.world_size(),
        static_cast<unsigned long long>(j.aligned_steps()),
        Word(v1::StepDiagnosisLabel_Name(j.step_label()), "STEP_").c_str(),
        Word(v1::Severity_Name(j.step_severity()), "SEVERITY_").c_str(), Ranks(j).c_str(),
        j.step_skew() * 100, j.wait_share() * 100, j.input_share() * 100, lost * 100, costliest,
        Word(v1::MemoryDiagnosisLabel_Name(j.memory_label()), "MEMORY_").c_str(),
        firing.empty() ? "-" : firing.c_str());
  }
  std::fflush(stdout);
}

int RunTop(const TopFlags& f) {
  auto channel = OpenChannel(f.client);
  if (!channel.ok()) {
    std::fprintf(stderr, "rankwatch top: %s\n", std::string(channel.status().message()).c_str());
    return 2;
  }
  auto stub = v1::RankWatch::NewStub(*channel);
  const bool clear = !f.once && isatty(STDOUT_FILENO);
  while (!StopRequested()) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::ListJobsResponse jobs;
    const grpc::Status status = stub->ListJobs(&ctx, v1::ListJobsRequest(), &jobs);
    if (!status.ok()) {
      std::fprintf(stderr, "rankwatch top: %s\n", Explain(status, f.client).c_str());
      return 1;
    }
    Draw(jobs, f.client.server, clear);
    if (f.once) return 0;
    const auto until = std::chrono::steady_clock::now() +
                       std::chrono::milliseconds(static_cast<int64_t>(f.interval_s * 1000));
    while (!StopRequested() && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  return 0;
}

}  // namespace

CommandRunner AddTopCommand(CLI::App& app) {
  auto f = std::make_shared<TopFlags>();
  CLI::App* cmd = app.add_subcommand("top", "live view of every job rankwatchd diagnoses");
  AddGrpcClientFlags(cmd, &f->client);
  cmd->add_option("--interval", f->interval_s, "seconds between refreshes")
      ->capture_default_str()
      ->check(CLI::Range(0.1, 3600.0));
  cmd->add_flag("--once", f->once, "print one frame and exit");
  return [cmd, f]() -> int { return cmd->parsed() ? RunTop(*f) : -1; };
}

}  // namespace rankwatch
