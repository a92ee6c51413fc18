// rankwatchd: consumes telemetry from Kafka, aligns the ranks of every training job step by
// step, and serves Prometheus metrics, the gRPC service and the web UI. main() reads the settings
// (daemon_command_line.h: every value checked before anything binds or writes) and Run() wires
// the runtime together: state, broker, the daemon's parts (Parts(): each feature wires itself,
// parts/daemon_part.h), servers, the partition tasks, the consumer, and the loop that polls it
// and runs the duties that fall due.
#include <spdlog/spdlog.h>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "alerting/alert_hub.h"
#include "alerting/alerting_part.h"
#include "common/logging.h"
#include "common/protobuf_log.h"
#include "common/stop_signal.h"
#include "common/wall_clock.h"
#include "daemon/allocator.h"
#include "daemon/consumer_group.h"
#include "daemon/daemon_command_line.h"
#include "daemon/daemon_config.h"
#include "evidence/evidence_part.h"
#include "fleet/fleet_part.h"
#include "ingest/kafka_consumer.h"
#include "kafka/cluster_requests.h"
#include "kafka/embedded_broker.h"
#include "metrics/daemon_metrics.h"
#include "parts/part_runtime.h"
#include "runtime/checkpoint_pacer.h"
#include "runtime/job_router.h"
#include "runtime/state_health.h"
#include "runtime/task_manager.h"
#include "serving/grpc_server.h"
#include "serving/metrics_http_server.h"
#include "serving/web_server.h"
#include "state/changelog_part.h"
#include "state/checkpoint_writer.h"
#include "state/state_changelog.h"
#include "state/state_dir.h"
#include "state/state_store.h"

#ifndef RANKWATCH_VERSION
#define RANKWATCH_VERSION "dev"
#endif

namespace rankwatch {

namespace {

int Fail(const absl::Status& s) {
  spdlog::error("{}", std::string(s.message()));
  return 1;
}

// The metrics of a checkpoint the writer committed: its own, the state store's memory, the heap.
void RecordCheckpoint(const CheckpointCommitStats& stats, const StateStore::MemoryUsage& memory,
                      DaemonMetrics* metrics, HeapMetrics* heap) {
  metrics->checkpoints->Add(1);
  metrics->checkpoint_seconds->Set(stats.seconds);
  metrics->checkpoint_bytes->Set(static_cast<double>(stats.bytes));
  metrics->state_memtable_bytes->Set(static_cast<double>(memory.memtables));
  metrics->state_table_reader_bytes->Set(static_cast<double>(memory.table_readers));
  metrics->state_block_cache_bytes->Set(static_cast<double>(memory.block_cache));
  heap->Sample();
  spdlog::debug("checkpoint written: {} bytes in {:.3f} ms{}", stats.bytes, stats.seconds * 1e3,
                stats.flushed ? " (memtables flushed)" : "");
}

// Writes STATE_DIR/endpoints.json (the bound addresses, where tools and tests find them; port 0
// is resolved there) and logs the ready line.
absl::Status AnnounceReady(StateDir* state_dir, const MetricsHttpServer& metrics_server,
                           const GrpcServer& grpc_server, const WebServer* web_server,
                           const std::string& brokers, const std::string& topic) {
  const std::string metrics_at = metrics_server.address().ToString();
  const std::string grpc_at = grpc_server.address().ToString();
  const std::string ui_at = web_server ? web_server->address().ToString() : "";
  const std::string endpoints =
      "{\"metrics\": \"" + metrics_at + "\", \"grpc\": \"" + grpc_at + "\", \"ui\": \"" + ui_at +
      "\", \"ui_scheme\": \"" + (web_server && web_server->tls() ? "https" : "http") +
      "\", \"brokers\": \"" + brokers + "\", \"pid\": " + std::to_string(::getpid()) + "}\n";
  if (auto s = state_dir->WriteFileAtomic("endpoints.json", endpoints); !s.ok()) return s;
  spdlog::info(
      "rankwatchd {} ready: metrics http://{}/metrics, gRPC {}, web UI {}, brokers {}, "
      "topic {}",
      RANKWATCH_VERSION, metrics_at, grpc_at,
      web_server ? std::string(web_server->tls() ? "https://" : "http://") + ui_at + "/ui/"
                 : std::string("off"),
      brokers, topic);
  return absl::OkStatus();
}

// The consumer of the telemetry topic: its group membership, and the partition tasks taking
// over, handing on and counting lost input as partitions are assigned, revoked and lost.
KafkaConsumerOptions ConsumerOptions(const DaemonConfig& config, const std::string& brokers,
                                     const GroupMembership& membership, TaskManager* tasks,
                                     JobRouter* router, DaemonMetrics* metrics) {
  KafkaConsumerOptions consumer_options;
  consumer_options.brokers = brokers;
  consumer_options.topic = config.topic;
  consumer_options.group = config.group;
  consumer_options.instance_id = membership.instance_id;
  consumer_options.session_timeout = membership.session_timeout;
  consumer_options.properties = config.kafka;
  const std::string topic = config.topic;
  consumer_options.on_assigned = [topic, tasks](const std::string& t,
                                                const std::vector<int32_t>& ids) {
    if (t != topic) return std::vector<std::optional<int64_t>>(ids.size());
    return tasks->OnAssigned(ids, Clock::now(), WallNowUnixNs());
  };
  consumer_options.on_revoked = [topic, tasks](const std::string& t,
                                               const std::vector<int32_t>& ids) {
    if (t == topic) tasks->OnRevoked(ids, Clock::now(), WallNowUnixNs());
  };
  consumer_options.on_start = [topic, router](const std::string& t, int32_t partition,
                                              int64_t offset) {
    if (t == topic) router->StartsAt(partition, offset);
  };
  consumer_options.on_lost = [topic, router, metrics](const std::string& t, int32_t partition,
                                                      int64_t expected, int64_t got,
                                                      int64_t log_end) {
    metrics->InputLost(t, partition)->Add(static_cast<double>(got - expected));
    metrics->InputLossEvents(t, partition)->Add(1);
    if (t == topic) router->InputLost(partition, static_cast<uint64_t>(got - expected), log_end);
  };
  return consumer_options;
}

// The daemon's parts, from the settings (docs/architecture.md, "Parts"): each line a feature that
// wires itself through the DaemonPart socket; their order is the order they start and hook the
// tick.
std::vector<std::unique_ptr<DaemonPart>> Parts(const DaemonConfig& config) {
  std::vector<std::unique_ptr<DaemonPart>> parts;
  parts.push_back(std::make_unique<EvidencePart>(config.evidence));
  parts.push_back(std::make_unique<FleetPart>(config.fleet));
  parts.push_back(std::make_unique<AlertingPart>(config.alerting));
  parts.push_back(std::make_unique<ChangelogPart>(config.changelog));
  return parts;
}

// Without --brokers: an embedded in-memory broker, its address kept in STATE_DIR/bootstrap.
absl::StatusOr<std::unique_ptr<EmbeddedBroker>> StartEmbeddedBroker(const DaemonConfig& config,
                                                                    StateDir* state_dir) {
  EmbeddedBrokerOptions o;
  o.topic = config.topic;
  o.partitions = config.embedded_partitions;
  o.control_topic = config.evidence.control_topic;
  o.nodes_topic = config.fleet.nodes_topic;
  auto broker = EmbeddedBroker::Start(o);
  if (!broker.ok()) return broker.status();
  const std::string brokers = (*broker)->bootstrap();
  spdlog::warn("*** no --brokers given: running an EMBEDDED in-memory Kafka broker at {} ***",
               brokers);
  spdlog::warn("*** for development only: its data is lost when rankwatchd stops ***");
  if (auto s = state_dir->WriteFileAtomic("bootstrap", brokers + "\n"); !s.ok()) return s;
  return broker;
}

// The web UI's URL for links (alerts pushed, webhooks): its own address, with the host's name
// for a wildcard one; "" without a UI.
std::string UiUrl(const WebServer* web_server) {
  if (web_server == nullptr) return "";
  const ListenAddress& at = web_server->address();
  const bool wildcard = at.host.empty() || at.host == "0.0.0.0" || at.host == "::";
  const std::string host = wildcard ? HostName() : at.host;
  return std::string(web_server->tls() ? "https://" : "http://") +
         (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" +
         std::to_string(at.port);
}

// The runtime's options (runtime/job_router.h) from the settings: the job table's bounds, a
// job's lifetime, its operators.
JobRouterOptions RouterOptions(const DaemonConfig& config) {
  JobRouterOptions o;
  o.topic = config.topic;
  o.max_jobs = static_cast<size_t>(config.max_jobs);
  o.max_ranks = static_cast<uint64_t>(config.max_ranks);
  o.ingest_threads = static_cast<size_t>(config.ingest_threads);
  o.task.pipeline.record_changes = true;
  o.task.job_ttl = config.job_ttl;
  o.task.job_retention = config.job_retention;
  o.task.pipeline.align.align_timeout = config.align_timeout;
  o.task.pipeline.window.steps = static_cast<size_t>(config.window_steps);
  o.task.pipeline.diagnosis = config.step_diagnosis;
  o.task.pipeline.memory = config.memory_diagnosis;
  o.task.pipeline.whatif.analyzer = config.whatif;
  o.task.pipeline.whatif.verdict = config.whatif_verdict;
  o.task.pipeline.memory_window.steps = static_cast<size_t>(config.memory_window_steps);
  return o;
}

// What the daemon shares with its parts.
PartEnvironment Environment(const DaemonConfig& config, const std::string& brokers,
                            AlertHub* alerts, StateStore* store, CheckpointWriter* writer,
                            PrometheusRegistry* registry) {
  PartEnvironment e;
  e.brokers = brokers;
  e.telemetry_topic = config.topic;
  e.group = config.group;
  e.kafka = config.kafka;
  e.alerts = alerts;
  e.store = store;
  e.writer = writer;
  e.registry = registry;
  return e;
}

// The consumer group's membership of this instance (static where it can be), logged.
GroupMembership Membership(const DaemonConfig& config, const std::string& brokers,
                           bool embedded_broker, const std::filesystem::path& state_dir) {
  const bool development_broker =
      embedded_broker || IsDevelopmentBroker(brokers, config.kafka, std::chrono::seconds(10));
  GroupMembership membership =
      ChooseGroupMembership(config.instance_id, config.session_timeout, development_broker,
                            HostName(), std::filesystem::absolute(state_dir).string());
  spdlog::info("{}", DescribeGroupMembership(membership, config.group, development_broker));
  return membership;
}

// Which partitions this instance owns, as the parts see it: the router's tasks, the consumer's
// assignment.
class ConsumerPartitions : public PartitionOwnership {
 public:
  ConsumerPartitions(const JobRouter* router, const KafkaConsumer* consumer)
      : router_(router), consumer_(consumer) {}
  bool Owns(int32_t partition) const override { return router_->Owns(partition); }
  int assigned() const override { return consumer_->assigned_partitions(); }

 private:
  const JobRouter* router_;
  const KafkaConsumer* consumer_;
};

// Runs the daemon with settings the settings table has checked; returns the exit code.
int Run(const DaemonConfig& config) {
  SetupLogging(config.log_level);
  auto state_dir = StateDir::Open(config.state_dir);
  if (!state_dir.ok()) return Fail(state_dir.status());
  std::unique_ptr<EmbeddedBroker> broker;
  std::string brokers = config.brokers;
  if (brokers.empty()) {
    auto started = StartEmbeddedBroker(config, state_dir->get());
    if (!started.ok()) return Fail(started.status());
    broker = std::move(*started);
    brokers = broker->bootstrap();
  }

  PrometheusRegistry registry;
  DaemonMetrics metrics(
      &registry, RANKWATCH_VERSION,
      {static_cast<uint64_t>(config.job_min_steps), static_cast<size_t>(config.max_exported_jobs)});
  HeapMetrics heap(&registry);
  SnapshotStore snapshots;
  KernelSnapshotStore kernel_snapshots;  // served at /kernel and by GetRankDetail
  auto metrics_server =
      MetricsHttpServer::Start(config.metrics_listen, &registry, &kernel_snapshots);
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
        RecordCheckpoint(stats, (*store)->Memory(), &metrics, &heap);
      },
      [&health](const absl::Status& s) { health.Fail(s); });
  AlertHub alert_hub(
      store->get(), &writer,
      {.subscriber_queue = static_cast<size_t>(config.alert_subscriber_queue)},
      {metrics.alert_subscribers, metrics.alert_subscribers_dropped, metrics.alerts_delivered});
  // The features, each wired through its part (parts/daemon_part.h).
  PartRuntime parts(Parts(config),
                    Environment(config, brokers, &alert_hub, store->get(), &writer, &registry));
  if (absl::Status s = parts.Start(); !s.ok()) return Fail(s);

  const QuerySources sources{&snapshots, &alert_hub, &kernel_snapshots, store->get(),
                             &parts.services()};
  const GrpcTlsOptions tls{config.grpc_tls_cert, config.grpc_tls_key, config.grpc_tls_client_ca};
  auto grpc_server = GrpcServer::Start({config.grpc_listen, sources, &alert_hub, tls});
  if (!grpc_server.ok()) return Fail(grpc_server.status());
  grpc_for_health = grpc_server->get();
  if (health.failed()) (*grpc_server)->SetStateHealthy(false);
  std::unique_ptr<WebServer> web_server;
  if (config.ui_listen) {
    auto started = WebServer::Start(
        {*config.ui_listen, sources, {tls.cert_file, tls.key_file, tls.client_ca_file}});
    if (!started.ok()) return Fail(started.status());
    web_server = std::move(*started);
  }
  parts.environment().ui_url = UiUrl(web_server.get());
  if (auto s = AnnounceReady(state_dir->get(), **metrics_server, **grpc_server, web_server.get(),
                             brokers, config.topic);
      !s.ok()) {
    return Fail(s);
  }

  JobRouter router(RouterOptions(config),
                   {&metrics, &snapshots, &alert_hub, &kernel_snapshots, parts.hooks()});
  TaskManager tasks(config.topic, store->get(), &writer, parts.services().Find<StateChangelog>(),
                    &router, &metrics, &health,
                    {static_cast<size_t>(config.checkpoint_budget_mib) << 20});
  if (absl::Status s = tasks.RestoreAll(Clock::now(), WallNowUnixNs()); !s.ok()) {
    return Fail(absl::Status(s.code(), std::string(s.message()) + " (state in " +
                                           (*state_dir)->path().string() +
                                           "; remove --state-dir to start clean)"));
  }
  router.Tick(Clock::now(), WallNowUnixNs());

  const GroupMembership membership =
      Membership(config, brokers, broker != nullptr, (*state_dir)->path());
  auto consumer = KafkaConsumer::Create(
      ConsumerOptions(config, brokers, membership, &tasks, &router, &metrics));
  if (!consumer.ok()) return Fail(consumer.status());
  const ConsumerPartitions partitions(&router, consumer->get());
  parts.environment().partitions = &partitions;
  // After the restore: the restored jobs' firing alerts are the alert log's again.
  if (absl::Status s = parts.Restored(); !s.ok()) return Fail(s);

  std::jthread trimmer = StartHeapTrimmer();  // without jemalloc: returns freed memory

  // The runtime's duties, after the parts' (main's loop times none itself): a job's diagnosis
  // (and alerts) at most kTick after its step; checkpoints, early on a backlog; catching up.
  constexpr auto kTick = std::chrono::milliseconds(20);
  DutyScheduler& duties = parts.duties();
  KafkaConsumer& input = **consumer;
  // Whether the last poll found no input within its wait: evaluations then take no time from
  // input (a backlog just read is evaluated at once, not at the fleet's share of a busy thread).
  bool input_idle = false;
  duties.Schedule("tick", kTick, [&](TimePoint now) {
    router.Tick(now, WallNowUnixNs(), input_idle);
    metrics.assigned_partitions->Set(input.assigned_partitions());
    metrics.kafka_fetch_wakeups->Set(static_cast<double>(input.fetch_wakeups()));
    std::vector<DaemonMetrics::InputPartition> lags;
    for (const KafkaConsumer::PartitionLag& p :
         input.PartitionLags(DaemonMetrics::kInputLosingWindow)) {
      lags.push_back({p.partition, p.messages, p.losing});
    }
    metrics.PublishInputPartitions(config.topic, lags);
  });
  CheckpointPacer pacer(static_cast<size_t>(config.checkpoint_input_mib) << 20);
  const DutyScheduler::Id checkpoint = duties.Schedule(
      "checkpoint", config.checkpoint_interval,
      [&](TimePoint now) {
        tasks.Checkpoint(now, WallNowUnixNs());
        parts.Checkpoint();
        pacer.Checkpointed();
      },
      config.checkpoint_interval);
  duties.Schedule("catch-up", Duration(0), [&](TimePoint now) {
    if (pacer.Due(input.fetch_wakeups(), now)) {
      duties.Hurry(checkpoint);
    } else {
      tasks.CatchUp(now, WallNowUnixNs());
    }
  });
  int exit_code = 0;
  std::vector<JobRouter::Message> batch;  // a poll's messages
  while (!StopRequested()) {
    if (!input.fatal_error().ok()) {
      exit_code = Fail(input.fatal_error());
      break;
    }
    input_idle = input.PollBatch(std::chrono::milliseconds(20), 1000,
                                 [&](const std::vector<KafkaMessage>& messages) {
                                   batch.clear();
                                   for (const KafkaMessage& m : messages) {
                                     batch.push_back({m.payload, m.partition, m.offset, m.key});
                                     pacer.Read(m.payload.size());
                                   }
                                   router.HandleMessages(batch, &Clock::now, &WallNowUnixNs);
                                 }) == 0;
    duties.RunDue();
  }

  spdlog::info("stopping");
  tasks.Shutdown(Clock::now(), WallNowUnixNs());
  parts.Stop();
  (void)writer.Drain();
  (*grpc_server)->SetServing(false);
  input.Close();
  (*grpc_server)->Stop();
  if (web_server) web_server->Stop();
  (*metrics_server)->Stop();
  spdlog::info("stopped");
  return exit_code;
}

}  // namespace
}  // namespace rankwatch

int main(int argc, char** argv) {
  rankwatch::InstallStopSignalHandlers();
  rankwatch::SetupLogging("info");
  rankwatch::RouteProtobufLogs();
  const rankwatch::CommandLine command_line =
      rankwatch::ReadCommandLine(argc, argv, RANKWATCH_VERSION, std::cout, std::cerr);
  if (command_line.exit_code >= 0) return command_line.exit_code;
  return rankwatch::Run(command_line.config);
}
