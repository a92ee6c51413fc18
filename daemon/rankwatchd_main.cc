// rankwatchd: consumes telemetry from Kafka, aligns the ranks of every training job step by
// step, and serves Prometheus metrics and the gRPC service. Wiring only.
#include <google/protobuf/stubs/logging.h>
#include <spdlog/spdlog.h>

#include <malloc.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <mutex>
#include <optional>
#include <stop_token>
#include <thread>
#include <utility>
#include <vector>

#include "common/logging.h"
#include "common/stop_signal.h"
#include "daemon/daemon_config.h"
#include "ingest/kafka_consumer.h"
#include "kafka/cluster_requests.h"
#include "kafka/control_request_producer.h"
#include "kafka/embedded_broker.h"
#include "runtime/job_router.h"
#include "runtime/state_health.h"
#include "runtime/task_manager.h"
#include "sinks/grpc_server.h"
#include "sinks/metrics_http_server.h"
#include "sinks/web_server.h"
#include "state/checkpoint_writer.h"
#include "state/state_changelog.h"
#include "state/state_dir.h"
#include "state/state_store.h"

#ifndef RANKWATCH_VERSION
#define RANKWATCH_VERSION "dev"
#endif

namespace rankwatch {
#ifdef RANKWATCH_JEMALLOC
}  // namespace rankwatch
#include <jemalloc/jemalloc.h>
namespace rankwatch {
// jemalloc's settings, read when it starts: a background thread of its own returns freed pages
// to the system, so the daemon's threads never do that work and an idle daemon gives back what a
// burst left. It returns them after 1 s unused instead of jemalloc's default 10 s: at 200,000
// records/s the soak's RSS was 196 MiB with 1 s against 240 MiB with 10 s, for ingest pauses a
// quarter longer (page faults when freed pages are taken again; benchmarks/README.md, the
// allocator A/B). MALLOC_CONF in the environment overrides this.
extern "C" const char* malloc_conf = "background_thread:true,dirty_decay_ms:1000";
#endif

namespace {

// jemalloc's own counts, where rankwatchd is built with it: bytes the daemon has allocated; bytes
// in the pages that hold them (active: the excess over allocated is fragmentation); jemalloc's
// own metadata; and bytes in pages it keeps resident (active, metadata, and freed pages not yet
// returned). Without jemalloc the family is not registered.
class HeapMetrics {
 public:
  explicit HeapMetrics(PrometheusRegistry* registry) {
#ifdef RANKWATCH_JEMALLOC
    MetricFamily* heap = registry->Gauge(
        "rankwatch_heap_bytes",
        "The allocator's counts (builds with jemalloc): allocated (in use by the daemon), active "
        "(in the pages that hold it), metadata (jemalloc's own), resident (in pages it holds). "
        "Sampled after each checkpoint.",
        {"kind"});
    for (const char* kind : {"allocated", "active", "metadata", "resident"}) {
      cells_.push_back({std::string("stats.") + kind, heap->WithLabels({kind})});
    }
#endif
  }

  void Sample() {
#ifdef RANKWATCH_JEMALLOC
    uint64_t epoch = 1;
    size_t size = sizeof(epoch);
    mallctl("epoch", &epoch, &size, &epoch, size);
    for (const auto& [name, cell] : cells_) {
      size_t value = 0;
      size = sizeof(value);
      if (mallctl(name.c_str(), &value, &size, nullptr, 0) == 0)
        cell->Set(static_cast<double>(value));
    }
#endif
  }

 private:
  std::vector<std::pair<std::string, MetricCell*>> cells_;  // jemalloc's stat, its series
};

int64_t WallNowUnixNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

int Fail(const absl::Status& s) {
  spdlog::error("{}", std::string(s.message()));
  return 1;
}

// Finds --config FILE / --config=FILE before the real parse, so that the file is read first
// and flags given on the command line override it.
std::string FindConfigFlag(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--config") == 0 && i + 1 < argc) return argv[i + 1];
    if (std::strncmp(argv[i], "--config=", 9) == 0) return argv[i] + 9;
  }
  return "";
}

// The consumer group membership of this instance: its group.instance.id (empty: dynamic) and
// session timeout, from the config and what the brokers are (see DaemonConfig).
struct Membership {
  std::string instance_id;
  std::chrono::milliseconds session_timeout;
};

// The configured session timeout, if any (checked before anything starts).
absl::StatusOr<std::optional<std::chrono::milliseconds>> ParseSessionTimeout(
    const DaemonConfig& config) {
  if (config.session_timeout.empty()) return std::nullopt;
  auto parsed = ParseDuration(config.session_timeout);
  if (!parsed.ok()) return parsed.status();
  const auto timeout = std::chrono::duration_cast<std::chrono::milliseconds>(*parsed);
  if (timeout < std::chrono::seconds(1) || timeout > std::chrono::hours(1)) {
    return absl::InvalidArgumentError("session-timeout must be within 1s..1h");
  }
  return timeout;
}

Membership ChooseMembership(const DaemonConfig& config,
                            std::optional<std::chrono::milliseconds> session_timeout,
                            const std::string& brokers, bool embedded,
                            const std::filesystem::path& state) {
  bool development = embedded;
  if (!embedded) {
    auto id = QueryKafkaClusterId(brokers, config.kafka, std::chrono::seconds(10));
    if (id.ok()) {
      development = IsDevelopmentClusterId(*id);
    } else {
      spdlog::warn(
          "kafka: could not ask {} for its cluster id ({}); taking it for a Kafka "
          "cluster",
          brokers, std::string(id.status().message()));
    }
  }
  Membership m;
  m.session_timeout =
      session_timeout.value_or(development ? kDevelopmentSessionTimeout : kClusterSessionTimeout);
  if (config.instance_id == "none") {
    m.instance_id.clear();
  } else if (!config.instance_id.empty()) {
    m.instance_id = config.instance_id;
  } else {
    std::string host;
    if (const char* pod = std::getenv("POD_NAME"); pod != nullptr && *pod != '\0') {
      host = pod;
    } else {
      char name[256] = {};
      if (::gethostname(name, sizeof(name) - 1) == 0) host = name;
    }
    m.instance_id = DefaultInstanceId(host, state.string());
  }
  const double seconds = std::chrono::duration<double>(m.session_timeout).count();
  if (development && !m.instance_id.empty()) {
    // librdkafka's mock cluster reads group.instance.id and ignores it (kafka_consumer_test
    // shows it), while a static member sends no LeaveGroup on shutdown: dynamic is faster here.
    spdlog::info(
        "kafka: the development broker does not support static group membership: joining "
        "group {} as a dynamic member; after a crash this instance gets its partitions back "
        "once its predecessor's session ({:g} s) has timed out",
        config.group, seconds);
    m.instance_id.clear();
  } else if (m.instance_id.empty()) {
    spdlog::info("kafka: joining group {} as a dynamic member (session timeout {:g} s)",
                 config.group, seconds);
  } else {
    spdlog::info(
        "kafka: joining group {} as static member {} (session timeout {:g} s): a "
        "restart with this id takes its partitions back at once",
        config.group, m.instance_id, seconds);
  }
  return m;
}

int Run(const DaemonConfig& config) {
  if (!SetupLogging(config.log_level)) {
    return Fail(absl::InvalidArgumentError("unknown log level '" + config.log_level + "'"));
  }
  auto align_timeout = ParseDuration(config.align_timeout);
  if (!align_timeout.ok()) return Fail(align_timeout.status());
  auto hang_timeout = ParseDuration(config.hang_timeout);
  if (!hang_timeout.ok()) return Fail(hang_timeout.status());
  auto checkpoint_interval = ParseDuration(config.checkpoint_interval);
  if (!checkpoint_interval.ok()) return Fail(checkpoint_interval.status());
  auto job_ttl = ParseDuration(config.job_ttl);
  if (!job_ttl.ok()) return Fail(job_ttl.status());
  auto job_retention = ParseDuration(config.job_retention);
  if (!job_retention.ok()) return Fail(job_retention.status());
  auto capture_interval = ParseDuration(config.capture_interval);
  if (!capture_interval.ok()) return Fail(capture_interval.status());
  auto capture_deadline = ParseDuration(config.capture_deadline);
  if (!capture_deadline.ok()) return Fail(capture_deadline.status());
  const auto deadline_s = std::chrono::duration_cast<std::chrono::seconds>(*capture_deadline);
  if (deadline_s.count() < 1 || deadline_s.count() > 3600) {
    return Fail(absl::InvalidArgumentError("capture-deadline must be in 1s..1h"));
  }
  if (config.capture_steps < 1 || config.capture_steps > 100) {
    return Fail(absl::InvalidArgumentError("capture-steps must be in 1..100"));
  }
  if (config.window_steps < 1) return Fail(absl::InvalidArgumentError("window-steps must be >= 1"));
  if (config.checkpoint_budget_mib < 1 || config.checkpoint_budget_mib > 65536) {
    return Fail(absl::InvalidArgumentError("checkpoint-budget-mib must be in 1..65536"));
  }
  if (config.alert_subscriber_queue < 1) {
    return Fail(absl::InvalidArgumentError("alert-subscriber-queue must be >= 1"));
  }
  if (config.max_jobs < 1 || config.max_ranks < 1) {
    return Fail(absl::InvalidArgumentError("max-jobs and max-ranks must be >= 1"));
  }
  auto metrics_address = ParseListenAddress(config.metrics_listen);
  if (!metrics_address.ok()) return Fail(metrics_address.status());
  auto grpc_address = ParseListenAddress(config.grpc_listen);
  if (!grpc_address.ok()) return Fail(grpc_address.status());
  std::optional<ListenAddress> ui_address;
  if (!config.ui_listen.empty()) {
    auto parsed = ParseListenAddress(config.ui_listen);
    if (!parsed.ok()) return Fail(parsed.status());
    ui_address = *parsed;
  }

  auto session_timeout = ParseSessionTimeout(config);
  if (!session_timeout.ok()) return Fail(session_timeout.status());

  auto state_dir = StateDir::Open(config.state_dir);
  if (!state_dir.ok()) return Fail(state_dir.status());

  std::unique_ptr<EmbeddedBroker> broker;
  std::string brokers = config.brokers;
  if (brokers.empty()) {
    EmbeddedBrokerOptions broker_options;
    broker_options.topic = config.topic;
    broker_options.partitions = config.embedded_partitions;
    broker_options.control_topic = config.control_topic;
    auto started = EmbeddedBroker::Start(broker_options);
    if (!started.ok()) return Fail(started.status());
    broker = std::move(*started);
    brokers = broker->bootstrap();
    spdlog::warn("*** no --brokers given: running an EMBEDDED in-memory Kafka broker at {} ***",
                 brokers);
    spdlog::warn("*** for development only: its data is lost when rankwatchd stops ***");
    if (auto s = (*state_dir)->WriteFileAtomic("bootstrap", brokers + "\n"); !s.ok()) {
      return Fail(s);
    }
  }

  PrometheusRegistry registry;
  DaemonMetrics metrics(&registry, RANKWATCH_VERSION);
  HeapMetrics heap(&registry);
  SnapshotStore snapshots;
  KernelSnapshotStore kernel_snapshots;  // served at /kernel and by GetRankDetail
  auto metrics_server = MetricsHttpServer::Start(*metrics_address, &registry, &kernel_snapshots);
  if (!metrics_server.ok()) return Fail(metrics_server.status());
  auto store = StateStore::Open({(*state_dir)->path() / "store"});
  if (!store.ok()) return Fail(store.status());
  // After a storage error nothing is committed again: health goes NOT_SERVING, the last good
  // diagnoses stay served. (The gRPC server starts below; it is set before anything is written.)
  std::atomic<GrpcServer*> grpc_for_health{nullptr};
  StateHealth health(&metrics, [&](const absl::Status&) {
    if (GrpcServer* g = grpc_for_health.load()) g->SetStateHealthy(false);
  });
  // Every write of the daemon's state — checkpoints and the alert log — goes through this
  // thread, in order.
  CheckpointWriter writer(
      store->get(), {},
      [&metrics, &store, &heap](const CheckpointCommitStats& stats) {
        metrics.checkpoints->Add(1);
        metrics.checkpoint_seconds->Set(stats.seconds);
        metrics.checkpoint_bytes->Set(static_cast<double>(stats.bytes));
        const StateStore::MemoryUsage memory = (*store)->Memory();
        metrics.state_memtable_bytes->Set(static_cast<double>(memory.memtables));
        metrics.state_table_reader_bytes->Set(static_cast<double>(memory.table_readers));
        metrics.state_block_cache_bytes->Set(static_cast<double>(memory.block_cache));
        heap.Sample();
        spdlog::debug("checkpoint written: {} bytes in {:.3f} ms{}", stats.bytes,
                      stats.seconds * 1e3, stats.flushed ? " (memtables flushed)" : "");
      },
      [&health](const absl::Status& s) { health.Fail(s); });
  AlertHubOptions hub_options;
  hub_options.subscriber_queue = static_cast<size_t>(config.alert_subscriber_queue);
  AlertHub alert_hub(
      store->get(), &writer, hub_options,
      {metrics.alert_subscribers, metrics.alert_subscribers_dropped, metrics.alerts_delivered});
  // Captures: requests to the collectors on the control topic (never blocking: a full local
  // queue refuses the request), answers from the telemetry batches.
  std::unique_ptr<ControlRequestProducer> control_producer;
  std::unique_ptr<CaptureStore> captures;
  std::unique_ptr<HangInspector> hang;
  if (!config.control_topic.empty()) {
    auto producer =
        ControlRequestProducer::Create({brokers, config.control_topic, deadline_s, config.kafka});
    if (!producer.ok()) return Fail(producer.status());
    control_producer = std::move(*producer);
    CaptureStoreOptions capture_options;
    capture_options.default_steps = static_cast<uint32_t>(config.capture_steps);
    capture_options.auto_capture = config.auto_capture;
    capture_options.auto_interval =
        std::chrono::duration_cast<std::chrono::seconds>(*capture_interval);
    capture_options.answer_deadline = deadline_s;
    ControlRequestProducer* p = control_producer.get();
    auto send = [p](const std::string& key, const std::string& payload) {
      return p->Send(key, payload);
    };
    captures = std::make_unique<CaptureStore>(capture_options, send);
    if (config.hang_stacks) hang = std::make_unique<HangInspector>(HangInspectorOptions{}, send);
  }
  GrpcServerOptions grpc_options;
  grpc_options.address = *grpc_address;
  grpc_options.snapshots = &snapshots;
  grpc_options.alerts = &alert_hub;
  grpc_options.kernels = &kernel_snapshots;
  grpc_options.captures = captures.get();
  grpc_options.hang = hang.get();
  grpc_options.state = store->get();
  grpc_options.tls = {config.grpc_tls_cert, config.grpc_tls_key, config.grpc_tls_client_ca};
  auto grpc_server = GrpcServer::Start(grpc_options);
  if (!grpc_server.ok()) return Fail(grpc_server.status());
  grpc_for_health = grpc_server->get();
  if (health.failed()) (*grpc_server)->SetStateHealthy(false);
  std::unique_ptr<WebServer> web_server;
  if (ui_address) {
    WebServerOptions web_options;
    web_options.address = *ui_address;
    web_options.sources = {&snapshots,     &alert_hub, &kernel_snapshots,
                           captures.get(), hang.get(), store->get()};
    web_options.tls = {config.grpc_tls_cert, config.grpc_tls_key, config.grpc_tls_client_ca};
    auto started = WebServer::Start(web_options);
    if (!started.ok()) return Fail(started.status());
    web_server = std::move(*started);
  }
  std::unique_ptr<StateChangelog> changelog;
  if (!config.changelog_topic.empty()) {
    StateChangelogOptions changelog_options;
    changelog_options.brokers = brokers;
    changelog_options.topic = config.changelog_topic;
    changelog_options.source_topic = config.topic;
    changelog_options.properties = config.kafka;
    auto opened = StateChangelog::Open(changelog_options);
    if (!opened.ok()) return Fail(opened.status());
    changelog = std::move(*opened);
    spdlog::info("state changelog: {} (partitions can move between instances of group {})",
                 config.changelog_topic, config.group);
  }

  const std::string metrics_at = (*metrics_server)->address().ToString();
  const std::string grpc_at = (*grpc_server)->address().ToString();
  const std::string ui_at = web_server ? web_server->address().ToString() : "";
  const std::string endpoints =
      "{\"metrics\": \"" + metrics_at + "\", \"grpc\": \"" + grpc_at + "\", \"ui\": \"" + ui_at +
      "\", \"ui_scheme\": \"" + (web_server && web_server->tls() ? "https" : "http") +
      "\", \"brokers\": \"" + brokers + "\", \"pid\": " + std::to_string(::getpid()) + "}\n";
  if (auto s = (*state_dir)->WriteFileAtomic("endpoints.json", endpoints); !s.ok()) return Fail(s);
  spdlog::info(
      "rankwatchd {} ready: metrics http://{}/metrics, gRPC {}, web UI {}, brokers {}, "
      "topic {}",
      RANKWATCH_VERSION, metrics_at, grpc_at,
      web_server ? std::string(web_server->tls() ? "https://" : "http://") + ui_at + "/ui/"
                 : std::string("off"),
      brokers, config.topic);

  JobRouterOptions router_options;
  router_options.topic = config.topic;
  router_options.max_jobs = static_cast<size_t>(config.max_jobs);
  router_options.max_ranks = static_cast<uint64_t>(config.max_ranks);
  PartitionTaskOptions& task_options = router_options.task;
  task_options.pipeline.record_changes = true;
  task_options.job_ttl = *job_ttl;
  task_options.job_retention = *job_retention;
  task_options.pipeline.align.align_timeout = *align_timeout;
  task_options.pipeline.window.steps = static_cast<size_t>(config.window_steps);
  task_options.pipeline.diagnosis = config.step_diagnosis;
  task_options.pipeline.diagnosis.hang_timeout_min = *hang_timeout;
  task_options.pipeline.memory = config.memory_diagnosis;
  if (config.memory_window_steps < 1) {
    return Fail(absl::InvalidArgumentError("memory-diagnosis.window-steps must be >= 1"));
  }
  task_options.pipeline.memory_window.steps = static_cast<size_t>(config.memory_window_steps);
  JobRouter router(router_options, {&metrics, &snapshots, &alert_hub, &kernel_snapshots,
                                    captures.get(), hang.get()});
  TaskManagerOptions manager_options;
  manager_options.checkpoint_max_bytes = static_cast<size_t>(config.checkpoint_budget_mib) << 20;
  TaskManager tasks(config.topic, store->get(), &writer, changelog.get(), &router, &metrics,
                    &health, manager_options);
  if (absl::Status s = tasks.RestoreAll(Clock::now(), WallNowUnixNs()); !s.ok()) {
    return Fail(absl::Status(s.code(), std::string(s.message()) + " (state in " +
                                           (*state_dir)->path().string() +
                                           "; remove --state-dir to start clean)"));
  }
  router.Tick(Clock::now(), WallNowUnixNs());

  const Membership membership =
      ChooseMembership(config, *session_timeout, brokers, broker != nullptr,
                       std::filesystem::absolute((*state_dir)->path()));
  KafkaConsumerOptions consumer_options;
  consumer_options.brokers = brokers;
  consumer_options.topic = config.topic;
  consumer_options.group = config.group;
  consumer_options.instance_id = membership.instance_id;
  consumer_options.session_timeout = membership.session_timeout;
  consumer_options.properties = config.kafka;
  consumer_options.on_assigned = [&](const std::string& topic, const std::vector<int32_t>& ids) {
    if (topic != config.topic) return std::vector<std::optional<int64_t>>(ids.size());
    return tasks.OnAssigned(ids, Clock::now(), WallNowUnixNs());
  };
  consumer_options.on_revoked = [&](const std::string& topic, const std::vector<int32_t>& ids) {
    if (topic == config.topic) tasks.OnRevoked(ids, Clock::now(), WallNowUnixNs());
  };
  consumer_options.on_lost = [&](const std::string& topic, int32_t partition, int64_t expected,
                                 int64_t got) {
    metrics.InputLost(topic, partition)->Add(static_cast<double>(got - expected));
    if (topic == config.topic) router.InputLost(partition, static_cast<uint64_t>(got - expected));
  };
  auto consumer = KafkaConsumer::Create(consumer_options);
  if (!consumer.ok()) return Fail(consumer.status());

#ifndef RANKWATCH_JEMALLOC
  // Built without jemalloc: glibc keeps memory freed after a burst (a backlog after a broker
  // outage, a churned job table) in its arenas, and without a trim the RSS stays at the burst's
  // peak. Every 15 s, off the ingest thread, free pages go back to the system.
  std::jthread trimmer([](std::stop_token stop) {
    std::mutex mu;
    std::condition_variable_any wake;
    std::unique_lock<std::mutex> lock(mu);
    while (true) {
      wake.wait_for(lock, stop, std::chrono::seconds(15), [] { return false; });
      if (stop.stop_requested()) return;
      malloc_trim(0);
    }
  });
#endif

  // Diagnoses (and alerts) are evaluated at most this long after the step that changes them.
  constexpr auto kTick = std::chrono::milliseconds(20);
  auto next_tick = Clock::now();
  auto next_checkpoint = Clock::now() + *checkpoint_interval;
  int exit_code = 0;
  while (!StopRequested()) {
    if (!(*consumer)->fatal_error().ok()) {
      exit_code = Fail((*consumer)->fatal_error());
      break;
    }
    (*consumer)->Poll(std::chrono::milliseconds(20), 1000, [&](const KafkaMessage& m) {
      router.HandleMessage(m.payload, m.partition, m.offset, Clock::now(), WallNowUnixNs());
    });
    if (const TimePoint now = Clock::now(); now >= next_tick) {
      router.Tick(now, WallNowUnixNs());
      metrics.assigned_partitions->Set((*consumer)->assigned_partitions());
      if (hang != nullptr) {
        const HangInspectorCounters h = hang->counters();
        metrics.hang_stacks_requested->Set(static_cast<double>(h.requests));
        metrics.hang_stacks_send_failed->Set(static_cast<double>(h.send_failures));
        metrics.hang_stacks_complete->Set(static_cast<double>(h.settled_all));
        metrics.hang_stacks_partial->Set(static_cast<double>(h.settled_partial));
      }
      next_tick = now + kTick;
    }
    if (Clock::now() >= next_checkpoint) {
      tasks.Checkpoint(Clock::now(), WallNowUnixNs());
      next_checkpoint = Clock::now() + *checkpoint_interval;
    } else {
      tasks.CatchUp(Clock::now(), WallNowUnixNs());
    }
  }

  spdlog::info("stopping");
  tasks.Shutdown(Clock::now(), WallNowUnixNs());
  (*grpc_server)->SetServing(false);
  (*consumer)->Close();
  (*grpc_server)->Stop();
  if (web_server) web_server->Stop();
  (*metrics_server)->Stop();
  spdlog::info("stopped");
  return exit_code;
}

}  // namespace
}  // namespace rankwatch

// protobuf logs an error for every string field that is not UTF-8 when it parses a message
// (the batch is then rejected as malformed, and counted): a hostile producer would flood the
// log. Its lines go to the daemon's log at most once a minute, with the count since.
static void ProtobufLog(google::protobuf::LogLevel level, const char* file, int line,
                        const std::string& message) {
  if (level == google::protobuf::LOGLEVEL_FATAL) {
    spdlog::critical("protobuf {}:{}: {}", file, line, message);
    return;
  }
  static std::mutex mu;
  static std::chrono::steady_clock::time_point logged{};
  static uint64_t since = 0;
  std::lock_guard<std::mutex> lock(mu);
  ++since;
  const auto now = std::chrono::steady_clock::now();
  if (logged != std::chrono::steady_clock::time_point{} && now - logged < std::chrono::minutes(1)) {
    return;
  }
  spdlog::warn("protobuf ({} message{} since the last report): {}", since, since == 1 ? "" : "s",
               message);
  logged = now;
  since = 0;
}

int main(int argc, char** argv) {
  using rankwatch::DaemonConfig;
  rankwatch::InstallStopSignalHandlers();
  rankwatch::SetupLogging("info");
  google::protobuf::SetLogHandler(&ProtobufLog);
  DaemonConfig config;
  const std::string config_file = rankwatch::FindConfigFlag(argc, argv);
  if (!config_file.empty()) {
    if (auto s = rankwatch::LoadDaemonConfigFile(config_file, &config); !s.ok()) {
      std::fprintf(stderr, "rankwatchd: %s\n", std::string(s.message()).c_str());
      return 2;
    }
  }
  CLI::App app{"rankwatchd: live cross-rank diagnosis of distributed training jobs"};
  std::string ignored_config;
  app.add_option("--config", ignored_config, "YAML config file; flags override its keys");
  app.add_option("--brokers", config.brokers,
                 "Kafka bootstrap servers; none = embedded in-memory broker (development)");
  app.add_option("--topic", config.topic, "telemetry topic")->capture_default_str();
  app.add_option("--group", config.group, "Kafka consumer group")->capture_default_str();
  app.add_option("--state-dir", config.state_dir, "state directory")->capture_default_str();
  app.add_option("--metrics-listen", config.metrics_listen, "Prometheus /metrics address")
      ->capture_default_str();
  app.add_option("--grpc-listen", config.grpc_listen, "gRPC service address")
      ->capture_default_str();
  app.add_option("--ui-listen", config.ui_listen,
                 "web UI (/ui/) and JSON API (/api/v1/) address, over TLS with the gRPC TLS "
                 "options; \"\" turns them off")
      ->capture_default_str();
  app.add_option("--embedded-partitions", config.embedded_partitions,
                 "partitions of the embedded broker's topic")
      ->capture_default_str();
  app.add_option("--window-steps", config.window_steps, "aligned steps per diagnosis window (K)")
      ->capture_default_str();
  app.add_option("--align-timeout", config.align_timeout,
                 "close a step with ranks missing after this long (e.g. 10s, 500ms)")
      ->capture_default_str();
  app.add_option("--hang-timeout", config.hang_timeout,
                 "diagnose a hang when no step aligned for max(5 x median step, this)")
      ->capture_default_str();
  app.add_option("--job-ttl", config.job_ttl,
                 "a job without input this long is finished (its diagnosis is frozen)")
      ->capture_default_str();
  app.add_option("--job-retention", config.job_retention,
                 "how long a finished job stays queryable before its state is removed")
      ->capture_default_str();
  app.add_option("--checkpoint-interval", config.checkpoint_interval,
                 "write durable state (and the offsets it covers) this often")
      ->capture_default_str();
  app.add_option("--checkpoint-budget-mib", config.checkpoint_budget_mib,
                 "changes (MiB, estimated) one checkpoint collects on the ingest thread; a "
                 "larger backlog is written over the next rounds")
      ->capture_default_str();
  app.add_option("--changelog-topic", config.changelog_topic,
                 "compacted Kafka topic with a copy of the state: set it (the same on every "
                 "instance) to run several instances in one group")
      ->capture_default_str();
  app.add_option("--control-topic", config.control_topic,
                 "Kafka topic on which rankwatchd asks the collectors for captures (\"\": no "
                 "captures)")
      ->capture_default_str();
  app.add_option("--hang-stacks", config.hang_stacks,
                 "a job diagnosed hung: its ranks are asked for their stacks and collective "
                 "counters (on the control topic)")
      ->capture_default_str();
  app.add_option("--auto-capture", config.auto_capture,
                 "a straggler alert that fires captures its culprit rank and a typical rank")
      ->capture_default_str();
  app.add_option("--capture-steps", config.capture_steps, "steps a capture profiles on each rank")
      ->capture_default_str()
      ->check(CLI::Range(1, 100));
  app.add_option("--capture-interval", config.capture_interval,
                 "at most one automatic capture a job this often")
      ->capture_default_str();
  app.add_option("--capture-deadline", config.capture_deadline,
                 "the collectors must take a capture request this soon (1s..1h); it is not "
                 "retried after")
      ->capture_default_str();
  app.add_option("--grpc-tls-cert", config.grpc_tls_cert,
                 "PEM certificate chain for gRPC over TLS (with --grpc-tls-key)");
  app.add_option("--grpc-tls-key", config.grpc_tls_key, "PEM private key for gRPC over TLS");
  app.add_option("--grpc-tls-client-ca", config.grpc_tls_client_ca,
                 "PEM CA: gRPC clients must present a certificate it signed (mutual TLS)");
  app.add_option("--max-jobs", config.max_jobs,
                 "jobs tracked at most; when full, jobs that have not completed 10 steps are "
                 "evicted to admit new ones, else new jobs are rejected")
      ->capture_default_str();
  app.add_option("--max-ranks", config.max_ranks,
                 "ranks tracked at most, summed over the jobs' world sizes (~2 KiB each before "
                 "any step; more with full windows)")
      ->capture_default_str();
  app.add_option("--alert-subscriber-queue", config.alert_subscriber_queue,
                 "alerts a WatchAlerts subscriber may fall behind before it is disconnected "
                 "(it can resume)")
      ->capture_default_str();
  app.add_option("--log-level", config.log_level, "trace, debug, info, warn, error")
      ->capture_default_str();
  app.add_option("--instance-id", config.instance_id,
                 "static consumer-group membership (group.instance.id): a restarted instance "
                 "with the same id gets its partitions back at once; default: derived from "
                 "$POD_NAME or the host name and the state directory; \"none\": a dynamic "
                 "member (always on the development broker, which does not support it)");
  app.add_option("--session-timeout", config.session_timeout,
                 "a crashed instance's partitions move on after this long (default: 10s; 3s on "
                 "the development broker)");
  app.set_version_flag("--version", RANKWATCH_VERSION);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }
  return rankwatch::Run(config);
}
