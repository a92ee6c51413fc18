// `rankwatch alerts --server ADDR [--job J] [--follow] [--since SEQ] [--json]`: prints the
// alerts rankwatchd stored after sequence SEQ; with --follow keeps streaming live ones and,
// when the stream breaks (daemon restart, too slow a reader), resumes after the last alert it
// printed, so each alert is printed exactly once, in order. `--actions`: what the action policy
// did for each firing instead (ListActions; docs/alerting.md).
#include <google/protobuf/util/json_util.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <thread>

#include "cli/commands.h"
#include "cli/grpc_client.h"
#include "common/stop_signal.h"
#include "rankwatch/v1/service.grpc.pb.h"

namespace rankwatch {
namespace {

struct AlertsFlags {
  GrpcClientFlags client;
  std::string job;
  std::vector<std::string> kinds;
  std::string min_severity = "info";
  bool follow = false;
  uint64_t since = 0;
  bool json = false;
  bool actions = false;
};

std::string Lower(std::string s, const std::string& prefix) {
  if (s.rfind(prefix, 0) == 0) s = s.substr(prefix.size());
  for (char& c : s) c = static_cast<char>(std::tolower(c));
  return s;
}

std::string Utc(int64_t unix_ns) {
  char when[32];
  const std::time_t t = static_cast<std::time_t>(unix_ns / 1'000'000'000);
  std::tm tm{};
  gmtime_r(&t, &tm);
  std::strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return when;
}

// One line per action: "#412 2026-11-27T14:03:05Z delivered llm|hang|job (rule
// hang:critical=webhook, 1 round, with stacks): delivered".
int RunActions(const AlertsFlags& f) {
  auto channel = OpenChannel(f.client);
  if (!channel.ok()) {
    std::fprintf(stderr, "rankwatch alerts: %s\n", std::string(channel.status().message()).c_str());
    return 2;
  }
  auto stub = v1::RankWatch::NewStub(*channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  v1::ListActionsRequest request;
  request.set_training_job(f.job);
  v1::ListActionsResponse response;
  const grpc::Status status = stub->ListActions(&ctx, request, &response);
  if (!status.ok()) {
    std::fprintf(stderr, "rankwatch alerts: %s\n", Explain(status, f.client).c_str());
    return 1;
  }
  for (const v1::AlertAction& a : response.actions()) {
    if (f.json) {
      std::string out;
      google::protobuf::util::JsonPrintOptions options;
      options.preserve_proto_field_names = true;
      (void)google::protobuf::util::MessageToJsonString(a, &out, options);
      std::printf("%s\n", out.c_str());
      continue;
    }
    std::printf("#%llu %s %-9s %s (rule %s, %u round%s%s%s): %s\n",
                static_cast<unsigned long long>(a.firing_sequence()),
                Utc(a.fired_unix_ns()).c_str(), a.outcome().c_str(), a.alert_id().c_str(),
                a.rule().c_str(), a.rounds(), a.rounds() == 1 ? "" : "s",
                a.with_stacks() ? ", with stacks" : "", a.resolved() ? ", resolved" : "",
                a.detail().c_str());
  }
  return 0;
}

void Print(const v1::Alert& a, bool json) {
  if (json) {
    std::string out;
    google::protobuf::util::JsonPrintOptions options;
    options.preserve_proto_field_names = true;
    (void)google::protobuf::util::MessageToJsonString(a, &out, options);
    std::printf("%s\n", out.c_str());
  } else {
    const std::string when = Utc(a.at_unix_ns());
    // A pipeline job's straggler alert comes from its what-if verdict.
    const v1::WhatIf& w = a.evidence().whatif();
    const bool whatif = a.kind() == v1::ALERT_STRAGGLER && a.evidence().has_whatif() &&
                        w.verdict() != "none" && w.verdict() != "balanced";
    const std::string& note = a.kind() == v1::ALERT_MEMORY_CREEP ||
                                      a.kind() == v1::ALERT_MEMORY_PRESSURE ||
                                      a.kind() == v1::ALERT_MEMORY_IMBALANCE
                                  ? a.evidence().memory().note()
                              : whatif ? w.note()
                                       : a.evidence().step().note();
    // A fleet alert (the node alert) belongs to no job.
    const std::string job = a.training_job().empty() ? "(fleet)" : a.training_job();
    std::printf(
        "#%llu %s %-8s %-4s %-16s %s %s%s%s\n", static_cast<unsigned long long>(a.sequence()),
        when.c_str(), Lower(v1::AlertState_Name(a.state()), "ALERT_").c_str(),
        Lower(v1::Severity_Name(a.severity()), "SEVERITY_").c_str(),
        Lower(v1::AlertKind_Name(a.kind()), "ALERT_").c_str(), job.c_str(), a.subject().c_str(),
        a.cause() != v1::CAUSE_UNSPECIFIED
            ? (" (" + Lower(v1::StragglerCause_Name(a.cause()), "CAUSE_") + ")").c_str()
            : "",
        note.empty() ? "" : (": " + note).c_str());
  }
  std::fflush(stdout);
}

int RunAlerts(const AlertsFlags& f) {
  v1::WatchAlertsRequest request;
  request.set_training_job(f.job);
  for (const std::string& k : f.kinds) {
    v1::AlertKind kind;
    std::string name = "ALERT_" + k;
    for (char& c : name) c = static_cast<char>(std::toupper(c));
    if (!v1::AlertKind_Parse(name, &kind)) {
      std::fprintf(stderr, "rankwatch alerts: unknown alert kind '%s'\n", k.c_str());
      return 2;
    }
    request.add_kinds(kind);
  }
  std::string severity = "SEVERITY_" + f.min_severity;
  for (char& c : severity) c = static_cast<char>(std::toupper(c));
  v1::Severity min_severity;
  if (!v1::Severity_Parse(severity, &min_severity)) {
    std::fprintf(stderr, "rankwatch alerts: unknown severity '%s' (info, warn, crit)\n",
                 f.min_severity.c_str());
    return 2;
  }
  request.set_min_severity(min_severity);
  request.set_backlog_only(!f.follow);
  auto channel = OpenChannel(f.client);
  if (!channel.ok()) {
    std::fprintf(stderr, "rankwatch alerts: %s\n", std::string(channel.status().message()).c_str());
    return 2;
  }
  auto stub = v1::RankWatch::NewStub(*channel);
  uint64_t last = f.since;
  while (true) {
    request.set_after_sequence(last);
    grpc::ClientContext ctx;
    if (!f.follow) ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    std::atomic<bool> done{false};
    std::thread canceller([&] {  // Ctrl-C ends a blocked read
      while (!done && !StopRequested()) std::this_thread::sleep_for(std::chrono::milliseconds(100));
      if (!done) ctx.TryCancel();
    });
    auto reader = stub->WatchAlerts(&ctx, request);
    v1::Alert alert;
    while (reader->Read(&alert)) {
      if (alert.sequence() <= last) continue;
      Print(alert, f.json);
      last = alert.sequence();
    }
    const grpc::Status status = reader->Finish();
    done = true;
    canceller.join();
    if (StopRequested()) return 0;
    if (status.ok() && !f.follow) return 0;
    const bool resumable = status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED ||
                           (status.error_code() == grpc::StatusCode::UNAVAILABLE &&
                            Explain(status, f.client).rfind("TLS", 0) != 0);
    if (!f.follow || !resumable) {
      std::fprintf(stderr, "rankwatch alerts: %s\n", Explain(status, f.client).c_str());
      return 1;
    }
    std::fprintf(stderr, "rankwatch alerts: %s; resuming after #%llu\n",
                 Explain(status, f.client).c_str(), static_cast<unsigned long long>(last));
    for (int i = 0; i < 10 && !StopRequested(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    if (StopRequested()) return 0;
  }
}

}  // namespace

CommandRunner AddAlertsCommand(CLI::App& app) {
  auto f = std::make_shared<AlertsFlags>();
  CLI::App* cmd = app.add_subcommand("alerts", "print rankwatchd's alerts; --follow streams them");
  AddGrpcClientFlags(cmd, &f->client);
  cmd->add_option("--job", f->job, "only this training job (leaves out fleet alerts)");
  cmd->add_option("--kind", f->kinds,
                  "only these kinds: straggler, hang, memory_creep, memory_pressure, "
                  "memory_imbalance, input_bound, wait_heavy, node_culprit (a node that slowed "
                  "several jobs: a fleet alert, of no job)");
  cmd->add_option("--min-severity", f->min_severity, "info, warn or crit")->capture_default_str();
  cmd->add_flag("--follow,-f", f->follow, "keep streaming live alerts, resuming after breaks");
  cmd->add_option("--since", f->since, "only alerts after this sequence number")
      ->capture_default_str();
  cmd->add_flag("--json", f->json, "one JSON object per alert (protobuf JSON mapping)");
  cmd->add_flag("--actions", f->actions,
                "what the action policy did for each firing (webhook calls, their outcome)");
  return [cmd, f]() -> int {
    if (!cmd->parsed()) return -1;
    return f->actions ? RunActions(*f) : RunAlerts(*f);
  };
}

}  // namespace rankwatch
