// `rankwatch agent --brokers B --job J`: the node agent (collectors/agent/node_agent.h).
// Samples the host, the training processes and the GPUs every --interval, publishes new
// trace files from --trace-dir, and serves its own counters as Prometheus metrics. Prints
// one JSON line with the metrics address first, then runs until SIGINT/SIGTERM (or for
// --duration seconds).
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <memory>

#include "absl/strings/str_join.h"
#include "cli/commands.h"
#include "collectors/agent/node_agent.h"
#include "collectors/batch_publisher.h"
#include "common/listen_address.h"
#include "common/stop_signal.h"
#include "common/wall_clock.h"
#include "metrics/prometheus_registry.h"
#include "serving/metrics_http_server.h"
#include "wire/schema.h"

namespace rankwatch {
namespace {

struct AgentFlags {
  std::string brokers;
  std::string topic = "rankwatch.telemetry";
  NodeAgentOptions agent;
  double interval_s = 1.0;
  double duration_s = 0;
  std::string metrics_listen = "127.0.0.1:9467";
  double trace_timeout_s = 30;
  std::string control_topic = "rankwatch.control";
  size_t max_message_bytes = kDefaultMaxMessageBytes;
};

int RunAgent(AgentFlags f) {
  auto listen = ParseListenAddress(f.metrics_listen);
  if (!listen.ok()) {
    std::fprintf(stderr, "rankwatch agent: %s\n", std::string(listen.status().message()).c_str());
    return 2;
  }
  if (f.agent.node.empty()) {
    char host[256] = {};
    gethostname(host, sizeof(host) - 1);
    f.agent.node = host;
  }
  PublisherOptions po;
  po.brokers = f.brokers;
  po.topic = f.topic;
  po.client_id = "rankwatch-agent";
  po.queue_max_messages = kIdempotentInflightWindow - 1;  // no spinning while Kafka hangs
  po.when_full = PublisherOptions::WhenFull::kDropNewest;
  po.max_message_bytes = static_cast<int>(f.max_message_bytes);
  auto publisher = BatchPublisher::Create(po);  // never waits: Kafka may come later
  if (!publisher.ok()) {
    std::fprintf(stderr, "rankwatch agent: %s\n",
                 std::string(publisher.status().message()).c_str());
    return 2;
  }
  PrometheusRegistry registry;
  MetricFamily* samples =
      registry.Counter("rankwatch_agent_samples_total", "system samples published", {});
  MetricFamily* batches = registry.Counter(
      "rankwatch_agent_batches_total",
      "batches by outcome: sent (to the producer), dropped (producer queue full or too large), "
      "oversized (too large for --max-message-bytes: never sent), delivered, failed",
      {"result"});
  MetricFamily* traces = registry.Counter("rankwatch_agent_trace_files_total",
                                          "trace files found, by outcome", {"result"});
  MetricFamily* kernel_events =
      registry.Counter("rankwatch_agent_trace_kernel_events_total",
                       "kernel events published from Kineto trace files", {});
  MetricFamily* gpus = registry.Gauge("rankwatch_agent_gpus", "GPUs seen through NVML", {});
  MetricFamily* captures = registry.Counter(
      "rankwatch_agent_captures_total",
      "capture requests taken (requested), and ranks answered from a trace (done) or not "
      "(failed)",
      {"result"});
  MetricFamily* dumps = registry.Counter(
      "rankwatch_agent_flight_recorder_dumps_total",
      "Flight Recorder dumps found: published, published as unreadable, failed (not sent)",
      {"result"});
  MetricFamily* dump_requests = registry.Counter(
      "rankwatch_agent_flight_recorder_requests_total",
      "Flight Recorder requests taken (requested), and ranks asked through their pipe "
      "(triggered), whose dump came (done), or not (failed)",
      {"result"});
  auto server = MetricsHttpServer::Start(*listen, &registry);
  if (!server.ok()) {
    std::fprintf(stderr, "rankwatch agent: %s\n", std::string(server.status().message()).c_str());
    return 1;
  }
  f.agent.include_existing_dumps = f.agent.include_existing_traces;  // one flag for both
  f.agent.trace_publish_timeout =
      std::chrono::milliseconds(static_cast<int64_t>(f.trace_timeout_s * 1000));
  // Captures are answered from the trace directory, Flight Recorder requests through the dump
  // pipes: without either there is nothing to answer with.
  std::unique_ptr<ControlListener> control;
  if ((!f.agent.trace_dir.empty() || !f.agent.flight_recorder_pipe_prefixes.empty()) &&
      !f.control_topic.empty()) {
    ControlListenerOptions lo;
    lo.brokers = f.brokers;
    lo.topic = f.control_topic;
    lo.training_job = f.agent.training_job;
    lo.rank = kEveryRank;
    lo.limits.max_stack_frames = 0;  // stacks are the ranks' own collectors' to answer
    auto listener = ControlListener::Start(std::move(lo), nullptr);
    if (listener.ok()) {
      control = std::move(*listener);
    } else {
      spdlog::warn("agent: no control channel: {}", std::string(listener.status().message()));
    }
  }
  NodeAgent agent(f.agent, publisher->get(), std::move(control));
  std::printf("{\"metrics\": \"%s\"}\n", (*server)->address().ToString().c_str());
  std::fflush(stdout);
  spdlog::info(
      "agent: job '{}', node {}, every {} s, traces from '{}', Flight Recorder dumps "
      "'{}', pipes '{}'",
      f.agent.training_job, f.agent.node, f.interval_s, f.agent.trace_dir,
      absl::StrJoin(f.agent.flight_recorder_prefixes, "', '"),
      absl::StrJoin(f.agent.flight_recorder_pipe_prefixes, "', '"));
  const auto start = std::chrono::steady_clock::now();
  const auto interval = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::duration<double>(f.interval_s));
  auto update = [&] {
    const NodeAgentCounters& c = agent.counters();
    samples->WithLabels({})->Set(c.samples.load());
    batches->WithLabels({"sent"})->Set(c.batches_sent.load());
    batches->WithLabels({"dropped"})->Set(c.batches_dropped.load());
    // Refused by the producer (the agent's batches_oversized) or by the broker.
    batches->WithLabels({"oversized"})->Set((*publisher)->oversized());
    batches->WithLabels({"delivered"})->Set((*publisher)->delivered());
    batches->WithLabels({"failed"})->Set((*publisher)->failed());
    traces->WithLabels({"published"})->Set(c.trace_files_published.load());
    traces->WithLabels({"failed"})->Set(c.trace_files_failed.load());
    kernel_events->WithLabels({})->Set(c.trace_kernel_events.load());
    gpus->WithLabels({})->Set(agent.gpu_count());
    captures->WithLabels({"requested"})->Set(c.capture_requests.load());
    captures->WithLabels({"done"})->Set(c.capture_ranks_done.load());
    captures->WithLabels({"failed"})->Set(c.capture_ranks_failed.load());
    dumps->WithLabels({"published"})->Set(c.fr_dumps_published.load());
    dumps->WithLabels({"unreadable"})->Set(c.fr_dumps_unreadable.load());
    dumps->WithLabels({"failed"})->Set(c.fr_dumps_failed.load());
    dump_requests->WithLabels({"requested"})->Set(c.fr_requests.load());
    dump_requests->WithLabels({"triggered"})->Set(c.fr_ranks_triggered.load());
    dump_requests->WithLabels({"done"})->Set(c.fr_ranks_done.load());
    dump_requests->WithLabels({"failed"})->Set(c.fr_ranks_failed.load());
  };
  while (true) {
    agent.Tick(WallNowUnixNs());
    (void)(*publisher)->Flush(std::chrono::milliseconds(0));  // serves delivery reports
    update();
    if (f.duration_s > 0 &&
        std::chrono::steady_clock::now() - start >= std::chrono::duration<double>(f.duration_s)) {
      break;
    }
    if (WaitForStop(interval)) break;
  }
  absl::Status flushed = (*publisher)->Flush(std::chrono::seconds(5));
  update();
  const NodeAgentCounters& c = agent.counters();
  std::printf(
      "{\"samples\": %llu, \"batches_sent\": %llu, \"batches_dropped\": %llu, "
      "\"delivered\": %llu, \"failed\": %llu, \"trace_files\": %llu, "
      "\"trace_kernel_events\": %llu, \"flight_recorder_dumps\": %llu}\n",
      static_cast<unsigned long long>(c.samples.load()),
      static_cast<unsigned long long>(c.batches_sent.load()),
      static_cast<unsigned long long>(c.batches_dropped.load()),
      static_cast<unsigned long long>((*publisher)->delivered()),
      static_cast<unsigned long long>((*publisher)->failed()),
      static_cast<unsigned long long>(c.trace_files_published.load()),
      static_cast<unsigned long long>(c.trace_kernel_events.load()),
      static_cast<unsigned long long>(c.fr_dumps_published.load() + c.fr_dumps_unreadable.load()));
  std::fflush(stdout);
  if (!flushed.ok()) spdlog::warn("agent: {}", std::string(flushed.message()));
  return 0;
}

}  // namespace

CommandRunner AddAgentCommand(CLI::App& app) {
  auto f = std::make_shared<AgentFlags>();
  CLI::App* cmd = app.add_subcommand(
      "agent", "node agent: host, process and GPU samples, and new trace files, to Kafka");
  cmd->add_option("--brokers", f->brokers, "Kafka bootstrap servers")->required();
  cmd->add_option("--topic", f->topic, "telemetry topic")->capture_default_str();
  cmd->add_option("--job", f->agent.training_job,
                  "training job id of the batches (the job on this node, or a node-level id)")
      ->required();
  cmd->add_option("--rank", f->agent.rank, "rank in the batches' identity")->capture_default_str();
  cmd->add_option("--world-size", f->agent.world_size,
                  "world size in the batches' identity (the job's, when --job is a training job)")
      ->capture_default_str()
      ->check(CLI::Range(1u, 1u << 20));
  cmd->add_option("--node", f->agent.node, "node name (default: the host name)");
  cmd->add_option("--interval", f->interval_s, "seconds between samples")
      ->capture_default_str()
      ->check(CLI::Range(0.01, 3600.0));
  cmd->add_option("--duration", f->duration_s, "stop after this many seconds (0 = never)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1e9));
  cmd->add_option("--process-match", f->agent.proc.process_match,
                  "training processes: command lines containing this")
      ->capture_default_str();
  cmd->add_option("--trace-dir", f->agent.trace_dir,
                  "watch this directory for new Kineto / Ascend trace files");
  cmd->add_flag("--include-existing", f->agent.include_existing_traces,
                "also publish the traces and Flight Recorder dumps already there at start");
  cmd->add_option("--flight-recorder", f->agent.flight_recorder_prefixes,
                  "publish the PyTorch Flight Recorder dumps written to PREFIX<rank> (the job's "
                  "TORCH_NCCL_DEBUG_INFO_TEMP_FILE; PyTorch's default /tmp/nccl_trace_rank_); "
                  "repeatable")
      ->type_name("PREFIX");
  cmd->add_option("--flight-recorder-pipe", f->agent.flight_recorder_pipe_prefixes,
                  "answer the job's Flight Recorder requests through the pipes PREFIX<rank>.pipe "
                  "(the job's TORCH_NCCL_DEBUG_INFO_PIPE_FILE); repeatable")
      ->type_name("PREFIX");
  cmd->add_option("--trace-publish-timeout", f->trace_timeout_s,
                  "seconds one trace file's batches may wait for Kafka in all")
      ->capture_default_str()
      ->check(CLI::Range(0.1, 3600.0));
  cmd->add_option("--control-topic", f->control_topic,
                  "answer capture requests of the job from --trace-dir (empty: off)")
      ->capture_default_str();
  cmd->add_option("--max-message-bytes", f->max_message_bytes,
                  "the largest Kafka message sent (librdkafka's message.max.bytes; set it to the "
                  "brokers' and the topic's limit): trace files and Flight Recorder dumps go in "
                  "batches below it")
      ->capture_default_str()
      ->check(CLI::Range(kMinMaxMessageBytes, size_t{1'000'000'000}));
  cmd->add_option("--nvml-library", f->agent.nvml_library, "NVML shared library")
      ->capture_default_str();
  cmd->add_option("--metrics-listen", f->metrics_listen,
                  "Prometheus /metrics of the agent (port 0 = any free port)")
      ->capture_default_str();
  return [cmd, f]() -> int { return cmd->parsed() ? RunAgent(*f) : -1; };
}

}  // namespace rankwatch
