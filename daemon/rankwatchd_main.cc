// rankwatchd: consumes telemetry from Kafka, aligns the ranks of every training job step by
// step, and serves Prometheus metrics, the gRPC service and the web UI. main() reads the settings
// (daemon_command_line.h: every value checked before anything binds or writes) and Run() wires
// the runtime together: state, broker, servers, the partition tasks, the consumer, and the loop
// that drives them.
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

#include "alerting/alert_actions.h"
#include "alerting/alertmanager_push.h"
#include "common/logging.h"
#include "common/protobuf_log.h"
#include "common/stop_signal.h"
#include "daemon/allocator.h"
#include "daemon/consumer_group.h"
#include "daemon/daemon_command_line.h"
#include "daemon/daemon_config.h"
#include "evidence/flight_recorder_inspector.h"
#include "fleet/node_ledger.h"
#include "fleet/node_topic.h"
#include "ingest/kafka_consumer.h"
#include "kafka/cluster_requests.h"
#include "kafka/control_request_producer.h"
#include "kafka/embedded_broker.h"
#include "runtime/job_router.h"
#include "runtime/state_health.h"
#include "runtime/task_manager.h"
#include "serving/grpc_server.h"
#include "serving/metrics_http_server.h"
#include "serving/web_server.h"
#include "state/checkpoint_writer.h"
#include "state/state_changelog.h"
#include "state/state_dir.h"
#include "state/state_store.h"

#ifndef RANKWATCH_VERSION
#define RANKWATCH_VERSION "dev"
#endif

namespace rankwatch {

namespace {

int64_t WallNowUnixNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

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
    if (t == topic) router->InputLost(partition, static_cast<uint64_t>(got - expected), log_end);
  };
  return consumer_options;
}

// How pushed alerts and webhooks show alerts: links to the web UI at its external URL (by
// default the UI's own address, with the host's name for a wildcard one) and the runbooks.
AlertPresentationOptions Presentation(const DaemonConfig& config, const WebServer* web_server) {
  AlertPresentationOptions p;
  p.runbook_url = config.alert_runbook_url;
  p.ui_url = config.ui_external_url;
  if (p.ui_url.empty() && web_server != nullptr) {
    const ListenAddress& at = web_server->address();
    const bool wildcard = at.host.empty() || at.host == "0.0.0.0" || at.host == "::";
    const std::string host = wildcard ? HostName() : at.host;
    p.ui_url = std::string(web_server->tls() ? "https://" : "http://") +
               (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" +
               std::to_string(at.port);
  }
  return p;
}

// The outbound paths of the alert log (docs/alerting.md): the Alertmanager push and the action
// policy, each on threads of its own; their state goes through the checkpoint writer.
struct Outbound {
  std::unique_ptr<AlertmanagerPush> alertmanager;
  std::unique_ptr<AlertActions> actions;
};
absl::StatusOr<Outbound> StartOutbound(const DaemonConfig& config, const AlertHub* hub,
                                       const StateStore* store, CheckpointWriter* writer,
                                       PrometheusRegistry* registry, const WebServer* web_server,
                                       bool hang_stacks) {
  Outbound out;
  const AlertPresentationOptions presentation = Presentation(config, web_server);
  auto persist = [writer](Checkpoint c) { writer->EnqueueNoWait(std::move(c), nullptr); };
  if (!config.alertmanager.empty()) {
    AlertmanagerPushOptions o;
    o.urls = config.alertmanager;
    o.http.ca_file = config.alertmanager_ca;
    o.http.basic_auth_file = config.alertmanager_basic_auth_file;
    o.http.bearer_token_file = config.alertmanager_bearer_token_file;
    o.presentation = presentation;
    o.resend_interval =
        std::chrono::duration_cast<std::chrono::milliseconds>(config.alertmanager_resend_interval);
    o.max_backoff = std::min(o.max_backoff, o.resend_interval);
    auto push = AlertmanagerPush::Create(o, hub, store, persist, registry);
    if (!push.ok()) return push.status();
    out.alertmanager = std::move(*push);
    out.alertmanager->Start();
  }
  if (!config.action.empty()) {
    AlertActionsOptions o;
    for (const std::string& text : config.action) o.rules.push_back(*ParseActionRule(text));
    o.webhooks = config.action_webhook;
    o.secret_file = config.action_secret_file;
    o.dry_run = config.action_dry_run;
    o.http.ca_file = config.action_ca;
    o.presentation = presentation;
    // Without hang stacks there is nothing to wait for.
    o.evidence_wait =
        hang_stacks
            ? std::chrono::duration_cast<std::chrono::milliseconds>(config.action_evidence_wait)
            : std::chrono::milliseconds(0);
    auto actions = AlertActions::Create(o, hub, store, persist, registry);
    if (!actions.ok()) return actions.status();
    out.actions = std::move(*actions);
    out.actions->Start();
  }
  return out;
}

// Runs the daemon with settings the settings table has checked; returns the exit code.
int Run(const DaemonConfig& config) {
  SetupLogging(config.log_level);
  // The settings as the startup steps below read them.
  const auto deadline_s = std::chrono::duration_cast<std::chrono::seconds>(config.capture_deadline);
  const Duration* const capture_interval = &config.capture_interval;
  const ListenAddress* const grpc_address = &config.grpc_listen;
  const std::optional<ListenAddress>& ui_address = config.ui_listen;

  auto state_dir = StateDir::Open(config.state_dir);
  if (!state_dir.ok()) return Fail(state_dir.status());

  std::unique_ptr<EmbeddedBroker> broker;
  std::string brokers = config.brokers;
  if (brokers.empty()) {
    EmbeddedBrokerOptions broker_options;
    broker_options.topic = config.topic;
    broker_options.partitions = config.embedded_partitions;
    broker_options.control_topic = config.control_topic;
    broker_options.nodes_topic = config.nodes_topic;
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
  JobExportOptions exports;
  exports.min_steps = static_cast<uint64_t>(config.job_min_steps);
  exports.max_exported = static_cast<size_t>(config.max_exported_jobs);
  DaemonMetrics metrics(&registry, RANKWATCH_VERSION, exports);
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
  AlertHubOptions hub_options;
  hub_options.subscriber_queue = static_cast<size_t>(config.alert_subscriber_queue);
  AlertHub alert_hub(
      store->get(), &writer, hub_options,
      {metrics.alert_subscribers, metrics.alert_subscribers_dropped, metrics.alerts_delivered});
  // Evidence (evidence/): captures, hang stacks and Flight Recorder dumps, requests to the
  // collectors on the control topic (never blocking: a full local queue refuses the request),
  // answers from the telemetry batches. The router calls `evidence` in order: hang stacks first,
  // then the Flight Recorder verdict, so that a hang alert published again with either still
  // gets the other and the newest capture comparison.
  std::unique_ptr<ControlRequestProducer> control_producer;
  std::unique_ptr<CaptureStore> captures;
  std::unique_ptr<HangInspector> hang;
  std::unique_ptr<FlightRecorderInspector> flight_recorder;
  FlightRecorderInspectorOptions fr_options;
  fr_options.settle =
      std::chrono::duration_cast<std::chrono::milliseconds>(config.flight_recorder_settle);
  std::vector<Evidence*> evidence;
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
    if (config.hang_stacks) {
      hang = std::make_unique<HangInspector>(HangInspectorOptions{}, send);
      evidence.push_back(hang.get());
    }
    if (config.flight_recorder) {
      flight_recorder = std::make_unique<FlightRecorderInspector>(fr_options, send);
    }
    evidence.push_back(captures.get());
  }
  // Dumps the node agents publish are analyzed without a control topic too (PyTorch writes them
  // on its watchdog timeout); only the request on a hang needs the topic.
  if (flight_recorder == nullptr) {
    flight_recorder = std::make_unique<FlightRecorderInspector>(fr_options, nullptr);
  }
  // After the hang stacks: a hang alert it publishes again carries the stacks.
  evidence.insert(hang != nullptr ? std::find(evidence.begin(), evidence.end(), hang.get()) + 1
                                  : evidence.begin(),
                  flight_recorder.get());
  // The fleet view of nodes (fleet/): restored from the store, shared through the nodes topic.
  NodeLedgerOptions ledger_options;
  ledger_options.horizon = config.node_horizon;
  ledger_options.alert_window = config.node_alert_window;
  ledger_options.alert_jobs = static_cast<uint32_t>(config.node_alert_jobs);
  NodeLedger ledger(ledger_options);
  if (absl::Status s = ledger.LoadFrom(**store); !s.ok()) return Fail(s);
  std::unique_ptr<NodeTopic> node_topic;
  if (!config.nodes_topic.empty()) {
    auto opened =
        NodeTopic::Open({brokers, config.nodes_topic, config.kafka, config.topic}, &ledger);
    if (opened.ok()) {
      node_topic = std::move(*opened);
    } else {
      spdlog::warn("fleet view of nodes: not shared with other instances: {}",
                   std::string(opened.status().message()));
    }
  }
  if (node_topic == nullptr) ledger.SetComplete(true);
  // The node alerts firing are tracked like a job's firing alerts, under the empty job (the
  // Alertmanager push re-sends only what the hub tracks).
  alert_hub.SetFiring("", ledger.FiringAlertIds());
  GrpcServerOptions grpc_options;
  grpc_options.address = *grpc_address;
  grpc_options.snapshots = &snapshots;
  grpc_options.alerts = &alert_hub;
  grpc_options.kernels = &kernel_snapshots;
  grpc_options.captures = captures.get();
  grpc_options.hang = hang.get();
  grpc_options.flight_recorder = flight_recorder.get();
  grpc_options.state = store->get();
  grpc_options.tls = {config.grpc_tls_cert, config.grpc_tls_key, config.grpc_tls_client_ca};
  grpc_options.nodes = &ledger;
  auto grpc_server = GrpcServer::Start(grpc_options);
  if (!grpc_server.ok()) return Fail(grpc_server.status());
  grpc_for_health = grpc_server->get();
  if (health.failed()) (*grpc_server)->SetStateHealthy(false);
  std::unique_ptr<WebServer> web_server;
  if (ui_address) {
    WebServerOptions web_options;
    web_options.address = *ui_address;
    web_options.sources = {&snapshots, &alert_hub,   &kernel_snapshots,     captures.get(),
                           hang.get(), store->get(), flight_recorder.get(), &ledger};
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

  if (auto s = AnnounceReady(state_dir->get(), **metrics_server, **grpc_server, web_server.get(),
                             brokers, config.topic);
      !s.ok()) {
    return Fail(s);
  }

  JobRouterOptions router_options;
  router_options.topic = config.topic;
  router_options.max_jobs = static_cast<size_t>(config.max_jobs);
  router_options.max_ranks = static_cast<uint64_t>(config.max_ranks);
  PartitionTaskOptions& task_options = router_options.task;
  task_options.pipeline.record_changes = true;
  task_options.job_ttl = config.job_ttl;
  task_options.job_retention = config.job_retention;
  task_options.pipeline.align.align_timeout = config.align_timeout;
  task_options.pipeline.window.steps = static_cast<size_t>(config.window_steps);
  task_options.pipeline.diagnosis = config.step_diagnosis;
  task_options.pipeline.memory = config.memory_diagnosis;
  task_options.pipeline.whatif.analyzer = config.whatif;
  task_options.pipeline.whatif.verdict = config.whatif_verdict;
  task_options.pipeline.memory_window.steps = static_cast<size_t>(config.memory_window_steps);
  JobRouter router(router_options, {&metrics, &snapshots, &alert_hub, &kernel_snapshots,
                                    std::move(evidence), &ledger});
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
  // After the restore: the restored jobs' firing alerts are the hub's again.
  auto outbound = StartOutbound(config, &alert_hub, store->get(), &writer, &registry,
                                web_server.get(), hang != nullptr);
  if (!outbound.ok()) return Fail(outbound.status());

  const bool development_broker =
      broker != nullptr || IsDevelopmentBroker(brokers, config.kafka, std::chrono::seconds(10));
  const GroupMembership membership =
      ChooseGroupMembership(config.instance_id, config.session_timeout, development_broker,
                            HostName(), std::filesystem::absolute((*state_dir)->path()).string());
  spdlog::info("{}", DescribeGroupMembership(membership, config.group, development_broker));
  const KafkaConsumerOptions consumer_options =
      ConsumerOptions(config, brokers, membership, &tasks, &router, &metrics);
  auto consumer = KafkaConsumer::Create(consumer_options);
  if (!consumer.ok()) return Fail(consumer.status());

  std::jthread trimmer = StartHeapTrimmer();  // without jemalloc: returns freed memory

  // Diagnoses (and alerts) are evaluated at most this long after the step that changes them.
  constexpr auto kTick = std::chrono::milliseconds(20);
  auto next_tick = Clock::now();
  auto next_checkpoint = Clock::now() + config.checkpoint_interval;
  // Changes wait in memory for the next checkpoint: reading a backlog at a million records a
  // second, a second of them took ~280 MiB of heap. While the daemon reads a backlog (the
  // consumer woke its fetcher, its queue full, within the last kBacklogFor), a checkpoint is
  // also due after this much input. A daemon keeping up checkpoints on the interval only.
  const size_t checkpoint_input_bytes = static_cast<size_t>(config.checkpoint_input_mib) << 20;
  constexpr auto kBacklogFor = std::chrono::seconds(2);
  size_t input_since_checkpoint = 0;
  uint64_t wakeups_seen = 0;
  TimePoint last_wakeup{};
  auto next_fleet = Clock::now();
  TimePoint assigned_since{};  // since when the consumer holds partitions (none: {})
  // The telemetry partition count, for the instance that raises a node's alert.
  const int32_t telemetry_partitions =
      node_topic != nullptr ? node_topic->telemetry_partitions() : 0;
  auto owns_node = [&](const std::string& node) {
    return telemetry_partitions <= 0 || router.Owns(PartitionOfNode(node, telemetry_partitions));
  };
  int exit_code = 0;
  while (!StopRequested()) {
    if (!(*consumer)->fatal_error().ok()) {
      exit_code = Fail((*consumer)->fatal_error());
      break;
    }
    (*consumer)->Poll(std::chrono::milliseconds(20), 1000, [&](const KafkaMessage& m) {
      router.HandleMessage(m.payload, m.partition, m.offset, Clock::now(), WallNowUnixNs());
      input_since_checkpoint += m.payload.size();
    });
    if (const TimePoint now = Clock::now(); now >= next_tick) {
      router.Tick(now, WallNowUnixNs());
      metrics.assigned_partitions->Set((*consumer)->assigned_partitions());
      metrics.kafka_fetch_wakeups->Set(static_cast<double>((*consumer)->fetch_wakeups()));
      if (hang != nullptr) {
        const HangInspectorCounters h = hang->counters();
        metrics.hang_stacks_requested->Set(static_cast<double>(h.requests));
        metrics.hang_stacks_send_failed->Set(static_cast<double>(h.send_failures));
        metrics.hang_stacks_complete->Set(static_cast<double>(h.settled_all));
        metrics.hang_stacks_partial->Set(static_cast<double>(h.settled_partial));
      }
      const FlightRecorderInspectorCounters fr = flight_recorder->counters();
      metrics.fr_dumps_kept->Set(static_cast<double>(fr.dumps));
      metrics.fr_dumps_dropped->Set(static_cast<double>(fr.dumps_dropped));
      metrics.fr_requested->Set(static_cast<double>(fr.requests));
      metrics.fr_send_failed->Set(static_cast<double>(fr.send_failures));
      metrics.fr_analyses->Set(static_cast<double>(fr.analyses));
      next_tick = now + kTick;
    }
    if (const TimePoint now = Clock::now(); now >= next_fleet) {
      next_fleet = now + std::chrono::seconds(1);
      const int64_t wall = WallNowUnixNs();
      if ((*consumer)->assigned_partitions() == 0) {
        assigned_since = {};
      } else if (assigned_since == TimePoint{}) {
        assigned_since = now;
      }
      ledger.Prune(wall);
      std::vector<v1::NodeRecord> records = ledger.TakeUnpublished();
      if (node_topic != nullptr) {
        node_topic->Publish(records);
        metrics.nodes_topic_published->Set(static_cast<double>(node_topic->published()));
        metrics.nodes_topic_failed->Set(static_cast<double>(node_topic->failed()));
        metrics.nodes_topic_read->Set(static_cast<double>(node_topic->read()));
        metrics.nodes_topic_ignored->Set(static_cast<double>(node_topic->ignored()));
      }
      // Node alerts once the view is whole and the partitions held a while (a restart must
      // neither resolve an alert on a partial view nor drop one as another instance's).
      if (ledger.complete() && assigned_since != TimePoint{} &&
          now - assigned_since >= std::chrono::seconds(5)) {
        Checkpoint state;
        std::vector<v1::Alert> alerts = ledger.EvaluateAlerts(wall, owns_node, &state);
        if (!alerts.empty() || !state.empty())
          alert_hub.Append(std::move(alerts), std::move(state));
      }
      v1::ListNodesRequest top;
      top.set_limit(static_cast<uint32_t>(std::max<int64_t>(1, config.max_exported_nodes)));
      v1::ListNodesResponse costliest = ledger.ListNodes(top, wall);
      if (config.max_exported_nodes == 0) costliest.clear_nodes();  // the count only
      metrics.PublishNodes(costliest);
      metrics.fleet_records->Set(static_cast<double>(ledger.records()));
      metrics.node_alerts_firing->Set(static_cast<double>(ledger.firing()));
      // Another instance may have resolved (or raised) a node alert: the nodes topic says so.
      alert_hub.SetFiring("", ledger.FiringAlertIds());
    }
    if (const uint64_t wakeups = (*consumer)->fetch_wakeups(); wakeups != wakeups_seen) {
      wakeups_seen = wakeups;
      last_wakeup = Clock::now();
    }
    const bool backlog = wakeups_seen > 0 && Clock::now() - last_wakeup < kBacklogFor;
    if (Clock::now() >= next_checkpoint ||
        (backlog && input_since_checkpoint >= checkpoint_input_bytes)) {
      tasks.Checkpoint(Clock::now(), WallNowUnixNs());
      if (Checkpoint nodes = ledger.TakeUnsaved(); !nodes.empty()) {
        writer.EnqueueNoWait(std::move(nodes), nullptr);
      }
      next_checkpoint = Clock::now() + config.checkpoint_interval;
      input_since_checkpoint = 0;
    } else {
      tasks.CatchUp(Clock::now(), WallNowUnixNs());
    }
  }

  spdlog::info("stopping");
  tasks.Shutdown(Clock::now(), WallNowUnixNs());
  // The last charges reach the other instances (NodeTopic's destructor waits for delivery).
  if (node_topic != nullptr) node_topic->Publish(ledger.TakeUnpublished());
  if (Checkpoint nodes = ledger.TakeUnsaved(); !nodes.empty()) {
    writer.EnqueueNoWait(std::move(nodes), nullptr);
  }
  (void)writer.Drain();
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

int main(int argc, char** argv) {
  rankwatch::InstallStopSignalHandlers();
  rankwatch::SetupLogging("info");
  rankwatch::RouteProtobufLogs();
  const rankwatch::CommandLine command_line =
      rankwatch::ReadCommandLine(argc, argv, RANKWATCH_VERSION, std::cout, std::cerr);
  if (command_line.exit_code >= 0) return command_line.exit_code;
  return rankwatch::Run(command_line.config);
}
