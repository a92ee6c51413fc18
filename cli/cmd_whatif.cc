// `rankwatch whatif [--json] PATH`: the what-if analysis of a pipeline job's per-op Chrome trace
// (the OSDI'25 study's timeline-*.json[.gz] with its meta-*.yaml), offline: the same analyzer
// and verdict the daemon runs live (operators/whatif/), over every step of the trace.
#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "operators/whatif/verdict.h"
#include "operators/whatif/whatif.h"
#include "traces/whatif_chrome_trace.h"

namespace rankwatch {
namespace {

struct WhatifFlags {
  std::string path;
  bool json = false;
};

std::string JsonList(const std::vector<double>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) out += fmt::format("{}{:.6f}", i ? ", " : "", v[i]);
  return out + "]";
}

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) {
      out += fmt::format("\\u{:04x}", c);
      continue;
    }
    out += c;
  }
  return out + "\"";
}

int RunWhatif(const WhatifFlags& f) {
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  auto trace = ReadWhatifChromeTrace(f.path);
  if (!trace.ok()) {
    std::fprintf(stderr, "rankwatch whatif: %s\n", std::string(trace.status().message()).c_str());
    return 2;
  }
  const auto t1 = Clock::now();
  const whatif::Layout& l = trace->layout;
  whatif::Options options;
  options.window_steps = static_cast<uint32_t>(std::max<size_t>(1, trace->steps.size()));
  whatif::Analyzer analyzer(l, options);
  whatif::OpStats stats(l, options.window_steps);
  for (const whatif::StepOps& step : trace->steps) {
    if (absl::Status s = analyzer.AddStep(step); !s.ok()) {
      std::fprintf(stderr, "rankwatch whatif: %s\n", std::string(s.message()).c_str());
      return 2;
    }
    stats.Add(step);
  }
  const whatif::WindowResult r = analyzer.Window();
  std::vector<std::vector<uint32_t>> worker_ranks(l.workers());
  for (uint32_t w = 0; w < l.workers(); ++w) {
    for (uint32_t t = 0; t < l.tp; ++t) worker_ranks[w].push_back(w * l.tp + t);
  }
  whatif::VerdictOptions vo;
  const whatif::WhatIfVerdict v = whatif::JudgeWhatIf(r, l, worker_ranks, stats, vo);
  const auto t2 = Clock::now();
  const double parse_s = std::chrono::duration<double>(t1 - t0).count();
  const double analysis_s = std::chrono::duration<double>(t2 - t1).count();
  const whatif::Decomposition& d = r.decomposition;
  if (f.json) {
    std::string groups = "{";
    for (size_t i = 0; i < d.by_op_group.size(); ++i) {
      groups += fmt::format("{}{}: {:.6f}", i ? ", " : "", JsonString(d.by_op_group[i].first),
                            d.by_op_group[i].second);
    }
    groups += "}";
    std::printf(
        "{\"trace\": %s, \"dp\": %u, \"pp\": %u, \"tp\": %u, \"steps\": %u, \"slowdown\": %.6f, "
        "\"measured_ms\": %.3f, \"actual_ms\": %.3f, \"ideal_ms\": %.3f, \"by_dp_rank\": %s, "
        "\"by_stage\": %s, \"by_op_group\": %s, \"m_w\": %.6f, \"m_s\": %.6f, \"m_s_stage\": %u, "
        "\"m_s_worst\": %.6f, \"verdict\": \"%s\", \"culprit_data_rank\": %d, "
        "\"culprit_stage\": %d, \"note\": %s, \"next_step\": %s, \"parse_seconds\": %.6f, "
        "\"analysis_seconds\": %.6f}\n",
        JsonString(trace->file.string()).c_str(), l.dp, l.pp, l.tp, r.steps, r.slowdown,
        r.measured_us / 1e3, r.actual_us / 1e3, r.ideal_us / 1e3, JsonList(d.by_dp_rank).c_str(),
        JsonList(d.by_stage).c_str(), groups.c_str(), r.m_w, r.m_s_last, r.m_s_stage, r.m_s,
        std::string(whatif::VerdictName(v.verdict)).c_str(), v.data_rank, v.stage,
        JsonString(v.note).c_str(), JsonString(v.next_step).c_str(), parse_s, analysis_s);
    return 0;
  }
  std::printf("%s: DP %u x PP %u x TP %u, %u steps (read in %.2f s, analysed in %.3f s)\n",
              trace->file.string().c_str(), l.dp, l.pp, l.tp, r.steps, parse_s, analysis_s);
  std::printf("verdict   %s\n          %s\n          next: %s\n",
              std::string(whatif::VerdictName(v.verdict)).c_str(), v.note.c_str(),
              v.next_step.c_str());
  std::printf("S         %.4f   (step: measured %.2f ms, simulated %.2f ms, ideal %.2f ms)\n",
              r.slowdown, r.measured_us / 1e3, r.actual_us / 1e3, r.ideal_us / 1e3);
  std::printf("M_W       %.4f   M_S %.4f (the last stage; the worst stage, %u: %.4f)\n", r.m_w,
              r.m_s_last, r.m_s_stage, r.m_s);
  std::printf("by DP     ");
  for (size_t i = 0; i < d.by_dp_rank.size(); ++i) std::printf(" %zu:%.4f", i, d.by_dp_rank[i]);
  std::printf("\nby stage  ");
  for (size_t i = 0; i < d.by_stage.size(); ++i) std::printf(" %zu:%.4f", i, d.by_stage[i]);
  std::printf("\nby op     ");
  for (const auto& [name, x] : d.by_op_group) std::printf(" %s:%.4f", name.c_str(), x);
  std::printf("\n");
  return 0;
}

}  // namespace

CommandRunner AddWhatifCommand(CLI::App& app) {
  auto f = std::make_shared<WhatifFlags>();
  CLI::App* cmd = app.add_subcommand(
      "whatif",
      "what-if analysis of a pipeline job's per-op Chrome trace, offline (docs/whatif.md)");
  cmd->add_flag("--json", f->json, "print one JSON object");
  cmd->add_option("path", f->path, "a timeline-*.json[.gz] trace or its folder (with meta-*.yaml)")
      ->required();
  return [cmd, f]() -> int { return cmd->parsed() ? RunWhatif(*f) : -1; };
}

}  // namespace rankwatch
