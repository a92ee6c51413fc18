#include "metrics/daemon_metrics.h"

namespace rankwatch {

DaemonMetrics::DaemonMetrics(PrometheusRegistry* r, const std::string& version,
                             JobExportOptions exports)
    : export_gate(exports), kernel(r, &export_gate) {
  r->Gauge("rankwatch_build_info", "Build of this daemon; always 1.", {"version"})
      ->WithLabels({version})
      ->Set(1);
  MetricFamily* events =
      r->Counter("rankwatch_events_total",
                 "Accepted telemetry, by kind (batch, step, kernel, sample, op; unknown_op: ops "
                 "of a type this daemon does not know, skipped).",
                 {"kind"});
  events_batches = events->WithLabels({"batch"});
  events_steps = events->WithLabels({"step"});
  events_kernels = events->WithLabels({"kernel"});
  events_samples = events->WithLabels({"sample"});
  events_ops = events->WithLabels({"op"});
  events_unknown_ops = events->WithLabels({"unknown_op"});
  MetricFamily* rejected = r->Counter(
      "rankwatch_events_rejected_total",
      "Rejected input by reason: whole Kafka messages for decoding reasons, too_many_jobs, "
      "rank_conflict and stale_world_size; single step records for late, duplicate, "
      "rank_out_of_range and step_jump.",
      {"reason"});
  for (int i = 1; i < kRejectReasonCount; ++i) {
    rejected_by_reason[i] =
        rejected->WithLabels({std::string(RejectReasonName(static_cast<RejectReason>(i)))});
  }
  rejected_late = rejected->WithLabels({"late"});
  rejected_duplicate = rejected->WithLabels({"duplicate"});
  rejected_rank_out_of_range = rejected->WithLabels({"rank_out_of_range"});
  rejected_too_many_jobs = rejected->WithLabels({"too_many_jobs"});
  rejected_rank_conflict = rejected->WithLabels({"rank_conflict"});
  rejected_stale_world_size = rejected->WithLabels({"stale_world_size"});
  rejected_step_jump = rejected->WithLabels({"step_jump"});
  world_size_changes = r->Counter("rankwatch_world_size_changes_total",
                                  "Jobs whose world size changed (elastic restarts): alignment "
                                  "and windows restart at the new size.",
                                  {})
                           ->WithLabels({});
  jobs_evicted = r->Counter("rankwatch_jobs_evicted_total",
                            "Jobs evicted from a full job table before they completed enough "
                            "steps to count as running (max-jobs, max-ranks).",
                            {})
                     ->WithLabels({});
  ingest_lag_seconds =
      r->Gauge("rankwatch_ingest_lag_seconds",
               "Wall-clock age of the newest batch processed, from its creation by the collector.",
               {})
          ->WithLabels({});
  jobs = r->Gauge("rankwatch_jobs",
                  "Training job ids in the job table (jobs, and ids that are not (yet) jobs).", {})
             ->WithLabels({});
  MetricFamily* ids = r->Gauge(
      "rankwatch_job_ids",
      "Job ids evaluated, by export state: candidate (not (yet) a job: no per-job series), "
      "exported, over_limit (a job beyond max-exported-jobs: no per-job series).",
      {"state"});
  ids_candidate_ = ids->WithLabels({"candidate"});
  ids_exported_ = ids->WithLabels({"exported"});
  ids_over_limit_ = ids->WithLabels({"over_limit"});
  export_gate.ShowCountsIn(ids_candidate_, ids_exported_, ids_over_limit_);
  assigned_partitions = r->Gauge("rankwatch_kafka_assigned_partitions",
                                 "Telemetry partitions assigned to this instance by the group.", {})
                            ->WithLabels({});
  kafka_fetch_wakeups =
      r->Counter("rankwatch_kafka_fetch_wakeups_total",
                 "Times the consumer woke librdkafka's fetcher after reading a full consumer "
                 "queue down to half (only while reading a backlog).",
                 {})
          ->WithLabels({});
  state_healthy =
      r->Gauge("rankwatch_state_healthy",
               "1 while state checkpoints succeed; 0 after a storage error (sticky).", {})
          ->WithLabels({});
  state_healthy->Set(1);
  checkpoints =
      r->Counter("rankwatch_checkpoints_total", "State checkpoints written.", {})->WithLabels({});
  checkpoint_seconds = r->Gauge("rankwatch_checkpoint_seconds",
                                "Duration of the last state checkpoint's write on the checkpoint "
                                "writer thread (serialisation, RocksDB write, fsync).",
                                {})
                           ->WithLabels({});
  checkpoint_bytes = r->Gauge("rankwatch_checkpoint_bytes",
                              "Keys and values written by the last state checkpoint.", {})
                         ->WithLabels({});
  checkpoint_pause_seconds =
      r->Gauge("rankwatch_checkpoint_pause_seconds",
               "Time the ingest thread spent collecting the last state checkpoint's changes, "
               "including any wait for a writer that fell behind.",
               {})
          ->WithLabels({});
  state_errors = r->Counter("rankwatch_state_errors_total",
                            "Failed state writes (the first one stops checkpointing).", {})
                     ->WithLabels({});
  MetricFamily* state_memory =
      r->Gauge("rankwatch_state_memory_bytes",
               "Memory the state store (RocksDB) holds, by kind: memtables, table_readers (open "
               "table files' indexes and filters), block_cache. Sampled after each checkpoint.",
               {"kind"});
  state_memtable_bytes = state_memory->WithLabels({"memtables"});
  state_table_reader_bytes = state_memory->WithLabels({"table_readers"});
  state_block_cache_bytes = state_memory->WithLabels({"block_cache"});
  alert_subscribers =
      r->Gauge("rankwatch_alert_subscribers", "Connected WatchAlerts subscribers.", {})
          ->WithLabels({});
  alert_subscribers_dropped =
      r->Counter("rankwatch_alert_subscribers_dropped_total",
                 "Subscribers disconnected because their queue overflowed (they can resume).", {})
          ->WithLabels({});
  alerts_delivered = r->Counter("rankwatch_alerts_delivered_total",
                                "Alerts handed to WatchAlerts subscribers.", {})
                         ->WithLabels({});
  steps_aligned_ = r->Counter("rankwatch_steps_aligned_total",
                              "Steps aligned across the ranks of a job.", {"training_job"});
  steps_timed_out_ =
      r->Counter("rankwatch_steps_timed_out_total",
                 "Steps aligned by the alignment timeout, with ranks missing.", {"training_job"});
  collector_dropped_ = r->Counter(
      "rankwatch_collector_dropped_records_total",
      "Records a job's collectors dropped before sending them (a full buffer, a message over "
      "the size limit, a failed delivery), as their batches report.",
      {"training_job"});
  step_records_ = r->Counter(
      "rankwatch_step_records_total",
      "Step records of a job accepted for alignment, by the clock that timed their phases: host, "
      "device, device_missing (device timing on, its events too late: host times).",
      {"training_job", "clock"});
  phase_seconds_ =
      r->Gauge("rankwatch_step_phase_seconds",
               "Per-step mean time of a phase over the window: median or worst over the ranks.",
               {"training_job", "phase", "stat"});
  phase_skew_ = r->Gauge("rankwatch_step_skew_ratio",
                         "(worst - median) / median of a phase's per-rank window means.",
                         {"training_job", "phase"});
  ranks_ = r->Gauge("rankwatch_job_ranks", "Ranks of a job: world size, seen, in the last step.",
                    {"training_job", "state"});
  window_steps_ = r->Gauge("rankwatch_window_steps", "Aligned steps in a job's rolling window.",
                           {"training_job"});
  whatif_slowdown_ = r->Gauge(
      "rankwatch_whatif_slowdown",
      "Pipeline jobs: the what-if slowdown S over the window, actual / ideal mean step time "
      "(1 = no loss to stragglers).",
      {"training_job"});
  whatif_verdict_ = r->Gauge(
      "rankwatch_whatif_verdict",
      "Pipeline jobs: 1 for the current what-if verdict (balanced, slow_worker, "
      "stage_imbalance, sequence_imbalance, slow_communication, gc_pauses, unattributed), 0 "
      "for the others.",
      {"training_job", "verdict"});
  whatif_stage_ =
      r->Gauge("rankwatch_whatif_stage_slowdown",
               "Pipeline jobs: the slowdown with only one stage's ops at their measured times.",
               {"training_job", "stage"});
  whatif_op_group_ =
      r->Gauge("rankwatch_whatif_op_slowdown",
               "Pipeline jobs: the slowdown with only one op group's ops at their measured times.",
               {"training_job", "op"});
  whatif_explained_ = r->Gauge(
      "rankwatch_whatif_explained_ratio",
      "Pipeline jobs: the share of S - 1 that the top workers (m_w) or the worst stage (m_s) "
      "explain.",
      {"training_job", "metric"});
  whatif_culprit_ = r->Gauge(
      "rankwatch_whatif_culprit",
      "Pipeline jobs, while the verdict names a worker or stage: the share of S - 1 it explains, "
      "with its data rank and stage (\"\" when the verdict names a whole stage).",
      {"training_job", "verdict", "data_rank", "stage"});
  whatif_lost_ = r->Gauge(
      "rankwatch_whatif_lost_rank_seconds",
      "Pipeline jobs: rank-seconds lost over the window to the slowdown, (actual - ideal) x "
      "world size.",
      {"training_job"});
  step_diagnosis_ =
      r->Gauge("rankwatch_step_diagnosis",
               "Step-time diagnosis of a job: 1 for the current label, 0 for the others.",
               {"training_job", "diagnosis"});
  step_severity_ =
      r->Gauge("rankwatch_step_diagnosis_severity",
               "Severity of the step-time diagnosis: 0 info, 1 warn, 2 crit.", {"training_job"});
  share_ratio_ = r->Gauge("rankwatch_step_share_ratio",
                          "Share of the median step time: input (dataloader), wait, compute.",
                          {"training_job", "share"});
  straggler_score_ = r->Gauge(
      "rankwatch_straggler_score",
      "Excess of the worst rank over the median, per typical step's local work: input, compute, "
      "own (step time less blocked waiting).",
      {"training_job", "kind"});
  worst_rank_ = r->Gauge("rankwatch_step_worst_rank",
                         "Rank with the largest per-step mean of a phase over the window.",
                         {"training_job", "phase"});
  rank_excess_ = r->Gauge(
      "rankwatch_rank_excess_seconds",
      "Top 3 ranks per signal (dataloader, compute) by per-step time above the median rank; "
      "the only per-rank series (at most 6 per job).",
      {"training_job", "signal", "rank", "node"});
  straggler_culprit_ = r->Gauge(
      "rankwatch_straggler_culprit_ranks",
      "While a job's step diagnosis is a straggler: the culprit's ranks (1 for one rank, the "
      "slow ranks of a node), with the scope (rank or node) and the culprit's node.",
      {"training_job", "scope", "node"});
  last_record_ = r->Gauge(
      "rankwatch_job_last_record_timestamp_seconds",
      "Unix time at which the newest step record of a job ended (time() minus it: how stale "
      "the job's input is).",
      {"training_job"});
  job_info_ = r->Gauge(
      "rankwatch_job_info",
      "1 for each job whose collectors name its scheduler: the scheduler (kubernetes, slurm, "
      "torchrun), its job id, the Kubernetes namespace and owner. One series per job, for joins "
      "(e.g. on namespace).",
      {"training_job", "scheduler", "scheduler_job", "namespace", "owner"});
  input_lost_ =
      r->Counter("rankwatch_input_lost_messages_total",
                 "Telemetry messages the daemon never read because the broker no longer had them "
                 "(retention deleted them first; the consumer's position jumped past them).",
                 {"topic", "partition"});
  input_loss_events_ =
      r->Counter("rankwatch_input_loss_events_total",
                 "Times the consumer's position on a telemetry partition jumped past messages the "
                 "broker no longer had (each counted in rankwatch_input_lost_messages_total and "
                 "logged once).",
                 {"topic", "partition"});
  input_losing_ = r->Gauge(
      "rankwatch_input_losing",
      "1 while the daemon lost telemetry messages of the partition within the last " +
          std::to_string(kInputLosingWindow.count()) +
          " s (a consumer more than the broker's retained log behind its producers), else 0; one "
          "series per partition it reads.",
      {"topic", "partition"});
  ingest_lag_messages_ = r->Gauge(
      "rankwatch_ingest_lag_messages",
      "Telemetry messages of a partition this instance reads that are produced and not yet "
      "processed: the log's end as the consumer last saw it in a fetch answer less its next "
      "offset (messages fetched and queued included).",
      {"topic", "partition"});
  lost_rank_seconds_ = r->Counter(
      "rankwatch_job_lost_rank_seconds_total",
      "Rank-seconds a job lost since it started: cause straggler (every rank waiting for the "
      "slowest beyond a typical rank, per aligned step) or hang (every rank-second without "
      "progress).",
      {"training_job", "cause"});
  rank_seconds_ = r->Counter("rankwatch_job_rank_seconds_total",
                             "Rank-seconds a job ran since it started (its ranks' step times, "
                             "and its hangs): the denominator of the lost time.",
                             {"training_job"});
  alerts_firing_ = r->Gauge("rankwatch_alerts_firing", "Alerts currently firing, per job and kind.",
                            {"training_job", "kind"});
  alerts_total_ = r->Counter("rankwatch_alerts_total",
                             "Alert transitions by kind and new state (pending, firing, resolved).",
                             {"kind", "state"});
  memory_diagnosis_ =
      r->Gauge("rankwatch_memory_diagnosis",
               "Step-memory diagnosis of a job: 1 for the current label, 0 for the others.",
               {"training_job", "diagnosis"});
  memory_severity_ =
      r->Gauge("rankwatch_memory_diagnosis_severity",
               "Severity of the memory diagnosis: 0 info, 1 warn, 2 crit.", {"training_job"});
  memory_peak_ = r->Gauge("rankwatch_memory_peak_bytes",
                          "Device-memory peak over the window: median or worst over the ranks' "
                          "window peaks, for allocated and reserved memory.",
                          {"training_job", "kind", "stat"});
  memory_pressure_ = r->Gauge("rankwatch_memory_pressure_ratio",
                              "Worst rank's window peak / device capacity (when reported).",
                              {"training_job", "kind"});
  memory_creep_ = r->Gauge("rankwatch_memory_creep_bytes_per_step",
                           "Growth of the worst rank's peak per step over the window.",
                           {"training_job", "kind"});
  memory_steps_to_full_ = r->Gauge(
      "rankwatch_memory_steps_to_full",
      "Projected steps until the device is full at the current creep rate (only while it grows).",
      {"training_job", "kind"});
  memory_creep_rank_ = r->Gauge(
      "rankwatch_memory_creep_rank_bytes_per_step",
      "While a job's memory diagnosis is a creep of one rank: that rank's own growth per step, "
      "with the kind and the rank's node (one series per job at most).",
      {"training_job", "kind", "rank", "node"});
}

MetricCell* DaemonMetrics::InputLost(const std::string& topic, int32_t partition) {
  return input_lost_->WithLabels({topic, std::to_string(partition)});
}

MetricCell* DaemonMetrics::InputLossEvents(const std::string& topic, int32_t partition) {
  return input_loss_events_->WithLabels({topic, std::to_string(partition)});
}

void DaemonMetrics::PublishInputPartitions(const std::string& topic,
                                           const std::vector<InputPartition>& now) {
  std::set<std::pair<std::string, int32_t>> published;
  for (const InputPartition& p : now) {
    const std::vector<std::string> labels = {topic, std::to_string(p.partition)};
    input_losing_->WithLabels(labels)->Set(p.losing ? 1 : 0);
    if (p.lag_messages) {
      ingest_lag_messages_->WithLabels(labels)->Set(static_cast<double>(*p.lag_messages));
    } else {
      ingest_lag_messages_->RemoveSeries(labels);
    }
    published.emplace(topic, p.partition);
  }
  for (const auto& [t, partition] : input_partitions_) {
    if (published.count({t, partition})) continue;
    const std::vector<std::string> labels = {t, std::to_string(partition)};
    input_losing_->RemoveSeries(labels);
    ingest_lag_messages_->RemoveSeries(labels);
  }
  input_partitions_ = std::move(published);
}

MetricCell* DaemonMetrics::StepsAligned(const std::string& job) {
  return steps_aligned_->WithLabels({job});
}

MetricCell* DaemonMetrics::StepsTimedOut(const std::string& job) {
  return steps_timed_out_->WithLabels({job});
}

void DaemonMetrics::PublishJob(const JobSnapshot& s) {
  const std::string& job = s.training_job;
  // A job: two ranks agreed on the id in one step, or it aligned enough steps on its own.
  const bool is_job =
      s.last_ranks_present >= 2 || s.aligned_steps >= export_gate.options().min_steps;
  if (export_gate.Evaluate(job, is_job) != JobExportGate::State::kExported) return;
  if (auto it = unexported_firing_.find(job); it != unexported_firing_.end()) {
    const std::map<AlertKind, int> firing = std::move(it->second);
    unexported_firing_.erase(it);
    SetFiring(job, firing);
  }
  ranks_->WithLabels({job, "world_size"})->Set(s.world_size);
  ranks_->WithLabels({job, "seen"})->Set(s.ranks_seen);
  ranks_->WithLabels({job, "present"})->Set(s.last_ranks_present);
  window_steps_->WithLabels({job})->Set(s.window_steps);
  const StepDiagnosis& d = s.step;
  for (int l = 0; l < kStepLabelCount; ++l) {
    const auto label = static_cast<StepLabel>(l);
    step_diagnosis_->WithLabels({job, std::string(StepLabelName(label))})->Set(d.label == label);
  }
  step_severity_->WithLabels({job})->Set(static_cast<double>(d.severity));
  share_ratio_->WithLabels({job, "input"})->Set(d.input_share);
  share_ratio_->WithLabels({job, "wait"})->Set(d.wait_share);
  share_ratio_->WithLabels({job, "compute"})->Set(d.compute_share);
  straggler_score_->WithLabels({job, "input"})->Set(d.input_score);
  straggler_score_->WithLabels({job, "compute"})->Set(d.compute_score);
  straggler_score_->WithLabels({job, "own"})->Set(d.own_score);
  if (d.compute.stat.present)
    worst_rank_->WithLabels({job, "compute"})->Set(d.compute.stat.worst_rank);
  std::vector<MetricFamily::Row> rows;
  auto top = [&](const char* signal, const SignalEvidence& e) {
    for (const RankExcess& x : e.top) {
      rows.push_back({{job, signal, std::to_string(x.rank), s.NodeOf(x.rank)}, x.excess_seconds});
    }
  };
  top("dataloader", d.phases[static_cast<int>(Phase::kDataloader)]);
  top("compute", d.compute);
  rank_excess_->SetSeriesOf(job, rows);
  rows.clear();
  if (d.scope != CulpritScope::kNone && !d.culprit_ranks.empty()) {
    rows.push_back({{job, d.scope == CulpritScope::kNode ? "node" : "rank", d.culprit_node},
                    static_cast<double>(d.culprit_ranks.size())});
  }
  straggler_culprit_->SetSeriesOf(job, rows);
  lost_rank_seconds_->WithLabels({job, "straggler"})->Set(s.lost.total_straggler_rank_seconds);
  lost_rank_seconds_->WithLabels({job, "hang"})->Set(s.lost.total_hang_rank_seconds);
  rank_seconds_->WithLabels({job})->Set(s.lost.total_rank_seconds);
  if (s.last_record_unix_ns > 0) {
    last_record_->WithLabels({job})->Set(static_cast<double>(s.last_record_unix_ns) * 1e-9);
  }
  if (!s.scheduler.empty()) {
    std::vector<std::string> info{job, s.scheduler.scheduler, s.scheduler.job,
                                  s.scheduler.k8s_namespace, s.scheduler.owner};
    if (!job_info_->Has(info)) job_info_->SetSeriesOf(job, {{std::move(info), 1}});
  }
  PublishMemory(s);
  if (s.whatif != nullptr) PublishWhatIf(s);
  if (!s.has_window) return PublishSteps(s);
  for (int p = 0; p < kPhaseCount; ++p) {
    const PhaseStat& st = s.phases[p];
    if (!st.present) continue;
    const std::string phase(PhaseName(static_cast<Phase>(p)));
    phase_seconds_->WithLabels({job, phase, "median"})->Set(st.median_seconds);
    phase_seconds_->WithLabels({job, phase, "worst"})->Set(st.worst_seconds);
    phase_skew_->WithLabels({job, phase})->Set(st.skew);
    worst_rank_->WithLabels({job, phase})->Set(st.worst_rank);
  }
  if (const PhaseStat& gc = s.step.gc.time.stat; gc.present) {
    phase_seconds_->WithLabels({job, "gc", "median"})->Set(gc.median_seconds);
    phase_seconds_->WithLabels({job, "gc", "worst"})->Set(gc.worst_seconds);
    phase_skew_->WithLabels({job, "gc"})->Set(gc.skew);
    worst_rank_->WithLabels({job, "gc"})->Set(gc.worst_rank);
  }
  PublishSteps(s);
}

void DaemonMetrics::PublishSteps(const JobSnapshot& s) {
  steps_aligned_->WithLabels({s.training_job})->Set(static_cast<double>(s.aligned_steps));
  steps_timed_out_->WithLabels({s.training_job})->Set(static_cast<double>(s.timed_out_steps));
  collector_dropped_->WithLabels({s.training_job})
      ->Set(static_cast<double>(s.collector_dropped_records));
  // A clock's series once a record of it came: a CPU job has the host series alone.
  static constexpr const char* kClocks[] = {"host", "device", "device_missing"};
  for (size_t c = 0; c < s.step_records_by_clock.size(); ++c) {
    if (s.step_records_by_clock[c] == 0) continue;
    step_records_->WithLabels({s.training_job, kClocks[c]})
        ->Set(static_cast<double>(s.step_records_by_clock[c]));
  }
}

void DaemonMetrics::PublishWhatIf(const JobSnapshot& s) {
  const std::string& job = s.training_job;
  const whatif::WhatIfSnapshot& w = *s.whatif;
  const whatif::WhatIfVerdict& v = w.verdict;
  for (int l = 0; l < whatif::kVerdictCount; ++l) {
    const auto label = static_cast<whatif::Verdict>(l);
    whatif_verdict_->WithLabels({job, std::string(whatif::VerdictName(label))})
        ->Set(v.verdict == label);
  }
  if (v.verdict == whatif::Verdict::kNone) return;
  whatif_slowdown_->WithLabels({job})->Set(w.result.slowdown);
  whatif_lost_->WithLabels({job})->Set(v.lost_rank_seconds);
  std::vector<MetricFamily::Row> rows;
  const whatif::Decomposition& d = w.result.decomposition;
  for (size_t i = 0; i < d.by_stage.size(); ++i)
    rows.push_back({{job, std::to_string(i)}, d.by_stage[i]});
  whatif_stage_->SetSeriesOf(job, rows);
  rows.clear();
  for (const auto& [group, x] : d.by_op_group) rows.push_back({{job, group}, x});
  whatif_op_group_->SetSeriesOf(job, rows);
  whatif_explained_->WithLabels({job, "m_w"})->Set(w.result.m_w);
  whatif_explained_->WithLabels({job, "m_s"})->Set(w.result.m_s);
  rows.clear();
  if (v.stage >= 0) {
    rows.push_back({{job, std::string(whatif::VerdictName(v.verdict)),
                     v.data_rank >= 0 ? std::to_string(v.data_rank) : "", std::to_string(v.stage)},
                    v.explained});
  }
  whatif_culprit_->SetSeriesOf(job, rows);
}

void DaemonMetrics::PublishMemory(const JobSnapshot& s) {
  const std::string& job = s.training_job;
  const MemoryDiagnosis& m = s.memory;
  for (int l = 0; l < kMemoryLabelCount; ++l) {
    const auto label = static_cast<MemoryLabel>(l);
    memory_diagnosis_->WithLabels({job, std::string(MemoryLabelName(label))})
        ->Set(m.label == label);
  }
  memory_severity_->WithLabels({job})->Set(static_cast<double>(m.severity));
  for (int k = 0; k < kMemoryKindCount; ++k) {
    const MemoryKindEvidence& e = m.kinds[k];
    if (!e.present) continue;
    const std::string kind(MemoryKindName(static_cast<MemoryKind>(k)));
    memory_peak_->WithLabels({job, kind, "median"})->Set(e.median_peak_bytes);
    memory_peak_->WithLabels({job, kind, "worst"})->Set(e.worst_peak_bytes);
    memory_creep_->WithLabels({job, kind})->Set(e.creep_bytes_per_step);
    if (m.capacity_bytes > 0) memory_pressure_->WithLabels({job, kind})->Set(e.pressure);
    if (e.projected_steps_to_full) {
      memory_steps_to_full_->WithLabels({job, kind})
          ->Set(static_cast<double>(*e.projected_steps_to_full));
    } else {
      memory_steps_to_full_->RemoveSeries({job, kind});
    }
  }
  std::vector<MetricFamily::Row> rows;
  if ((m.label == MemoryLabel::kCreep || m.label == MemoryLabel::kCreepEarly) &&
      m.creep_scope == CreepScope::kRank) {
    rows.push_back({{job, std::string(MemoryKindName(m.kind)), std::to_string(m.creep_rank),
                     s.NodeOf(m.creep_rank)},
                    m.kinds[static_cast<int>(m.kind)].creep_bytes_per_step});
  }
  memory_creep_rank_->SetSeriesOf(job, rows);
}

void DaemonMetrics::CountAlert(AlertKind kind, AlertState state) {
  alerts_total_->WithLabels({std::string(AlertKindName(kind)), std::string(AlertStateName(state))})
      ->Add(1);
}

void DaemonMetrics::SetFiring(const std::string& job, const std::map<AlertKind, int>& firing) {
  if (!export_gate.Exported(job)) {
    unexported_firing_[job] = firing;
    return;
  }
  for (int k = 0; k <= static_cast<int>(AlertKind::kWaitHeavy); ++k) {
    const auto kind = static_cast<AlertKind>(k);
    auto it = firing.find(kind);
    alerts_firing_->WithLabels({job, std::string(AlertKindName(kind))})
        ->Set(it == firing.end() ? 0 : it->second);
  }
}

void DaemonMetrics::RemoveJob(const std::string& job) {
  unexported_firing_.erase(job);
  // An id that was never exported has no series (an evicted flood of ids costs no lookups).
  if (!export_gate.Remove(job)) return;
  for (MetricFamily* f : {steps_aligned_,        steps_timed_out_,
                          collector_dropped_,    phase_seconds_,
                          phase_skew_,           ranks_,
                          window_steps_,         step_diagnosis_,
                          step_severity_,        share_ratio_,
                          straggler_score_,      worst_rank_,
                          rank_excess_,          straggler_culprit_,
                          last_record_,          job_info_,
                          alerts_firing_,        lost_rank_seconds_,
                          rank_seconds_,         memory_diagnosis_,
                          memory_severity_,      memory_peak_,
                          memory_pressure_,      memory_creep_,
                          memory_steps_to_full_, memory_creep_rank_,
                          whatif_slowdown_,      whatif_verdict_,
                          whatif_stage_,         whatif_op_group_,
                          whatif_explained_,     whatif_culprit_,
                          whatif_lost_}) {
    f->RemoveWhereFirstLabel(job);
  }
  step_records_->RemoveWhereFirstLabel(job);
  kernel.RemoveJob(job);
}

}  // namespace rankwatch
