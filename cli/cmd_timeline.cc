// `rankwatch timeline`: writes a job's aligned steps as a Chrome/Perfetto trace, one process
// per node (or one for the job), one thread per rank, phases as slices, alerts and captures as
// instant events (serving/timeline.h says how the phases are laid out).
//
//   rankwatch timeline --server S --job J [--steps A-B] [--group-by node|rank] -o FILE
#include <chrono>
#include <cstdio>
#include <fstream>
#include <set>
#include <string>

#include "cli/commands.h"
#include "cli/grpc_client.h"
#include "rankwatch/v1/service.grpc.pb.h"
#include "serving/timeline.h"

namespace rankwatch {
namespace {

struct TimelineFlags {
  GrpcClientFlags client;
  std::string job;
  std::string steps;  // "A-B", "A-", "A"
  std::string group_by = "node";
  uint32_t max_rank_steps = kDefaultTimelineRankSteps;
  std::string out;
};

int Fail(const std::string& message, int code) {
  std::fprintf(stderr, "rankwatch timeline: %s\n", message.c_str());
  return code;
}

// "A-B", "A-" (from A on) or "A" (that step) into `request`: false when it is none of them.
bool ParseSteps(const std::string& text, v1::GetTimelineRequest* request) {
  if (text.empty()) return true;
  try {
    size_t used = 0;
    const size_t dash = text.find('-');
    const std::string a = text.substr(0, dash);
    request->set_first_step(std::stoull(a, &used));
    if (used != a.size()) return false;
    if (dash == std::string::npos) {
      request->set_last_step(request->first_step());
    } else if (dash + 1 < text.size()) {
      const std::string b = text.substr(dash + 1);
      request->set_last_step(std::stoull(b, &used));
      if (used != b.size()) return false;
    }
  } catch (const std::exception&) {
    return false;
  }
  return true;
}

int Run(const TimelineFlags& f) {
  v1::GetTimelineRequest request;
  request.set_training_job(f.job);
  request.set_max_rank_steps(f.max_rank_steps);
  if (!ParseSteps(f.steps, &request)) {
    return Fail("--steps " + f.steps + ": expected A-B, A- or A (step numbers)", 2);
  }
  if (request.has_last_step() && request.first_step() > request.last_step()) {
    return Fail("--steps " + f.steps + ": the first step is after the last", 2);
  }
  auto channel = OpenChannel(f.client);
  if (!channel.ok()) return Fail(std::string(channel.status().message()), 2);
  auto stub = v1::RankWatch::NewStub(*channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  v1::Timeline t;
  if (grpc::Status s = stub->GetTimeline(&ctx, request, &t); !s.ok()) {
    return Fail(Explain(s, f.client), 1);
  }
  if (t.steps_size() == 0) {
    return Fail("no stored steps of job '" + t.training_job() + "'" +
                    (f.steps.empty() ? "" : " in " + f.steps) +
                    (t.stored_last_step() > 0
                         ? "; the daemon holds steps " + std::to_string(t.stored_first_step()) +
                               "-" + std::to_string(t.stored_last_step())
                         : "; none are stored yet"),
                1);
  }
  const TimelineGrouping grouping =
      f.group_by == "rank" ? TimelineGrouping::kRank : TimelineGrouping::kNode;
  const std::string trace = TimelineChromeTrace(t, grouping);
  {
    std::ofstream out(f.out, std::ios::binary);
    out << trace;
    out.close();
    if (!out) return Fail("cannot write " + f.out, 1);
  }
  std::set<uint32_t> ranks;
  for (const v1::TimelineStep& s : t.steps()) {
    for (const v1::TimelineRankStep& r : s.ranks()) ranks.insert(r.rank());
  }
  std::set<std::string> nodes;
  for (uint32_t r : ranks) {
    if (r < static_cast<uint32_t>(t.rank_nodes_size()) && !t.rank_nodes(r).empty()) {
      nodes.insert(t.rank_nodes(r));
    }
  }
  std::printf(
      "wrote %s: job %s, steps %llu-%llu (%d steps, %zu ranks on %zu nodes), %d alert events, "
      "%d captures, %.1f MB\n",
      f.out.c_str(), t.training_job().c_str(), static_cast<unsigned long long>(t.steps(0).step()),
      static_cast<unsigned long long>(t.steps(t.steps_size() - 1).step()), t.steps_size(),
      ranks.size(), nodes.size(), t.alerts_size(), t.captures_size(), trace.size() / 1e6);
  if (t.truncated()) {
    std::printf(
        "  older steps of the range left out to stay under %u rank-steps (--max-rank-steps); "
        "the daemon holds steps %llu-%llu\n",
        f.max_rank_steps, static_cast<unsigned long long>(t.stored_first_step()),
        static_cast<unsigned long long>(t.stored_last_step()));
  }
  std::printf("  open it in https://ui.perfetto.dev or chrome://tracing\n");
  return 0;
}

}  // namespace

CommandRunner AddTimelineCommand(CLI::App& app) {
  auto f = std::make_shared<TimelineFlags>();
  CLI::App* cmd = app.add_subcommand(
      "timeline",
      "write a job's aligned steps as a Chrome/Perfetto trace: a track per rank, grouped by "
      "node, phases as slices, alerts and captures as instant events");
  AddGrpcClientFlags(cmd, &f->client);
  cmd->add_option("--job", f->job, "training job")->required();
  cmd->add_option("--steps", f->steps,
                  "steps A-B, A- or A (default: the job's step window; the daemon holds the "
                  "steps its windows need)");
  cmd->add_option("--group-by", f->group_by, "one process per node, or one for the job")
      ->check(CLI::IsMember({"node", "rank"}))
      ->capture_default_str();
  cmd->add_option("--max-rank-steps", f->max_rank_steps,
                  "at most this many ranks x steps; the newest steps are kept")
      ->check(CLI::Range(1u, kMaxTimelineRankSteps))
      ->capture_default_str();
  cmd->add_option("-o,--out", f->out, "trace file to write (JSON)")->required();
  return [cmd, f]() -> int {
    if (!cmd->parsed()) return -1;
    return Run(*f);
  };
}

}  // namespace rankwatch
