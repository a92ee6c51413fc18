// `rankwatch analyze PATH... [--compat hta] [--format text|json|csv] [--out DIR]`: the GPU
// timeline analyses of docs/spec/kernel-analysis.md on Kineto trace files, offline, with the same
// operators the daemon runs live. Text: a readable report per rank (and per step in the
// corrected mode); csv: one file per analysis, as HTA's data frames; json: the per-rank numbers.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <string>

#include "cli/analyze_csv.h"
#include "cli/commands.h"
#include "operators/kernel/kernel_report.h"
#include "operators/kernel/straggler_heuristic.h"
#include "operators/kernel/timeline_builder.h"
#include "traces/kineto_trace_reader.h"

namespace rankwatch {
namespace {

struct AnalyzeFlags {
  std::vector<std::string> paths;
  std::string compat;  // "" or "hta"
  std::string format = "text";
  std::string out;
  size_t straggler_candidates = 2;
  bool quiet = false;
};

kernel::RankTrace ToRankTrace(KinetoTrace&& t, bool hta) {
  kernel::RankTrace r;
  r.rank = hta ? t.hta_rank.value_or(0) : t.rank();
  r.strings = std::move(t.strings);
  r.ts_is_float = t.ts_is_float;
  r.backend = std::move(t.backend);
  r.events.reserve(t.events.size());
  for (const KinetoEvent& e : t.events) {
    r.events.push_back({e.ts_ns, e.dur_ns, e.stream, e.correlation, e.bytes, e.memory_bw_gbps,
                        e.name, e.category, e.index});
  }
  t.events = {};
  return r;
}

double Pct(int64_t part, int64_t whole) { return whole > 0 ? 100.0 * part / whole : NAN; }

void PrintRank(const kernel::RankKernelReport& r) {
  const auto& t = r.temporal;
  std::printf("rank %u: %llu GPU ops over %.3f ms\n", r.rank,
              static_cast<unsigned long long>(r.gpu_ops), t.kernel_ns / 1e6);
  std::printf("  GPU time      compute %.2f%%   non-compute %.2f%%   idle %.2f%%\n",
              Pct(t.compute_ns, t.kernel_ns), Pct(t.non_compute_ns, t.kernel_ns),
              Pct(t.idle_ns, t.kernel_ns));
  std::printf("  comm/comp     %.2f%% of %.3f ms communication overlaps computation\n",
              100 * r.overlap.ratio(), r.overlap.comm_ns / 1e6);
  int64_t total = 0;
  for (const auto& [label, ns] : r.kernel_type_ns) total += ns;
  for (const auto& [label, ns] : r.kernel_type_ns) {
    if (ns > 0)
      std::printf("  kernel time   %-58s %9.3f ms %5.1f%%\n", label.c_str(), ns / 1e6,
                  Pct(ns, total));
  }
  std::printf("  idle by stream (host wait / kernel wait / other, ms):\n");
  std::map<int64_t, std::array<double, 3>> idle;
  std::vector<int64_t> order;
  for (const auto& row : r.idle) {
    if (!idle.contains(row.stream)) order.push_back(row.stream);
    idle[row.stream][static_cast<int>(row.category)] = row.idle_us / 1e3;
  }
  for (int64_t s : order) {
    std::printf("    stream %-6lld %10.3f %10.3f %10.3f\n", static_cast<long long>(s), idle[s][0],
                idle[s][1], idle[s][2]);
  }
  const auto& l = r.launch_summary;
  std::printf(
      "  launches      %llu: %llu short kernels, %llu runtime outliers, %llu launch-delay "
      "outliers; "
      "delay p50 %.1f us, max %.1f us\n",
      static_cast<unsigned long long>(l.launches), static_cast<unsigned long long>(l.short_kernels),
      static_cast<unsigned long long>(l.runtime_outliers),
      static_cast<unsigned long long>(l.launch_delay_outliers), l.delay_p50_us, l.delay_max_us);
  for (const auto& q : r.queue) {
    std::printf("  queue         stream %-6lld mean %.1f, max %.0f, blocked %.3f ms\n",
                static_cast<long long>(q.stream), q.queue_length.mean, q.queue_length.max,
                q.blocked_us / 1e3);
  }
  for (const auto& m : r.memory) {
    std::printf("  memory bw     %-15s mean %.2f GB/s, max %.2f GB/s (%0.f samples)\n",
                m.kind.c_str(), m.gbps.mean, m.gbps.max, m.gbps.count);
  }
  std::vector<const kernel::KernelStatRow*> top;
  for (const auto& k : r.kernels_all) top.push_back(&k);
  std::sort(top.begin(), top.end(), [](auto* a, auto* b) { return a->sum_us > b->sum_us; });
  for (size_t i = 0; i < top.size() && i < 5; ++i) {
    std::printf("  top kernel    %9.3f ms  %-13s %.90s\n", top[i]->sum_us / 1e3,
                std::string(kernel::KernelTypeName(top[i]->type)).c_str(), top[i]->name.c_str());
  }
}

void PrintSteps(const std::vector<kernel::RankKernelReport>& steps) {
  if (steps.empty()) return;
  std::printf(
      "\nper step:  rank     step   span ms  compute%%  non-comp%%   idle%%  comm ms  overlap%%  "
      "delay outliers\n");
  for (const auto& r : steps) {
    const auto& t = r.temporal;
    std::printf("          %5u %8lld %9.3f %9.2f %10.2f %7.2f %8.3f %9.2f %15llu\n", r.rank,
                static_cast<long long>(r.step), t.kernel_ns / 1e6, Pct(t.compute_ns, t.kernel_ns),
                Pct(t.non_compute_ns, t.kernel_ns), Pct(t.idle_ns, t.kernel_ns),
                r.overlap.comm_ns / 1e6, 100 * r.overlap.ratio(),
                static_cast<unsigned long long>(r.launch_summary.launch_delay_outliers));
  }
}

std::string JsonNumber(double x) { return std::isfinite(x) ? PyFloat(x) : "null"; }

void PrintJson(const std::vector<kernel::RankKernelReport>& ranks,
               const std::vector<kernel::RankKernelReport>& steps,
               const std::vector<uint32_t>& stragglers) {
  auto one = [](const kernel::RankKernelReport& r) {
    const auto& t = r.temporal;
    std::string s =
        "{\"rank\": " + std::to_string(r.rank) + ", \"step\": " + std::to_string(r.step) +
        ", \"gpu_ops\": " + std::to_string(r.gpu_ops) +
        ", \"kernel_time_us\": " + JsonNumber(t.kernel_ns / 1e3) +
        ", \"idle_time_us\": " + JsonNumber(t.idle_ns / 1e3) +
        ", \"compute_time_us\": " + JsonNumber(t.compute_ns / 1e3) +
        ", \"non_compute_time_us\": " + JsonNumber(t.non_compute_ns / 1e3) +
        ", \"comm_time_us\": " + JsonNumber(r.overlap.comm_ns / 1e3) +
        ", \"comm_comp_overlap_ratio\": " + JsonNumber(r.overlap.ratio()) +
        ", \"launches\": " + std::to_string(r.launch_summary.launches) +
        ", \"short_kernels\": " + std::to_string(r.launch_summary.short_kernels) +
        ", \"runtime_outliers\": " + std::to_string(r.launch_summary.runtime_outliers) +
        ", \"launch_delay_outliers\": " + std::to_string(r.launch_summary.launch_delay_outliers) +
        ", \"idle\": {";
    double by_cat[3] = {0, 0, 0};
    for (const auto& row : r.idle) by_cat[static_cast<int>(row.category)] += row.idle_us;
    s += "\"host_wait_us\": " + JsonNumber(by_cat[0]) +
         ", \"kernel_wait_us\": " + JsonNumber(by_cat[1]) +
         ", \"other_us\": " + JsonNumber(by_cat[2]) + "}}";
    return s;
  };
  std::printf("{\"ranks\": [");
  for (size_t i = 0; i < ranks.size(); ++i)
    std::printf("%s%s", i ? ", " : "", one(ranks[i]).c_str());
  std::printf("],\n \"steps\": [");
  for (size_t i = 0; i < steps.size(); ++i)
    std::printf("%s\n  %s", i ? "," : "", one(steps[i]).c_str());
  std::printf("],\n \"potential_stragglers\": [");
  for (size_t i = 0; i < stragglers.size(); ++i) std::printf("%s%u", i ? ", " : "", stragglers[i]);
  std::printf("]}\n");
}

int RunAnalyze(const AnalyzeFlags& f) {
  const bool hta = f.compat == "hta";
  auto files = FindKinetoTraces(f.paths);
  if (!files.ok()) {
    std::fprintf(stderr, "rankwatch analyze: %s\n", std::string(files.status().message()).c_str());
    return 1;
  }
  std::vector<kernel::RankTrace> traces;
  std::map<uint32_t, size_t> slot;  // rank -> position; a later file of the same rank wins (HTA)
  uint64_t bytes = 0;
  for (size_t i = 0; i < files->size(); ++i) {
    auto t = ReadKinetoTrace((*files)[i]);
    if (!t.ok()) {
      std::fprintf(stderr, "rankwatch analyze: %s\n", std::string(t.status().message()).c_str());
      return 1;
    }
    bytes += t->decompressed_bytes;
    if (!f.quiet && (files->size() > 1 || t->decompressed_bytes > (64u << 20))) {
      std::fprintf(stderr, "analyze: [%zu/%zu] %s: rank %u, %llu events, %.1f MB\n", i + 1,
                   files->size(), (*files)[i].c_str(), hta ? t->hta_rank.value_or(0) : t->rank(),
                   static_cast<unsigned long long>(t->raw_events), t->decompressed_bytes / 1e6);
    }
    kernel::RankTrace r = ToRankTrace(std::move(*t), hta);
    if (auto it = slot.find(r.rank); it != slot.end()) {
      std::fprintf(stderr, "analyze: warning: two files for rank %u; %s wins\n", r.rank,
                   (*files)[i].c_str());
      traces[it->second] = std::move(r);
    } else {
      slot[r.rank] = traces.size();
      traces.push_back(std::move(r));
    }
  }
  kernel::TimelineOptions topt;
  topt.mode = hta ? kernel::AnalysisMode::kHtaCompat : kernel::AnalysisMode::kCorrected;
  topt.per_step = f.format != "csv";
  const kernel::JobTimelines job = kernel::BuildTimelines(traces, topt);
  for (const std::string& w : job.warnings)
    std::fprintf(stderr, "analyze: warning: %s\n", w.c_str());

  kernel::KernelAnalysisOptions aopt;
  aopt.mode = topt.mode;
  std::vector<kernel::RankKernelReport> reports, step_reports;
  for (const auto& t : job.ranks) reports.push_back(kernel::AnalyzeRank(t, aopt));
  aopt.keep_launch_rows = false;
  for (const auto& t : job.steps) step_reports.push_back(kernel::AnalyzeRank(t, aopt));
  const auto stragglers = kernel::FindPotentialStragglers(
      job.ranks, job.profiler_steps, {.num_candidates = f.straggler_candidates, .hta_compat = hta});

  if (f.format == "csv") {
    AnalyzeCsvInput in{&job, std::move(reports), stragglers};
    if (auto s = WriteAnalyzeCsv(in, f.out.empty() ? "." : f.out); !s.ok()) {
      std::fprintf(stderr, "rankwatch analyze: %s\n", std::string(s.message()).c_str());
      return 1;
    }
    return 0;
  }
  if (f.format == "json") {
    PrintJson(reports, step_reports, stragglers);
    return 0;
  }
  std::printf("%zu trace file(s), %zu rank(s), %.1f MB of JSON, mode %s\n\n", files->size(),
              traces.size(), bytes / 1e6,
              hta ? "hta (HTA-compatible: last step dropped)" : "corrected");
  for (const auto& r : reports) {
    PrintRank(r);
    std::printf("\n");
  }
  PrintSteps(step_reports);
  if (!stragglers.empty()) {
    std::printf("\npotential stragglers (HTA heuristic):");
    for (uint32_t r : stragglers) std::printf(" rank %u", r);
    std::printf("\n");
  }
  return 0;
}

}  // namespace

CommandRunner AddAnalyzeCommand(CLI::App& app) {
  auto f = std::make_shared<AnalyzeFlags>();
  CLI::App* cmd =
      app.add_subcommand("analyze", "GPU timeline analyses (HTA's) of Kineto trace files");
  cmd->add_option("paths", f->paths, "trace files or directories (searched for *.json, *.json.gz)")
      ->required();
  cmd->add_option("--compat", f->compat, "hta: reproduce HTA's numbers, quirks included")
      ->check(CLI::IsMember({"hta"}));
  cmd->add_option("--format", f->format, "text, json or csv")
      ->capture_default_str()
      ->check(CLI::IsMember({"text", "json", "csv"}));
  cmd->add_option("--out", f->out, "directory for --format csv (default: current directory)");
  cmd->add_option("--straggler-candidates", f->straggler_candidates,
                  "ranks the straggler heuristic names")
      ->capture_default_str();
  cmd->add_flag("--quiet", f->quiet, "no progress lines on stderr");
  return [cmd, f]() -> int { return cmd->parsed() ? RunAnalyze(*f) : -1; };
}

}  // namespace rankwatch
