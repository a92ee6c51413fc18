// DaemonMetrics: the metric families of rankwatchd's runtime — its input, its jobs, their
// diagnoses and alerts, its durable state — registered once. The daemon's parts register their
// own (parts/daemon_part.h: evidence/evidence_part.cc, fleet/fleet_metrics.h). The names are a
// contract: base units, label `training_job` (never `job`).
//
// Per-job series are gated (metrics/job_export_gate.h): an id gets them only once it is a job (a
// step aligned with at least two ranks present, or JobExportOptions::min_steps aligned steps;
// kernel results: two ranks or that many analysed steps), and at most
// JobExportOptions::max_exported jobs get them; the others are counted in rankwatch_job_ids.
//
// Thread-safe (see PrometheusRegistry), except that per-job publishing (PublishJob, SetFiring,
// RemoveJob) and PublishInputPartitions are the ingest thread's.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "ingest/batch_decoder.h"
#include "metrics/job_export_gate.h"
#include "metrics/kernel_metrics.h"
#include "metrics/prometheus_registry.h"
#include "operators/alert_tracker.h"
#include "operators/job_pipeline.h"
#include "rankwatch/v1/service.pb.h"

namespace rankwatch {

class DaemonMetrics {
 public:
  DaemonMetrics(PrometheusRegistry* registry, const std::string& version,
                JobExportOptions exports = {});

  // Per-kind counters of accepted input ("batch", "step", "kernel", "sample", "op"; and
  // "unknown_op": ops of a type this build does not know, accepted and skipped).
  MetricCell* events_batches;
  MetricCell* events_steps;
  MetricCell* events_kernels;
  MetricCell* events_samples;
  MetricCell* events_ops;
  MetricCell* events_unknown_ops;
  // Rejections by reason: RejectReason values, plus record-level "late", "duplicate" and
  // "rank_out_of_range" from alignment, "too_many_jobs" past the job table's limits, and the
  // guards of JobPipeline ("rank_conflict", "stale_world_size", "step_jump").
  std::array<MetricCell*, kRejectReasonCount> rejected_by_reason{};
  MetricCell* rejected_late;
  MetricCell* rejected_duplicate;
  MetricCell* rejected_rank_out_of_range;
  MetricCell* rejected_too_many_jobs;
  MetricCell* rejected_rank_conflict;
  MetricCell* rejected_stale_world_size;
  MetricCell* rejected_step_jump;
  MetricCell* world_size_changes;
  MetricCell* jobs_evicted;
  MetricCell* ingest_lag_seconds;
  MetricCell* jobs;
  MetricCell* assigned_partitions;
  MetricCell* kafka_fetch_wakeups;  // KafkaConsumer::fetch_wakeups(), set every tick
  // Durable state: 1 while checkpoints succeed; the last checkpoint's cost (writer thread) and
  // the ingest thread's pause to collect it; failures. Set from the checkpoint writer thread.
  MetricCell* state_healthy;
  MetricCell* checkpoints;
  MetricCell* checkpoint_seconds;
  MetricCell* checkpoint_bytes;
  MetricCell* checkpoint_pause_seconds;
  MetricCell* state_errors;
  // Memory the state store holds, by kind: "memtables", "table_readers", "block_cache".
  MetricCell* state_memtable_bytes;
  MetricCell* state_table_reader_bytes;
  MetricCell* state_block_cache_bytes;
  // Which ids are jobs and which jobs are exported. Declared before `kernel`, which uses it.
  JobExportGate export_gate;
  // The live GPU-timeline families, published by the partition tasks (gated by export_gate).
  KernelMetrics kernel;
  // Alert subscribers (WatchAlerts streams): connected now, disconnected as too slow, alerts
  // handed to them.
  MetricCell* alert_subscribers;
  MetricCell* alert_subscribers_dropped;
  MetricCell* alerts_delivered;
  // Messages of a telemetry partition skipped because the broker no longer had them.
  MetricCell* InputLost(const std::string& topic, int32_t partition);
  // Times the consumer's position on a telemetry partition jumped past lost messages (each
  // loss InputLost counts).
  MetricCell* InputLossEvents(const std::string& topic, int32_t partition);
  // How far behind its producers the consumer is on one telemetry partition, and whether it
  // lost messages there within kInputLosingWindow.
  struct InputPartition {
    int32_t partition = 0;
    std::optional<int64_t> lag_messages;  // nullopt: not known (no series)
    bool losing = false;
  };
  static constexpr std::chrono::seconds kInputLosingWindow{30};
  // Sets the series of the telemetry partitions this instance reads now, and removes those of
  // the partitions it no longer reads (ingest thread only).
  void PublishInputPartitions(const std::string& topic, const std::vector<InputPartition>& now);

  // Per-job series. The step counters are set from the published snapshot's totals, last, so a
  // scrape never sees a step count ahead of the statistics of those steps (these accessors
  // create the series: for tests).
  MetricCell* StepsAligned(const std::string& job);
  MetricCell* StepsTimedOut(const std::string& job);
  // Publishes the job's series when the gate exports it (else only counts the id).
  void PublishJob(const JobSnapshot& snapshot);
  // Counts an alert transition and sets the job's firing alerts per kind (kept for a job not
  // exported, and set when it is).
  void CountAlert(AlertKind kind, AlertState state);
  void SetFiring(const std::string& job, const std::map<AlertKind, int>& firing);
  // Removes the job's series and forgets it in the gate.
  void RemoveJob(const std::string& job);
  // Whether `job` became a job (exported or not): the job table evicts other ids first.
  bool IsJob(const std::string& job) const { return export_gate.IsJob(job); }

 private:
  void PublishMemory(const JobSnapshot& snapshot);
  void PublishSteps(const JobSnapshot& snapshot);
  void PublishWhatIf(const JobSnapshot& snapshot);

  MetricFamily* steps_aligned_;
  MetricFamily* steps_timed_out_;
  MetricFamily* collector_dropped_;
  MetricFamily* step_records_;
  MetricFamily* phase_seconds_;
  MetricFamily* phase_skew_;
  MetricFamily* ranks_;
  MetricFamily* window_steps_;
  MetricFamily* step_diagnosis_;
  MetricFamily* step_severity_;
  MetricFamily* share_ratio_;
  MetricFamily* straggler_score_;
  MetricFamily* worst_rank_;
  MetricFamily* rank_excess_;
  MetricFamily* straggler_culprit_;
  MetricFamily* last_record_;
  MetricFamily* job_info_;
  MetricFamily* input_lost_ = nullptr;
  MetricFamily* input_loss_events_ = nullptr;
  MetricFamily* input_losing_ = nullptr;
  MetricFamily* ingest_lag_messages_ = nullptr;
  // The (topic, partition) series PublishInputPartitions set last (ingest thread only).
  std::set<std::pair<std::string, int32_t>> input_partitions_;
  MetricFamily* lost_rank_seconds_ = nullptr;
  MetricFamily* rank_seconds_ = nullptr;
  MetricFamily* alerts_firing_;
  MetricFamily* alerts_total_;
  MetricFamily* memory_diagnosis_;
  MetricFamily* memory_severity_;
  MetricFamily* memory_peak_;
  MetricFamily* memory_pressure_;
  MetricFamily* memory_creep_;
  MetricFamily* memory_steps_to_full_;
  MetricFamily* memory_creep_rank_;
  MetricFamily* whatif_slowdown_;
  MetricFamily* whatif_verdict_;
  MetricFamily* whatif_stage_;
  MetricFamily* whatif_op_group_;
  MetricFamily* whatif_explained_;
  MetricFamily* whatif_culprit_;
  MetricFamily* whatif_lost_;
  MetricCell* ids_candidate_;
  MetricCell* ids_exported_;
  MetricCell* ids_over_limit_;
  // Firing alerts of jobs not exported, set when they are (ingest thread only).
  std::map<std::string, std::map<AlertKind, int>> unexported_firing_;
};

}  // namespace rankwatch
