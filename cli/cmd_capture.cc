// `rankwatch capture`: asks a job's collectors for a profiler trace of a few steps through
// rankwatchd (the control channel), lists captures and prints one, with the culprit rank's
// operators against the reference rank's, and writes the raw traces as Kineto JSON.
//
//   rankwatch capture --server S --job J [--ranks R,...] [--reference R] [--steps N] [--wait S]
//   rankwatch capture list --server S [--job J] [--json]
//   rankwatch capture show ID --server S [--json] [--out DIR]
#include <google/protobuf/util/json_util.h>

#include <cctype>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include "cli/commands.h"
#include "cli/grpc_client.h"
#include "common/json_string.h"
#include "common/stop_signal.h"
#include "rankwatch/v1/service.grpc.pb.h"
#include "serving/timeline.h"

namespace rankwatch {
namespace {

struct CaptureFlags {
  GrpcClientFlags client;
  std::string job;
  std::vector<uint32_t> ranks;
  int64_t reference = -1;
  uint32_t steps = 0;
  double wait_s = 0;
  bool json = false;
  // show
  std::string id;
  std::string out_dir;
};

std::string Json(const google::protobuf::Message& m) {
  std::string out;
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(m, &out, options);
  return out;
}

std::string StateName(v1::CaptureState s) {
  std::string name = v1::CaptureState_Name(s);
  if (name.rfind("CAPTURE_", 0) == 0) name = name.substr(8);
  for (char& c : name) c = static_cast<char>(std::tolower(c));
  return name;
}

std::string RankState(v1::ControlState s) {
  switch (s) {
    case v1::CONTROL_ACCEPTED: return "accepted";
    case v1::CONTROL_REFUSED: return "refused";
    case v1::CONTROL_DONE: return "done";
    case v1::CONTROL_FAILED: return "failed";
    default: return "no answer";
  }
}

void PrintLine(const v1::Capture& c) {
  std::string ranks;
  for (const v1::CaptureRank& r : c.ranks()) {
    ranks += (ranks.empty() ? "" : ",") + std::to_string(r.rank());
  }
  std::printf("%-28s %-9s %-24s ranks %-12s %u steps  %s\n", c.id().c_str(),
              StateName(c.state()).c_str(), c.training_job().c_str(), ranks.c_str(), c.steps(),
              c.requested_by().c_str());
}

void PrintCapture(const v1::Capture& c) {
  std::printf("CAPTURE %s of %s: %s%s%s\n", c.id().c_str(), c.training_job().c_str(),
              StateName(c.state()).c_str(), c.reason().empty() ? "" : " — ", c.reason().c_str());
  std::printf("  requested by %s, %u steps a rank\n", c.requested_by().c_str(), c.steps());
  for (const v1::CaptureRank& r : c.ranks()) {
    std::printf("  rank %-5u %-10s %-10s", r.rank(), r.role().c_str(),
                RankState(r.state()).c_str());
    if (r.first_step() >= 0) {
      std::printf(" steps %lld-%lld, %llu events", static_cast<long long>(r.first_step()),
                  static_cast<long long>(r.first_step() + r.steps() - 1),
                  static_cast<unsigned long long>(r.events_received()));
    }
    if (r.profiled_step_seconds() > 0) {
      std::printf(", %.1f ms a step profiled", r.profiled_step_seconds() * 1e3);
      if (r.step_seconds_before() > 0) {
        std::printf(" (%.1f ms before: %+.0f%%)", r.step_seconds_before() * 1e3,
                    (r.profiled_step_seconds() / r.step_seconds_before() - 1) * 100);
      }
    }
    if (!r.node().empty()) std::printf(" on %s", r.node().c_str());
    if (!r.reason().empty()) std::printf(" — %s", r.reason().c_str());
    std::printf("\n");
  }
  if (c.comparison_size() > 0) {
    std::printf("\nOPERATORS rank %d against rank %d, self time per step, largest excess first\n",
                c.culprit_rank(), c.reference_rank());
    std::printf("  %-48s %-10s %11s %11s %11s %7s\n", "operator", "phase", "culprit ms",
                "reference ms", "excess ms", "calls");
    for (const v1::CaptureOp& op : c.comparison()) {
      std::string name = op.name();
      if (name.size() > 48) name = name.substr(0, 45) + "...";
      std::printf("  %-48s %-10s %11.3f %11.3f %+11.3f %7.1f\n", name.c_str(), op.phase().c_str(),
                  op.culprit_seconds_per_step() * 1e3, op.reference_seconds_per_step() * 1e3,
                  op.excess_seconds_per_step() * 1e3, op.culprit_calls_per_step());
    }
  }
  std::fflush(stdout);
}

// One rank's events as a Chrome/Kineto trace (what TensorBoard, Perfetto and HTA read): one
// complete ("X") event each, timestamps in microseconds, pid the rank, tid the thread.
absl::Status WriteKineto(const v1::Capture& c, const v1::CaptureTrace& t,
                         const std::filesystem::path& path) {
  std::ofstream out(path);
  if (!out) return absl::UnavailableError("cannot write " + path.string());
  auto name = [&](uint32_t i) {
    return JsonString(static_cast<int>(i) < t.names_size() ? t.names(i) : "");
  };
  out << "{\"schemaVersion\": 1, \"distributedInfo\": {\"rank\": " << t.rank() << "},\n"
      << " \"traceName\": " << JsonString(c.id() + " rank " + std::to_string(t.rank())) << ",\n"
      << " \"traceEvents\": [\n";
  for (int i = 0; i < t.events_size(); ++i) {
    const v1::KernelEvent& e = t.events(i);
    char num[200];
    std::snprintf(
        num, sizeof(num), "\"ph\": \"X\", \"ts\": %.3f, \"dur\": %.3f, \"pid\": %u, \"tid\": %llu",
        e.ts_ns() / 1e3, e.dur_ns() / 1e3, t.rank(), static_cast<unsigned long long>(e.tid()));
    out << "  {\"name\": " << name(e.name()) << ", \"cat\": " << name(e.category()) << ", " << num
        << ", \"args\": {\"step\": " << e.step() << "}}"
        << (i + 1 < t.events_size() ? ",\n" : "\n");
  }
  out << " ]}\n";
  return out.good() ? absl::OkStatus() : absl::UnavailableError("cannot write " + path.string());
}

int Fail(const char* what, const std::string& message, int code) {
  std::fprintf(stderr, "rankwatch capture%s: %s\n", what, message.c_str());
  return code;
}

int RunShow(const CaptureFlags& f) {
  auto channel = OpenChannel(f.client);
  if (!channel.ok()) return Fail(" show", std::string(channel.status().message()), 2);
  auto stub = v1::RankWatch::NewStub(*channel);
  v1::GetCaptureRequest request;
  request.set_id(f.id);
  request.set_with_events(!f.out_dir.empty());
  v1::GetCaptureResponse response;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  const grpc::Status s = stub->GetCapture(&ctx, request, &response);
  if (!s.ok()) return Fail(" show", Explain(s, f.client), 1);
  if (f.json) {
    std::printf("%s\n", Json(response.capture()).c_str());
  } else {
    PrintCapture(response.capture());
  }
  if (!f.out_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(f.out_dir, ec);
    for (const v1::CaptureTrace& t : response.traces()) {
      const std::filesystem::path path =
          std::filesystem::path(f.out_dir) / (f.id + "-rank" + std::to_string(t.rank()) + ".json");
      if (absl::Status w = WriteKineto(response.capture(), t, path); !w.ok()) {
        return Fail(" show", std::string(w.message()), 1);
      }
      std::fprintf(stderr, "wrote %s (%d events)\n", path.c_str(), t.events_size());
    }
  }
  return 0;
}

int RunList(const CaptureFlags& f) {
  auto channel = OpenChannel(f.client);
  if (!channel.ok()) return Fail(" list", std::string(channel.status().message()), 2);
  auto stub = v1::RankWatch::NewStub(*channel);
  v1::ListCapturesRequest request;
  request.set_training_job(f.job);
  v1::ListCapturesResponse response;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  const grpc::Status s = stub->ListCaptures(&ctx, request, &response);
  if (!s.ok()) return Fail(" list", Explain(s, f.client), 1);
  if (f.json) {
    std::printf("%s\n", Json(response).c_str());
  } else {
    for (const v1::Capture& c : response.captures()) PrintLine(c);
  }
  return 0;
}

int RunRequest(const CaptureFlags& f) {
  if (f.job.empty()) return Fail("", "--job is required", 2);
  auto channel = OpenChannel(f.client);
  if (!channel.ok()) return Fail("", std::string(channel.status().message()), 2);
  auto stub = v1::RankWatch::NewStub(*channel);
  v1::RequestCaptureRequest request;
  request.set_training_job(f.job);
  for (uint32_t r : f.ranks) request.add_ranks(r);
  if (f.reference >= 0) request.set_reference_rank(static_cast<uint32_t>(f.reference));
  request.set_steps(f.steps);
  v1::Capture c;
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    const grpc::Status s = stub->RequestCapture(&ctx, request, &c);
    if (!s.ok()) return Fail("", Explain(s, f.client), 1);
  }
  const auto until = std::chrono::steady_clock::now() +
                     std::chrono::milliseconds(static_cast<int64_t>(f.wait_s * 1000));
  while (f.wait_s > 0 && !StopRequested() && std::chrono::steady_clock::now() < until &&
         (c.state() == v1::CAPTURE_REQUESTED || c.state() == v1::CAPTURE_RUNNING)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    v1::GetCaptureRequest get;
    get.set_id(c.id());
    v1::GetCaptureResponse response;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    const grpc::Status s = stub->GetCapture(&ctx, get, &response);
    if (!s.ok()) return Fail("", Explain(s, f.client), 1);
    c = response.capture();
  }
  if (f.json) {
    std::printf("%s\n", Json(c).c_str());
  } else if (f.wait_s > 0) {
    PrintCapture(c);
  } else {
    PrintLine(c);
  }
  return c.state() == v1::CAPTURE_FAILED || c.state() == v1::CAPTURE_EXPIRED ? 1 : 0;
}

}  // namespace

CommandRunner AddCaptureCommand(CLI::App& app) {
  auto f = std::make_shared<CaptureFlags>();
  CLI::App* cmd = app.add_subcommand(
      "capture",
      "ask a job's collectors for a profiler trace of a few steps; list and show captures");
  AddGrpcClientFlags(cmd, &f->client);
  cmd->add_option("--job", f->job, "training job");
  cmd->add_option("--ranks", f->ranks,
                  "ranks to profile (default: the job's culprit rank and a typical rank, "
                  "compared)")
      ->delimiter(',');
  cmd->add_option("--reference", f->reference,
                  "also profile this rank and compare the first of --ranks with it");
  cmd->add_option("--steps", f->steps, "steps to profile on each rank (default: the daemon's)")
      ->check(CLI::Range(0u, 100u));
  cmd->add_option("--wait", f->wait_s, "wait up to this many seconds for the capture and print it")
      ->capture_default_str();
  cmd->add_flag("--json", f->json, "print JSON (the protobuf JSON mapping)");

  CLI::App* list = cmd->add_subcommand("list", "list the captures rankwatchd keeps, newest first");
  AddGrpcClientFlags(list, &f->client);
  list->add_option("--job", f->job, "only this training job's");
  list->add_flag("--json", f->json, "print JSON");

  CLI::App* show = cmd->add_subcommand("show", "print one capture and its operator comparison");
  show->add_option("id", f->id, "capture id (rankwatch capture list)")->required();
  AddGrpcClientFlags(show, &f->client);
  show->add_flag("--json", f->json, "print JSON");
  show->add_option("--out", f->out_dir,
                   "also write each rank's events as a Kineto JSON trace into this directory");
  cmd->require_subcommand(0, 1);
  return [cmd, list, show, f]() -> int {
    if (!cmd->parsed()) return -1;
    if (list->parsed()) return RunList(*f);
    if (show->parsed()) return RunShow(*f);
    return RunRequest(*f);
  };
}

}  // namespace rankwatch
