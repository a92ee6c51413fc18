#include "daemon/daemon_settings.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>

#include "alerting/alert_actions.h"
#include "alerting/outbound_http.h"
#include "daemon/consumer_group.h"

namespace rankwatch {
namespace {

using std::chrono::hours;
using std::chrono::seconds;

absl::Status NotEmpty(const std::string& value) {
  if (!value.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError("must not be empty");
}

// A file named by a setting must be readable when the daemon starts, not later, when it opens
// it with its listeners half started.
absl::Status ReadableFile(const std::string& path) {
  if (path.empty() || ::access(path.c_str(), R_OK) == 0) return absl::OkStatus();
  return absl::InvalidArgumentError("cannot read '" + path + "': " + std::strerror(errno));
}

absl::Status LogLevel(const std::string& level) {
  for (const char* known : {"trace", "debug", "info", "warn", "error", "critical", "off"}) {
    if (level == known) return absl::OkStatus();
  }
  return absl::InvalidArgumentError("unknown log level '" + level +
                                    "' (trace, debug, info, warn, error, critical, off)");
}

// Kafka takes [a-zA-Z0-9._-], at most 249 characters, in a group.instance.id.
absl::Status InstanceId(const std::string& id) {
  const bool allowed = std::all_of(id.begin(), id.end(), [](char ch) {
    return std::isalnum(static_cast<unsigned char>(ch)) || ch == '.' || ch == '_' || ch == '-';
  });
  if (allowed && id.size() <= 249) return absl::OkStatus();
  return absl::InvalidArgumentError("'" + id +
                                    "' is not a Kafka instance id ([a-zA-Z0-9._-], at most 249)");
}

absl::Status HttpUrlItem(const std::string& url) { return ParseHttpUrl(url).status(); }

absl::Status ActionRuleItem(const std::string& rule) { return ParseActionRule(rule).status(); }

std::vector<Setting> BuildSettings() {
  using D = DaemonConfig;
  using Step = StepDiagnosisOptions;
  using Memory = MemoryDiagnosisOptions;
  using WhatIf = whatif::Options;
  using WhatIfVerdict = whatif::VerdictOptions;
  const std::string session_default =
      SettingValue<Duration>::Format(kClusterSessionTimeout) + " (" +
      SettingValue<Duration>::Format(kDevelopmentSessionTimeout) + " on the development broker)";
  return {
      Declare("brokers", &D::brokers)
          .DefaultNote("embedded")
          .Help("Kafka bootstrap servers; none: an embedded in-memory broker (development)"),
      Declare("topic", &D::topic).Require(NotEmpty).Help("telemetry topic"),
      Declare("group", &D::group)
          .Require(NotEmpty)
          .Help("Kafka consumer group; several instances share its partitions"),
      Declare("state-dir", &D::state_dir)
          .Require(NotEmpty)
          .Help("state directory, locked for the daemon's life"),
      Declare("metrics-listen", &D::metrics_listen)
          .Help("HTTP: Prometheus `/metrics`, `/kernel`, `/healthz`"),
      Declare("grpc-listen", &D::grpc_listen)
          .Help("gRPC: `rankwatch.v1.RankWatch`, `grpc.health.v1.Health`, reflection"),
      Declare("ui-listen", &D::ui_listen)
          .Help("HTTP(S): the web UI at `/ui/` and its JSON API at `/api/v1/`, over TLS with the "
                "gRPC TLS settings; `\"\"` turns both off")
          .Details(" ([web-ui.md](web-ui.md))"),
      Declare("window-steps", &D::window_steps)
          .AtLeast(1)
          .Help("aligned steps per diagnosis window (K)"),
      Declare("align-timeout", &D::align_timeout)
          .Help("a step with ranks missing closes this long after its first record"),
      Declare("hang-timeout", &D::step_diagnosis, &Step::hang_timeout_min)
          .Help("a job is `hang` when no step aligned for max(`hang-timeout-steps` × median step "
                "time, this)"),
      Declare("checkpoint-interval", &D::checkpoint_interval)
          .Help("how often durable state and the offsets it covers are written"),
      Declare("checkpoint-budget-mib", &D::checkpoint_budget_mib)
          .Within(1, 65536)
          .Help("changes (MiB, estimated) one checkpoint collects on the ingest thread, whole "
                "partitions; the rest follows in the next rounds")
          .Details(", at the writer's pace"),
      Declare("checkpoint-input-mib", &D::checkpoint_input_mib)
          .Within(1, 65536)
          .Help("while the daemon reads a backlog, telemetry read (MiB of messages) after which "
                "a checkpoint is written before `checkpoint-interval` has passed: bounds the "
                "changes held in memory"),
      Declare("ingest-threads", &D::ingest_threads)
          .Within(1, 64)
          .Help("threads that handle the telemetry of different partitions at once, the ingest "
                "thread included (one partition's messages stay in order on one thread)"),
      Declare("changelog-topic", &D::changelog, &ChangelogPartOptions::topic)
          .DefaultNote("none")
          .Help("compacted Kafka topic with a copy of the state, so partitions can move between "
                "instances; set the same on every instance of a group"),
      Declare("control-topic", &D::evidence, &EvidencePartOptions::control_topic)
          .Help("topic on which rankwatchd asks the collectors for captures, hang stacks and "
                "Flight Recorder dumps; `\"\"` turns them off")
          .Details(" ([formats.md](formats.md#control-channel-rankwatchcontrol)); the capture "
                   "calls then answer `UNAVAILABLE`"),
      Declare("hang-stacks", &D::evidence, &EvidencePartOptions::hang_stacks)
          .Help("a job diagnosed hung: its ranks are asked for their stacks and collective "
                "counters (on the control topic)")
          .Details(" ([diagnoses.md](diagnoses.md#hang-stacks))"),
      Declare("flight-recorder", &D::evidence, &EvidencePartOptions::flight_recorder)
          .Help("a job diagnosed hung: its ranks are asked for their PyTorch Flight Recorder "
                "dumps (on the control topic); the dumps node agents publish are analyzed either "
                "way")
          .Details(" ([diagnoses.md](diagnoses.md#flight-recorder))"),
      Declare("flight-recorder-settle", &D::evidence, &EvidencePartOptions::flight_recorder_settle)
          .Within(seconds(0), std::chrono::minutes(10))
          .Help("a job's Flight Recorder dumps are analyzed once every rank's came, or this long "
                "after the newest one"),
      Declare("auto-capture", &D::evidence, &EvidencePartOptions::auto_capture)
          .Help("a straggler alert that fires captures its culprit rank and a typical rank")
          .Details(" (the median non-culprit rank by compute time)"),
      Declare("capture-steps", &D::evidence, &EvidencePartOptions::capture_steps)
          .Within(1, 100)
          .Help("steps a capture profiles on each rank"),
      Declare("capture-interval", &D::evidence, &EvidencePartOptions::capture_interval)
          .Help("at most one automatic capture per job this often"),
      Declare("capture-deadline", &D::evidence, &EvidencePartOptions::capture_deadline)
          .Within(seconds(1), hours(1))
          .Help("the collectors must take a capture request this soon: a request the broker "
                "has not taken by then is dropped, not retried")
          .Details("; a capture whose ranks have not answered by then expires, naming them; an "
                   "accepted capture has until three times its steps at the ranks' step time "
                   "after that, at least a minute"),
      Declare("job-ttl", &D::job_ttl)
          .Help("a job without input this long is finished: its last diagnosis is frozen"),
      Declare("job-retention", &D::job_retention)
          .Help("a finished job stays queryable this long; then the job, its metrics and its "
                "state go"),
      Declare("embedded-partitions", &D::embedded_partitions)
          .Within(1, 1000)
          .Help("partitions of the embedded broker's topic"),
      Declare("max-jobs", &D::max_jobs)
          .AtLeast(1)
          .Help("jobs tracked at most; when full, jobs that have not completed 10 steps are "
                "evicted to admit new ones (ids that are not (yet) jobs first), else new jobs are "
                "rejected")
          .Details(" (`too_many_jobs`)"),
      Declare("max-ranks", &D::max_ranks)
          .AtLeast(1)
          .Help("ranks tracked at most, summed over the jobs' world sizes (~2 KiB per rank "
                "before any step, more once windows fill)"),
      Declare("job-min-steps", &D::job_min_steps)
          .Within(1, 1'000'000)
          .Help("an id is a job once a step aligned with at least two ranks present, or after "
                "this many aligned steps (a one-rank job); only jobs get per-job metrics, and ids "
                "that are not (yet) jobs are evicted first from a full job table")
          .Details(" ([metrics.md](metrics.md#cardinality))"),
      Declare("max-exported-jobs", &D::max_exported_jobs)
          .AtLeast(0)
          .Help("jobs with per-job metrics at most (50 to 150 series each); the first to become "
                "jobs are exported, the others counted in "
                "`rankwatch_job_ids{state=\"over_limit\"}`")
          .Details(" ([metrics.md](metrics.md#cardinality))"),
      Declare("nodes-topic", &D::fleet, &FleetPartOptions::nodes_topic)
          .Help("Kafka topic through which every instance shares the fleet view of nodes "
                "(created compacted); `\"\"`: this instance's jobs only")
          .Details(" ([fleet.md](fleet.md))"),
      Declare("node-horizon", &D::fleet, &FleetPartOptions::node_horizon)
          .Within(std::chrono::minutes(1), hours(24 * 366))
          .Help("the fleet view keeps a node's charge in a job this long after its last change"),
      Declare("node-alert-window", &D::fleet, &FleetPartOptions::node_alert_window)
          .Within(std::chrono::minutes(1), hours(24 * 366))
          .Help("the node alert counts the jobs that charged a node within this long"),
      Declare("node-alert-jobs", &D::fleet, &FleetPartOptions::node_alert_jobs)
          .Within(0, 100000)
          .Help("a node that was the straggler culprit of this many different jobs within "
                "`node-alert-window` raises the node alert (`drain it`); 0: no node alert"),
      Declare("max-exported-nodes", &D::fleet, &FleetPartOptions::max_exported_nodes)
          .Within(0, 100000)
          .Help("nodes with per-node metrics at most: those that cost most within the horizon"),
      Declare("alert-subscriber-queue", &D::alert_subscriber_queue)
          .AtLeast(1)
          .Help("alerts a `WatchAlerts` subscriber may fall behind before its stream ends (it "
                "can resume)"),
      // Outbound alerts (docs/alerting.md).
      Declare("alertmanager", &D::alerting, &AlertingPartOptions::alertmanager)
          .Require(HttpUrlItem)
          .DefaultNote("none")
          .Help("Alertmanager URLs (`http(s)://host:port`; repeat the flag or list them) to push "
                "every alert to (`POST /api/v2/alerts`), re-sent while it fires, ended when it "
                "resolves; an outage loses nothing")
          .Details(" ([alerting.md](alerting.md#alertmanager-push))"),
      Declare("alertmanager-ca", &D::alerting, &AlertingPartOptions::alertmanager_ca)
          .Require(ReadableFile)
          .DefaultNote("system CAs")
          .Help("PEM CA that https Alertmanagers' certificates must chain to"),
      Declare("alertmanager-basic-auth-file", &D::alerting,
              &AlertingPartOptions::alertmanager_basic_auth_file)
          .Require(ReadableFile)
          .Help("file holding `user:password` for the Alertmanagers (basic authentication)"),
      Declare("alertmanager-bearer-token-file", &D::alerting,
              &AlertingPartOptions::alertmanager_bearer_token_file)
          .Require(ReadableFile)
          .Help("file holding a bearer token for the Alertmanagers"),
      Declare("alertmanager-resend-interval", &D::alerting,
              &AlertingPartOptions::alertmanager_resend_interval)
          .Within(std::chrono::seconds(1), hours(1))
          .Help("a firing alert is sent again this often, with `endsAt` 4 intervals ahead"),
      Declare("ui-external-url", &D::alerting, &AlertingPartOptions::ui_external_url)
          .DefaultNote("from ui-listen")
          .Help("the web UI's URL as its users reach it: pushed alerts and webhooks link to the "
                "job's page (`generatorURL`)"),
      Declare("alert-runbook-url", &D::alerting, &AlertingPartOptions::alert_runbook_url)
          .DefaultNote("none")
          .Help("`runbook_url` of pushed alerts and webhooks; `{alertname}`, `{kind}` and "
                "`{training_job}` are replaced"),
      Declare("action", &D::alerting, &AlertingPartOptions::action)
          .Require(ActionRuleItem)
          .DefaultNote("observe")
          .Help("action policy rules `KIND[:SEVERITY]=ACTION`, ACTION `observe` or `webhook` "
                "(repeatable; the first match decides; KIND `*` for any, SEVERITY the least), "
                "e.g. `hang:critical=webhook`")
          .Details(" ([alerting.md](alerting.md#actions))"),
      Declare("action-webhook", &D::alerting, &AlertingPartOptions::action_webhook)
          .Require(HttpUrlItem)
          .DefaultNote("none")
          .Help("webhook URLs that `webhook` actions POST the alert and its evidence to, once "
                "per firing, signed, retried with backoff"),
      Declare("action-secret-file", &D::alerting, &AlertingPartOptions::action_secret_file)
          .Require(ReadableFile)
          .Help("file holding the shared secret: `X-Rankwatch-Signature` is `sha256=` and the "
                "HMAC-SHA256 of the body with it, in hex"),
      Declare("action-ca", &D::alerting, &AlertingPartOptions::action_ca)
          .Require(ReadableFile)
          .DefaultNote("system CAs")
          .Help("PEM CA that https webhooks' certificates must chain to"),
      Declare("action-dry-run", &D::alerting, &AlertingPartOptions::action_dry_run)
          .Help("actions are logged (and recorded), nothing is called"),
      Declare("action-evidence-wait", &D::alerting, &AlertingPartOptions::action_evidence_wait)
          .Within(seconds(0), std::chrono::minutes(10))
          .Help("a hang alert's action waits this long for its hang stacks, then goes without"),
      Declare("grpc-tls-cert", &D::grpc_tls_cert)
          .Require(ReadableFile)
          .Help("PEM certificate chain: gRPC and the web UI over TLS (with `--grpc-tls-key`)"),
      Declare("grpc-tls-key", &D::grpc_tls_key)
          .Require(ReadableFile)
          .Help("PEM private key of `--grpc-tls-cert`"),
      Declare("grpc-tls-client-ca", &D::grpc_tls_client_ca)
          .Require(ReadableFile)
          .Help("PEM CA: clients must present a certificate it signed (mutual TLS)"),
      Declare("log-level", &D::log_level)
          .Require(LogLevel)
          .Help("`trace`, `debug`, `info`, `warn`, `error`, `critical` or `off`"),
      Declare("instance-id", &D::instance_id)
          .Require(InstanceId)
          .DefaultNote("derived")
          .Help("static consumer-group membership (`group.instance.id`): a restarted instance "
                "with the same id gets its partitions back at once; `none`: a dynamic member")
          .Details(". Default `rankwatchd-<pod or host>-<hash of the state directory>` "
                   "(`$POD_NAME` when set, else the host name): stable across restarts on the "
                   "same state, different for two instances on one host. Always dynamic on the "
                   "development broker, which does not support it. See [Restarts](#restarts)"),
      Declare("session-timeout", &D::session_timeout)
          .Within(seconds(1), hours(1))
          .DefaultNote(session_default)
          .Help("a crashed (SIGKILLed, partitioned) instance's partitions move on after this "
                "long")
          .Details("; heartbeats go every third of it, at most every second. Kafka brokers "
                   "accept 6 s–5 min by default"),
      DeclareMap("kafka", &D::kafka,
                 "map of librdkafka properties passed through (SASL/SSL, …) to the consumer, the "
                 "changelog and the control producer"),

      // step-diagnosis: (docs/spec/step-diagnosis.md section 3, docs/diagnoses.md)
      Declare("step-diagnosis.min-steps", &D::step_diagnosis, &Step::min_steps)
          .AtLeast(1)
          .Help("fewer aligned steps in the window: `no_data`"),
      Declare("step-diagnosis.straggler-warn", &D::step_diagnosis, &Step::straggler_warn)
          .AtLeast(0.0)
          .Help("straggler score (a rank's excess over the median rank) of a warning"),
      Declare("step-diagnosis.straggler-crit", &D::step_diagnosis, &Step::straggler_crit)
          .AtLeast(0.0)
          .Help("straggler score of a critical diagnosis"),
      Declare("step-diagnosis.input-share-warn", &D::step_diagnosis, &Step::input_share_warn)
          .Within(0.0, 1.0)
          .Help("share of the step waiting for input: `input_bound`, warning"),
      Declare("step-diagnosis.input-share-crit", &D::step_diagnosis, &Step::input_share_crit)
          .Within(0.0, 1.0)
          .Help("the same, critical"),
      Declare("step-diagnosis.wait-share-warn", &D::step_diagnosis, &Step::wait_share_warn)
          .Within(0.0, 1.0)
          .Help("share of the step outside the measured phases: `wait_heavy`, warning"),
      Declare("step-diagnosis.wait-share-crit", &D::step_diagnosis, &Step::wait_share_crit)
          .Within(0.0, 1.0)
          .Help("the same, critical"),
      Declare("step-diagnosis.compute-share-warn", &D::step_diagnosis, &Step::compute_share_warn)
          .Within(0.0, 1.0)
          .Help("share of the step in compute: `compute_bound`, warning"),
      Declare("step-diagnosis.compute-share-crit", &D::step_diagnosis, &Step::compute_share_crit)
          .Within(0.0, 1.0)
          .Help("the same, critical"),
      Declare("step-diagnosis.bound-max-skew", &D::step_diagnosis, &Step::bound_max_skew)
          .AtLeast(0.0)
          .Help("a `*_bound` diagnosis of several ranks needs their skew at most this"),
      Declare("step-diagnosis.onset-steps", &D::step_diagnosis, &Step::onset_steps)
          .AtLeast(1)
          .Help("the newest steps are also scored on their own, so that a rank that became slow "
                "is named within this many steps"),
      Declare("step-diagnosis.sync-max-step-skew", &D::step_diagnosis, &Step::sync_max_step_skew)
          .AtLeast(0.0)
          .Help("ranks whose step times differ by at most this skew run synchronised"),
      Declare("step-diagnosis.node-fraction", &D::step_diagnosis, &Step::node_fraction)
          .Within(0.0, 1.0)
          .Help("a node is the culprit when at least this share of its ranks exceed the "
                "threshold"),
      Declare("step-diagnosis.statistical", &D::step_diagnosis, &Step::statistical)
          .Help("also name a rank or node whose excess holds against the step-to-step noise, "
                "below the share thresholds (docs/diagnoses.md, \"Statistical detection\")"),
      Declare("step-diagnosis.straggler-z", &D::step_diagnosis, &Step::straggler_z)
          .AtLeast(0.0)
          .Help("the statistical test: a rank's mean excess must be at least this many standard "
                "errors of the noise"),
      Declare("step-diagnosis.straggler-min-excess", &D::step_diagnosis,
              &Step::straggler_min_excess)
          .AtLeast(0.0)
          .Help("the statistical test: and at least this share of the step's local work"),
      Declare("step-diagnosis.straggler-crit-lost-ranks", &D::step_diagnosis,
              &Step::straggler_crit_lost_ranks)
          .AtLeast(0.0)
          .Help("a straggler is critical when it costs the job this many ranks' worth of time "
                "(or its score reaches `straggler-crit`)"),
      Declare("step-diagnosis.pattern-stall-sigma", &D::step_diagnosis, &Step::pattern_stall_sigma)
          .AtLeast(0.0)
          .Help("a stall: a step whose excess rises this many noise deviations above the rank's "
                "own baseline"),
      Declare("step-diagnosis.pattern-stall-share", &D::step_diagnosis, &Step::pattern_stall_share)
          .AtLeast(0.0)
          .Help("a stall: and at least this share of the step's local work"),
      Declare("step-diagnosis.pattern-min-stalls", &D::step_diagnosis, &Step::pattern_min_stalls)
          .AtLeast(2)
          .Help("stalls in the window that make a periodic or intermittent straggler (fewer are "
                "events, left out)"),
      Declare("step-diagnosis.pattern-drift-fit", &D::step_diagnosis, &Step::pattern_drift_fit)
          .Within(0.0, 1.0)
          .Help("drift: a line's squared error at most this share of the best single step "
                "change's"),
      Declare("step-diagnosis.hang-timeout-steps", &D::step_diagnosis, &Step::hang_timeout_steps)
          .AtLeast(0.0)
          .Help("hang after max(this × median step time, `hang-timeout`)"),

      // memory-diagnosis: (docs/spec/step-diagnosis.md section 4, docs/diagnoses.md)
      Declare("memory-diagnosis.window-steps", &D::memory_window_steps)
          .AtLeast(1)
          .Help("steps with memory in the window"),
      Declare("memory-diagnosis.min-steps", &D::memory_diagnosis, &Memory::min_steps)
          .AtLeast(1)
          .Help("fewer steps with memory: `no_data`"),
      Declare("memory-diagnosis.pressure-warn", &D::memory_diagnosis, &Memory::pressure_warn)
          .AtLeast(0.0)
          .Help("the worst rank's peak as a share of its capacity: `high_pressure`, warning"),
      Declare("memory-diagnosis.pressure-crit", &D::memory_diagnosis, &Memory::pressure_crit)
          .AtLeast(0.0)
          .Help("the same, critical"),
      Declare("memory-diagnosis.imbalance-warn", &D::memory_diagnosis, &Memory::imbalance_warn)
          .AtLeast(0.0)
          .Help("(worst − median) / median of the ranks' peaks: `imbalance`, warning"),
      Declare("memory-diagnosis.imbalance-crit", &D::memory_diagnosis, &Memory::imbalance_crit)
          .AtLeast(0.0)
          .Help("the same, critical"),
      Declare("memory-diagnosis.imbalance-min-pressure", &D::memory_diagnosis,
              &Memory::imbalance_min_pressure)
          .Within(0.0, 1.0)
          .Help("`imbalance` only when the worst peak is at least this share of the capacity, "
                "where it is known"),
      Declare("memory-diagnosis.trend", &D::memory_diagnosis, &Memory::trend)
          .Help("judge the lifetime trend of memory (creep over the job's life)"),
      Declare("memory-diagnosis.trend-min-steps", &D::memory_diagnosis, &Memory::trend_min_steps)
          .AtLeast(1)
          .Help("the trend's points must span at least this many steps"),
      Declare("memory-diagnosis.trend-min-points", &D::memory_diagnosis, &Memory::trend_min_points)
          .AtLeast(2)
          .Help("and number at least this many"),
      Declare("memory-diagnosis.trend-steady-ratio", &D::memory_diagnosis,
              &Memory::trend_steady_ratio)
          .AtLeast(0.0)
          .Help("still growing at the end: the recent slope is at least this × the overall slope"),
      Declare("memory-diagnosis.trend-noise", &D::memory_diagnosis, &Memory::trend_noise)
          .AtLeast(0.0)
          .Help("significant: the growth is at least this × the residuals' robust spread"),
      Declare("memory-diagnosis.trend-min-growth-bytes", &D::memory_diagnosis,
              &Memory::trend_min_growth_bytes)
          .AtLeast(0.0)
          .Help("and at least this many bytes"),
      Declare("memory-diagnosis.trend-early-growth", &D::memory_diagnosis,
              &Memory::trend_early_growth)
          .AtLeast(0.0)
          .Help("and at least this share of the level at the start: `memory_creep_early`"),
      Declare("memory-diagnosis.trend-confirmed-growth", &D::memory_diagnosis,
              &Memory::trend_confirmed_growth)
          .AtLeast(0.0)
          .Help("the same share for `memory_creep`"),
      Declare("memory-diagnosis.trend-last-half", &D::memory_diagnosis, &Memory::trend_last_half)
          .Help("with no creep over the whole life, the later half is judged too (a late leak)"),
      Declare("memory-diagnosis.rank-trend", &D::memory_diagnosis, &Memory::rank_trend)
          .Help("judge each followed rank's own lifetime trend (a creep of one rank)"),
      Declare("memory-diagnosis.rank-window", &D::memory_diagnosis, &Memory::rank_window)
          .Help("judge each followed rank's own peaks across the window (a creep of one rank)"),

      // whatif: (docs/whatif.md)
      Declare("whatif.window-steps", &D::whatif, &WhatIf::window_steps)
          .AtLeast(1)
          .Help("analysed steps in a pipeline job's what-if window"),
      Declare("whatif.decompose-min-slowdown", &D::whatif, &WhatIf::decompose_min_slowdown)
          .AtLeast(1.0)
          .Help("S is decomposed (by replica, stage, op group, worker) from this S on"),
      Declare("whatif.min-steps", &D::whatif_verdict, &WhatIfVerdict::min_steps)
          .AtLeast(1)
          .Help("fewer analysed steps: verdict `none`"),
      Declare("whatif.warn-slowdown", &D::whatif_verdict, &WhatIfVerdict::warn_slowdown)
          .AtLeast(1.0)
          .Help("S of a finding (below: `balanced`), warning"),
      Declare("whatif.crit-slowdown", &D::whatif_verdict, &WhatIfVerdict::crit_slowdown)
          .AtLeast(1.0)
          .Help("the same, critical"),
      Declare("whatif.explain-share", &D::whatif_verdict, &WhatIfVerdict::explain_share)
          .Within(0.0, 1.0)
          .Help("a group explains the slowdown when its measured times alone bring back this share "
                "of S − 1"),
      Declare("whatif.moving-max-share", &D::whatif_verdict, &WhatIfVerdict::moving_max_share)
          .Within(0.0, 1.0)
          .Help("`sequence_imbalance`: the most frequent slowest replica is slowest in at most "
                "this share of the steps"),
      Declare("whatif.min-stage-excess", &D::whatif_verdict, &WhatIfVerdict::min_stage_excess)
          .AtLeast(0.0)
          .Help("`stage_imbalance`: the stage's compute is at least this share above the stages' "
                "mean on every replica"),
      Declare("whatif.exit-slowdown", &D::whatif_verdict, &WhatIfVerdict::exit_slowdown)
          .AtLeast(1.0)
          .Help("a held finding ends only below this S (hysteresis: it begins at warn-slowdown)"),
      Declare("whatif.crit-exit-slowdown", &D::whatif_verdict, &WhatIfVerdict::crit_exit_slowdown)
          .AtLeast(1.0)
          .Help("a held critical verdict becomes a warning only below this S"),
      Declare("whatif.keep-share", &D::whatif_verdict, &WhatIfVerdict::keep_share)
          .Within(0.0, 1.0)
          .Help("the held verdict's group keeps explaining while it brings back this share of "
                "S − 1 (a new one needs explain-share)"),
      Declare("whatif.hold-steps", &D::whatif_verdict, &WhatIfVerdict::hold_steps)
          .Help("a verdict naming another finding replaces the shown one after this many "
                "consecutive analysed steps (0: at once)"),
  };
}

// A table cell: no line breaks, no column separators.
std::string Cell(std::string text) {
  std::replace(text.begin(), text.end(), '\n', ' ');
  std::string out;
  for (char ch : text) {
    if (ch == '|') out += '\\';
    out += ch;
  }
  return out;
}

std::string MarkdownDefault(const Setting& s) {
  if (s.is_map) return "—";
  if (!s.default_note.empty()) return "*" + s.default_note + "*";
  const std::string value = s.DefaultText();
  if (value.empty()) return "—";
  if (s.value_name == "INT" || s.value_name == "NUMBER") return value;
  return "`" + value + "`";
}

}  // namespace

const std::vector<Setting>& DaemonSettings() {
  static const std::vector<Setting>* const settings = new std::vector<Setting>(BuildSettings());
  return *settings;
}

const std::vector<SettingSection>& DaemonSettingSections() {
  static const std::vector<SettingSection>* const sections = new std::vector<SettingSection>{
      {"step-diagnosis",
       "thresholds of the step-time diagnosis ([diagnoses.md](diagnoses.md), "
       "[spec](spec/step-diagnosis.md) section 3)"},
      {"memory-diagnosis",
       "window and thresholds of the memory diagnosis ([diagnoses.md](diagnoses.md)); the "
       "window's creep thresholds are not configurable"},
      {"whatif", "the what-if analysis of pipeline jobs and its verdicts ([whatif.md](whatif.md))"},
  };
  return *sections;
}

const Setting* FindDaemonSetting(std::string_view key) {
  for (const Setting& s : DaemonSettings()) {
    if (s.key == key) return &s;
  }
  return nullptr;
}

absl::Status CheckDaemonConfig(const DaemonConfig& c) {
  if (c.grpc_tls_cert.empty() != c.grpc_tls_key.empty()) {
    return absl::InvalidArgumentError(
        "grpc-tls-cert and grpc-tls-key go together: set both or neither");
  }
  if (!c.grpc_tls_client_ca.empty() && c.grpc_tls_cert.empty()) {
    return absl::InvalidArgumentError("grpc-tls-client-ca needs grpc-tls-cert and grpc-tls-key");
  }
  if (!c.alerting.alertmanager_basic_auth_file.empty() &&
      !c.alerting.alertmanager_bearer_token_file.empty()) {
    return absl::InvalidArgumentError(
        "alertmanager-basic-auth-file and alertmanager-bearer-token-file: set one or neither");
  }
  bool webhook_rule = false;
  for (const std::string& text : c.alerting.action) {
    auto rule = ParseActionRule(text);
    webhook_rule |= rule.ok() && rule->action == ActionRule::Action::kWebhook;
  }
  if (webhook_rule && c.alerting.action_webhook.empty() && !c.alerting.action_dry_run) {
    return absl::InvalidArgumentError("a webhook action needs action-webhook (or action-dry-run)");
  }
  if (!c.alerting.action_webhook.empty() && c.alerting.action_secret_file.empty() &&
      !c.alerting.action_dry_run) {
    return absl::InvalidArgumentError(
        "action-webhook needs action-secret-file (the signature's key)");
  }
  return absl::OkStatus();
}

std::string DaemonSettingsMarkdown() {
  std::string md =
      "| flag / config key | default | meaning |\n"
      "|---|---|---|\n"
      "| `--config FILE` | — | YAML file with the keys below; flags given on the command line "
      "win over it |\n";
  for (const Setting& s : DaemonSettings()) {
    if (!s.section().empty()) continue;
    const std::string name = s.is_map ? "`" + s.key + ":` (file only)" : "`" + s.flag() + "`";
    md += "| " + name + " | " + MarkdownDefault(s) + " | " + Cell(s.help + s.details) + " |\n";
  }
  for (const SettingSection& section : DaemonSettingSections()) {
    md += "| `" + section.name + ":` (file only) | — | " + Cell(section.help) + "; keys below |\n";
  }
  for (const SettingSection& section : DaemonSettingSections()) {
    md += "\n`" + section.name + ":` keys:\n\n| key | default | meaning |\n|---|---|---|\n";
    for (const Setting& s : DaemonSettings()) {
      if (s.section() != section.name) continue;
      md += "| `" + s.key.substr(section.name.size() + 1) + "` | " + MarkdownDefault(s) + " | " +
            Cell(s.help + s.details) + " |\n";
    }
  }
  return md;
}

}  // namespace rankwatch
