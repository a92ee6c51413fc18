// DaemonMetrics: every metric family rankwatchd exports, registered once. The names are a
// contract: base units, label `training_job` (never `job`).
//
// Thread-safe (see PrometheusRegistry).
#pragma once

#include <array>
#include <string>

#include "ingest/batch_decoder.h"
#include "operators/alert_tracker.h"
#include "operators/job_pipeline.h"
#include "sinks/kernel_metrics.h"
#include "sinks/prometheus_registry.h"

namespace rankwatch {

class DaemonMetrics {
 public:
  DaemonMetrics(PrometheusRegistry* registry, const std::string& version);

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
  // The live GPU-timeline families, published by the partition tasks.
  KernelMetrics kernel;
  // Alert subscribers (WatchAlerts streams): connected now, disconnected as too slow, alerts
  // handed to them.
  MetricCell* alert_subscribers;
  MetricCell* alert_subscribers_dropped;
  MetricCell* alerts_delivered;
  // Stacks requests to hung jobs (evidence/hang_inspector.h): sent, not sent, and settled with
  // every rank's stacks or at the deadline with some missing.
  MetricCell* hang_stacks_requested;
  MetricCell* hang_stacks_send_failed;
  MetricCell* hang_stacks_complete;
  MetricCell* hang_stacks_partial;
  // Flight Recorder dumps of hung jobs (evidence/flight_recorder_inspector.h): kept, dropped
  // (over the bounds); requests sent and not sent; analyses.
  MetricCell* fr_dumps_kept;
  MetricCell* fr_dumps_dropped;
  MetricCell* fr_requested;
  MetricCell* fr_send_failed;
  MetricCell* fr_analyses;

  // Messages of a telemetry partition skipped because the broker no longer had them.
  MetricCell* InputLost(const std::string& topic, int32_t partition);

  // Per-job series.
  MetricCell* StepsAligned(const std::string& job);
  MetricCell* StepsTimedOut(const std::string& job);
  void PublishJob(const JobSnapshot& snapshot);
  // Counts an alert transition and sets the job's firing alerts per kind.
  void CountAlert(AlertKind kind, AlertState state);
  void SetFiring(const std::string& job, const std::map<AlertKind, int>& firing);
  void RemoveJob(const std::string& job);

 private:
  void PublishMemory(const JobSnapshot& snapshot);
  void PublishWhatIf(const JobSnapshot& snapshot);

  MetricFamily* steps_aligned_;
  MetricFamily* steps_timed_out_;
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
};

}  // namespace rankwatch
