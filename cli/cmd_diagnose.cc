// `rankwatch diagnose --server ADDR --job J [--json]`: asks rankwatchd for a job's diagnosis
// and prints it the way the TraceML CLI reads: the diagnosis first, then the evidence table.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "cli/diagnose_flight_recorder.h"
#include "cli/grpc_client.h"
#include "common/rank_ranges.h"
#include "rankwatch/v1/service.grpc.pb.h"

namespace rankwatch {
namespace {

struct DiagnoseFlags {
  std::string server = "127.0.0.1:7466";
  std::string job;
  bool json = false;
  double timeout_s = 10;
};

// "STEP_COMPUTE_STRAGGLER" -> "COMPUTE STRAGGLER"
std::string Words(const std::string& enum_name, const std::string& prefix) {
  std::string s = enum_name.rfind(prefix, 0) == 0 ? enum_name.substr(prefix.size()) : enum_name;
  for (char& c : s) {
    if (c == '_') c = ' ';
  }
  return s;
}

std::string SeverityWord(v1::Severity s) { return Words(v1::Severity_Name(s), "SEVERITY_"); }

std::string PhaseWord(v1::Phase p) {
  std::string s = Words(v1::Phase_Name(p), "PHASE_");
  for (char& c : s) c = static_cast<char>(std::tolower(c));
  if (s == "forward backward") s = "fwd+bwd";
  return s;
}

std::string CauseWord(v1::StragglerCause c) {
  switch (c) {
    case v1::CAUSE_INPUT: return "input (dataloader)";
    case v1::CAUSE_COMPUTE: return "compute (forward, backward, optimizer)";
    case v1::CAUSE_BOTH: return "input and compute";
    case v1::CAUSE_OUTSIDE: return "time outside the measured phases";
    case v1::CAUSE_GC: return "garbage-collection pauses";
    default: return "unattributed";
  }
}

// "3.1 rank-hours", "12 rank-minutes", "40 rank-seconds".
std::string RankTime(double seconds) {
  char buf[64];
  if (seconds >= 3600) {
    std::snprintf(buf, sizeof(buf), "%.1f rank-hours", seconds / 3600);
  } else if (seconds >= 60) {
    std::snprintf(buf, sizeof(buf), "%.1f rank-minutes", seconds / 60);
  } else {
    std::snprintf(buf, sizeof(buf), "%.1f rank-seconds", seconds);
  }
  return buf;
}

std::string Percent(double part, double whole) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f%%", whole > 0 ? part / whole * 100 : 0.0);
  return buf;
}

// "1,200"
std::string Grouped(uint64_t n) {
  std::string digits = std::to_string(n), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

// "device (1,200 rank-steps), 4 with device times missing", "host (800 rank-steps)",
// "mixed (600 of 1,200 rank-steps on the device)".
std::string TimingLine(const v1::TimingEvidence& t) {
  const uint64_t all = t.device_steps() + t.host_steps();
  std::string out = t.clock() + " (";
  if (t.clock() == "mixed") {
    out += Grouped(t.device_steps()) + " of " + Grouped(all) + " rank-steps on the device)";
  } else {
    out += Grouped(all) + " rank-steps)";
  }
  if (t.device_missing_steps() > 0) {
    out += ", " + Grouped(t.device_missing_steps()) + " with device times missing";
  }
  return out;
}

// "rank 42 — pod trainer-worker-5 on node gpu-17", "rank 42 on node gpu-17", "rank 42".
std::string RankWhere(uint32_t rank, const std::string& pod, const std::string& node) {
  std::string out = "rank " + std::to_string(rank);
  if (!pod.empty()) out += " \u2014 pod " + pod;
  if (!node.empty()) out += " on node " + node;
  return out;
}

void PrintLostTime(const v1::LostTime& l) {
  if (l.total_rank_seconds() <= 0) return;
  std::printf(
      "\nLOST TIME  stragglers %s (%s of the job's time) since start, %s (%s) over the "
      "window",
      RankTime(l.total_straggler_rank_seconds()).c_str(),
      Percent(l.total_straggler_rank_seconds(), l.total_rank_seconds()).c_str(),
      RankTime(l.window_straggler_rank_seconds()).c_str(),
      Percent(l.window_straggler_rank_seconds(), l.window_rank_seconds()).c_str());
  if (l.total_hang_rank_seconds() > 0) {
    std::printf("; hangs %s (%s)", RankTime(l.total_hang_rank_seconds()).c_str(),
                Percent(l.total_hang_rank_seconds(), l.total_rank_seconds()).c_str());
  }
  std::printf("\n");
  for (const v1::RankCost& c : l.top()) {
    std::printf(
        "           %s cost %s, %s of the job's time, since start (%s over the "
        "window)\n",
        RankWhere(c.rank(), c.pod(), c.node()).c_str(), RankTime(c.total_rank_seconds()).c_str(),
        Percent(c.total_rank_seconds(), l.total_rank_seconds()).c_str(),
        Percent(c.window_rank_seconds(), l.window_rank_seconds()).c_str());
  }
}

// The newest capture's comparison: what the culprit does that the typical rank does not.
void PrintCapture(const v1::Capture& c) {
  if (c.id().empty()) return;
  std::printf("\nCAPTURE    %s: rank %d against rank %d, %u steps each (%s)\n", c.id().c_str(),
              c.culprit_rank(), c.reference_rank(), c.steps(), c.requested_by().c_str());
  int shown = 0;
  for (const v1::CaptureOp& op : c.comparison()) {
    if (shown == 3 || op.excess_seconds_per_step() <= 0) break;
    std::printf(
        "           %s in %s: %+.1f ms a step (%.1f ms on the culprit, %.1f ms on the "
        "reference)\n",
        op.name().c_str(), op.phase().c_str(), op.excess_seconds_per_step() * 1e3,
        op.culprit_seconds_per_step() * 1e3, op.reference_seconds_per_step() * 1e3);
    ++shown;
  }
  std::printf("           all operators: rankwatch capture show %s\n", c.id().c_str());
}

// Where each rank of a hung job is: its training thread's stack, grouped, culprits first.
void PrintHangStacks(const v1::HangStacks& h) {
  if (h.request_id().empty()) return;
  std::printf("\nSTACKS     %u of %u ranks answered%s (%s)\n", h.ranks_answered(), h.ranks_asked(),
              h.settled_unix_ns() == 0 ? " so far" : "", h.request_id().c_str());
  std::printf("           %s\n", h.summary().c_str());
  constexpr int kFrames = 8;  // innermost frames shown a group
  for (const v1::StackGroup& g : h.groups()) {
    std::printf("           %s %s:\n", g.ranks_size() == 1 ? "rank" : "ranks",
                FormatRankRanges(g.ranks()).c_str());
    const int first = std::max(0, g.frames_size() - kFrames);
    if (first > 0 || g.frames_omitted() > 0) {
      std::printf("             ... %u outer frames\n",
                  static_cast<unsigned>(first) + g.frames_omitted());
    }
    for (int i = first; i < g.frames_size(); ++i) {
      const v1::StackFrame& f = g.frames(i);
      std::printf("             %s:%u in %s\n", f.file().c_str(), f.line(), f.function().c_str());
    }
  }
  for (const v1::CollectiveProgress& p : h.collectives()) {
    std::printf("           collectives on group %s:", p.group().c_str());
    if (p.behind_ranks_size() == 0) std::printf(" every rank entered as many;");
    if (p.behind_ranks_size() > 0) {
      std::printf(" behind (never entered the last one): %s;",
                  FormatRankRanges(p.behind_ranks()).c_str());
    }
    if (p.waiting_ranks_size() > 0) {
      std::printf(" waiting in one: %s", FormatRankRanges(p.waiting_ranks()).c_str());
    }
    std::printf("\n");
  }
}

void PrintStep(const v1::StepDiagnosis& d) {
  std::printf("STEP TIME  %s (%s)\n",
              Words(v1::StepDiagnosisLabel_Name(d.label()), "STEP_").c_str(),
              SeverityWord(d.severity()).c_str());
  std::printf("           %s\n", d.note().c_str());
  std::printf("           next: %s\n", d.next_step().c_str());
  std::printf(
      "           scores: input %.2f, compute %.2f, own %.2f   shares: input %.0f%%, wait %.0f%%, "
      "compute %.0f%%\n",
      d.scores().input(), d.scores().compute(), d.scores().own(), d.shares().input() * 100,
      d.shares().wait() * 100, d.shares().compute() * 100);
  if (d.culprit_ranks_size() > 0) {
    std::string culprits;
    constexpr int kShown = 8;
    for (int i = 0; i < d.culprit_ranks_size() && i < kShown; ++i) {
      const std::string pod = i < d.culprit_pods_size() ? d.culprit_pods(i) : "";
      culprits += (i > 0 ? ", " : "") + RankWhere(d.culprit_ranks(i), pod, d.culprit_node());
    }
    if (d.culprit_ranks_size() > kShown) {
      culprits += " and " + std::to_string(d.culprit_ranks_size() - kShown) + " more";
    }
    std::printf("           culprit: %s\n", culprits.c_str());
  }
  if (d.cause() != v1::CAUSE_UNSPECIFIED) {
    std::printf("           cause: %s\n", CauseWord(d.cause()).c_str());
  }
  for (const v1::MissingSignal& m : d.missing()) {
    std::printf("           missing: %s on %u of %u ranks\n", PhaseWord(m.phase()).c_str(),
                m.ranks() - m.ranks_reporting(), m.ranks());
  }
  if (d.has_gc()) {
    const v1::GcEvidence& gc = d.gc();
    std::printf(
        "           gc: rank %u pauses %.1f ms a step (%.1f collections); the median rank %.1f ms "
        "(%.1f); %u ranks report GC\n",
        gc.rank(), gc.seconds() * 1e3, gc.collections(), gc.median_seconds() * 1e3,
        gc.median_collections(), gc.ranks_reporting());
  }
  if (d.has_straggler()) {
    const v1::StragglerEvidence& t = d.straggler();
    std::printf(
        "           test: rank %u %.1f ms a step above the median rank (z %.1f over the newest "
        "%u steps); %s since step %llu%s; %.2f rank-s lost a step\n",
        t.rank(), t.excess_seconds() * 1e3, t.z(), t.steps(), t.pattern().c_str(),
        static_cast<unsigned long long>(t.since_step()), t.onset_in_window() ? "" : " or earlier",
        t.lost_rank_seconds_per_step());
  }
  if (d.has_timing()) std::printf("           timing  %s\n", TimingLine(d.timing()).c_str());
  if (d.sharded()) std::printf("           sharded job (forward waits for other ranks too)\n");
  if (d.phases_size() == 0) return;
  std::printf("\n  %-12s", "");
  for (const v1::PhaseStats& p : d.phases()) std::printf("%12s", PhaseWord(p.phase()).c_str());
  std::printf("\n  %-12s", "median ms");
  for (const v1::PhaseStats& p : d.phases()) std::printf("%12.2f", p.median_seconds() * 1e3);
  std::printf("\n  %-12s", "worst ms");
  for (const v1::PhaseStats& p : d.phases()) std::printf("%12.2f", p.worst_seconds() * 1e3);
  std::printf("\n  %-12s", "worst rank");
  for (const v1::PhaseStats& p : d.phases()) std::printf("%12u", p.worst_rank());
  std::printf("\n  %-12s", "skew");
  for (const v1::PhaseStats& p : d.phases()) std::printf("%11.1f%%", p.skew() * 100);
  std::printf("\n");
}

void PrintMemory(const v1::MemoryDiagnosis& m) {
  std::printf("\nMEMORY     %s (%s)\n",
              Words(v1::MemoryDiagnosisLabel_Name(m.label()), "MEMORY_").c_str(),
              SeverityWord(m.severity()).c_str());
  std::printf("           %s\n", m.note().c_str());
  std::printf("           next: %s\n", m.next_step().c_str());
  constexpr double kGiB = 1024.0 * 1024 * 1024;
  auto line = [&](const char* kind, const v1::MemoryStats& s) {
    std::printf("           %-9s median %.1f GiB, worst %.1f GiB (rank %u), skew %.1f%%\n", kind,
                s.median_peak_bytes() / kGiB, s.worst_peak_bytes() / kGiB, s.worst_rank(),
                s.skew() * 100);
  };
  if (m.has_allocated()) line("allocated", m.allocated());
  if (m.has_reserved()) line("reserved", m.reserved());
  if (m.device_capacity_bytes() > 0) {
    std::printf("           device %.0f GiB, pressure %.0f%%\n", m.device_capacity_bytes() / kGiB,
                m.pressure() * 100);
  }
  // Memory per rank: whose creep, and the ranks whose memory grew most.
  if (m.has_creep_rank()) std::printf("           creep on rank %u\n", m.creep_rank());
  if (m.creep_all_ranks()) std::printf("           creep on every rank\n");
  for (const v1::RankMemoryTrend& t : m.rank_trends()) {
    std::string full;
    if (t.has_projected_steps_to_full()) {
      full = ", full in ~" + std::to_string(t.projected_steps_to_full()) + " steps";
    }
    std::printf("           rank %-5u %-12s %+.2f MiB/step, %+.0f%% over %llu steps%s%s\n",
                t.rank(), t.node().c_str(), t.bytes_per_step() / (1024 * 1024), t.growth() * 100,
                static_cast<unsigned long long>(t.steps()), t.steady() ? ", steady" : "",
                full.c_str());
  }
}

// A pipeline job's what-if: the verdict, S, and the stage x data-parallel replica grid.
void PrintWhatIf(const v1::WhatIf& w) {
  std::printf("WHAT-IF    %s (%s)   DP %u x PP %u x TP %u   S = %.3f over steps %llu-%llu (%u)\n",
              Words(w.verdict(), "").c_str(), SeverityWord(w.severity()).c_str(),
              w.data_parallel_size(), w.pipeline_size(), w.tensor_parallel_size(), w.slowdown(),
              static_cast<unsigned long long>(w.first_step()),
              static_cast<unsigned long long>(w.last_step()), w.steps());
  if (!w.note().empty()) std::printf("           %s\n", w.note().c_str());
  if (!w.next_step().empty()) std::printf("           next: %s\n", w.next_step().c_str());
  std::printf(
      "           step ms: measured %.2f, simulated %.2f, ideal %.2f   M_W %.2f   M_S %.2f "
      "(last stage; worst stage %u: %.2f)   lost %.1f rank-s\n",
      w.measured_step_ms(), w.actual_step_ms(), w.ideal_step_ms(), w.m_w(), w.m_s(), w.m_s_stage(),
      w.m_s_worst(), w.lost_rank_seconds());
  if (w.skipped_steps() > 0) {
    std::printf("           %llu aligned steps not analysed (last: %s)\n",
                static_cast<unsigned long long>(w.skipped_steps()), w.skipped_reason().c_str());
  }
  if (w.slowdown_by_op_group_size() > 0) {
    std::printf("           by op:");
    for (int i = 0; i < w.slowdown_by_op_group_size() && i < 6; ++i) {
      std::printf(" %s %.3f", w.slowdown_by_op_group(i).name().c_str(),
                  w.slowdown_by_op_group(i).slowdown());
    }
    std::printf("\n");
  }
  if (w.slowdown_by_stage_size() == 0 || w.slowdown_by_data_rank_size() == 0) return;
  // Rows: stages; columns: data-parallel replicas (at most 16 shown); a cell is
  // min(S by its stage, S by its replica), the study's worker score.
  const int dp = std::min(w.slowdown_by_data_rank_size(), 16);
  std::printf("\n  %-10s", "stage\\dp");
  for (int d = 0; d < dp; ++d) std::printf("%7d", d);
  std::printf("%9s\n", "stage S");
  for (int s = 0; s < w.slowdown_by_stage_size(); ++s) {
    std::printf("  %-10d", s);
    for (int d = 0; d < dp; ++d) {
      std::printf("%7.3f", std::min(w.slowdown_by_stage(s), w.slowdown_by_data_rank(d)));
    }
    std::printf("%9.3f\n", w.slowdown_by_stage(s));
  }
  std::printf("  %-10s", "replica S");
  for (int d = 0; d < dp; ++d) std::printf("%7.3f", w.slowdown_by_data_rank(d));
  std::printf("\n");
}

int RunDiagnose(const DiagnoseFlags& f) {
  auto channel = grpc::CreateChannel(f.server, grpc::InsecureChannelCredentials());
  auto stub = v1::RankWatch::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::milliseconds(static_cast<int64_t>(f.timeout_s * 1000)));
  v1::GetDiagnosisRequest request;
  request.set_training_job(f.job);
  v1::Diagnosis d;
  const grpc::Status status = stub->GetDiagnosis(&ctx, request, &d);
  if (!status.ok()) {
    if (status.error_code() == grpc::StatusCode::NOT_FOUND) {
      std::fprintf(stderr, "rankwatch diagnose: rankwatchd at %s knows no job '%s'\n",
                   f.server.c_str(), f.job.c_str());
    } else if (status.error_code() == grpc::StatusCode::UNAVAILABLE ||
               status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
      std::fprintf(stderr, "rankwatch diagnose: cannot reach rankwatchd at %s\n", f.server.c_str());
    } else {
      std::fprintf(stderr, "rankwatch diagnose: %s\n", status.error_message().c_str());
    }
    return 1;
  }
  if (f.json) {
    std::printf("%s", AnswerJson(d).c_str());
    return 0;
  }
  const v1::Window& w = d.step().window();
  std::printf("job %s   steps %llu-%llu (%u in the window)   ranks %u/%u   %llu steps aligned\n\n",
              d.training_job().c_str(), static_cast<unsigned long long>(w.first_step()),
              static_cast<unsigned long long>(w.last_step()), w.steps(), w.ranks_present(),
              w.world_size(), static_cast<unsigned long long>(d.aligned_steps()));
  if (d.has_scheduler()) {
    const v1::SchedulerIdentity& s = d.scheduler();
    std::printf("scheduler  %s", s.scheduler().c_str());
    if (!s.job().empty()) std::printf("   job %s", s.job().c_str());
    if (!s.namespace_().empty()) std::printf("   namespace %s", s.namespace_().c_str());
    if (!s.owner().empty()) std::printf("   owner %s", s.owner().c_str());
    std::printf("\n\n");
  }
  if (d.input_lost_messages() > 0) {
    std::printf(
        "INPUT LOST %llu messages of this job's partition were deleted before rankwatchd "
        "read them: the diagnosis may miss some of its steps\n\n",
        static_cast<unsigned long long>(d.input_lost_messages()));
  }
  if (d.has_whatif()) {
    PrintWhatIf(d.whatif());
    std::printf("\n");
  }
  PrintStep(d.step());
  PrintHangStacks(d.hang_stacks());
  PrintFlightRecorder(d.flight_recorder(), d.hang_stacks());
  PrintMemory(d.memory());
  PrintLostTime(d.lost_time());
  PrintCapture(d.capture());
  return 0;
}

}  // namespace

CommandRunner AddDiagnoseCommand(CLI::App& app) {
  auto f = std::make_shared<DiagnoseFlags>();
  CLI::App* cmd = app.add_subcommand("diagnose", "print a job's current diagnosis from rankwatchd");
  cmd->add_option("--server", f->server, "rankwatchd gRPC address")->capture_default_str();
  cmd->add_option("--job", f->job, "training job id")->required();
  cmd->add_flag("--json", f->json, "print the response in the protobuf JSON mapping");
  cmd->add_option("--timeout", f->timeout_s, "seconds to wait for the answer")
      ->capture_default_str()
      ->check(CLI::Range(0.1, 600.0));
  return [cmd, f]() -> int { return cmd->parsed() ? RunDiagnose(*f) : -1; };
}

}  // namespace rankwatch
