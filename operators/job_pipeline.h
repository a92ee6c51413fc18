// JobPipeline: the chain of step operators for one training job — alignment across ranks,
// then the rolling window — and the read-only snapshot the sinks publish.
//
// Pure: given the same batches and the same `now` values it produces the same snapshots.
// Not thread-safe: owned by the PartitionTask of the job's partition (runtime/partition_task.h),
// on the daemon's ingest thread; snapshots are immutable copies, read from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "operators/lost_time.h"
#include "operators/memory_diagnosis.h"
#include "operators/memory_trend.h"
#include "operators/memory_window.h"
#include "operators/phase_stats.h"
#include "operators/step_aligner.h"
#include "operators/step_time_diagnosis.h"
#include "operators/step_window.h"
#include "rankwatch/v1/telemetry.pb.h"

namespace rankwatch {

struct JobPipelineOptions {
  // Keep each newly aligned step, encoded, for the next checkpoint. Default: off.
  bool record_changes = false;
  StepAlignerOptions align;
  StepWindowOptions window;
  StepDiagnosisOptions diagnosis;
  MemoryWindowOptions memory_window;
  MemoryTrendOptions memory_trend;
  MemoryDiagnosisOptions memory;
};

// What one call changed; the caller turns it into metrics.
struct JobDelta {
  uint32_t accepted = 0;
  uint32_t duplicate = 0;
  uint32_t late = 0;
  uint32_t rank_out_of_range = 0;
  uint32_t aligned = 0;
  uint32_t aligned_timed_out = 0;
};

struct JobSnapshot {
  std::string training_job;
  uint32_t world_size = 0;
  uint32_t ranks_seen = 0;
  uint64_t aligned_steps = 0;    // since the pipeline started
  uint64_t timed_out_steps = 0;  // aligned with ranks missing
  bool has_window = false;
  uint64_t window_first_step = 0;
  uint64_t window_last_step = 0;
  uint32_t window_steps = 0;
  uint32_t last_ranks_present = 0;
  int64_t last_record_unix_ns = 0;  // newest end_unix_ns seen
  PhaseStats phases;
  bool finished = false;  // every rank sent its final batch
  StepDiagnosis step;
  MemoryDiagnosis memory;
  LostTimeSummary lost;  // what stragglers and hangs cost the job
  // Telemetry messages of the job's partition the daemon never read (retention deleted them
  // first) while the job was on it: some of the job's records may be among them.
  uint64_t input_lost_messages = 0;
  int64_t evaluated_unix_ns = 0;  // wall clock of the evaluation, set by the caller
  // Each rank's phase sums and counts over the window (for per-rank detail), and its memory
  // peaks over the memory window (0 = none reported), indexed by rank.
  std::shared_ptr<const std::vector<StepWindow::RankTotals>> rank_totals;
  std::shared_ptr<const std::vector<double>> rank_peak_allocated;
  std::shared_ptr<const std::vector<double>> rank_peak_reserved;
  // Node of each rank ("" when unknown); shared with the pipeline, replaced when one changes.
  std::shared_ptr<const std::vector<std::string>> rank_nodes;
  // The node of `rank`, or "" when unknown.
  const std::string& NodeOf(uint32_t rank) const;
};

// What a checkpoint of one job writes: its metadata, aligner and lifetime memory trend, the steps
// aligned since the previous checkpoint, and the oldest step any window still needs (older
// stored steps can go).
struct JobCheckpoint {
  state::v1::JobMeta meta;
  std::vector<state::v1::StoredStep> new_steps;
  uint64_t keep_from_step = 0;
};

class JobPipeline {
 public:
  JobPipeline(std::string training_job, uint32_t world_size, JobPipelineOptions options);

  // Adds the step records of a validated batch of this job. A batch that declares another
  // world size restarts alignment and the window at that size (an elastic restart).
  JobDelta AddBatch(const v1::Batch& batch, TimePoint now);

  // Closes steps whose alignment timeout passed. Call periodically even without input.
  JobDelta Tick(TimePoint now);

  // Messages of the job's partition were lost before they were read (the consumer's position
  // jumped past them): the job's input may be incomplete.
  void NoteInputLost(uint64_t messages) { input_lost_messages_ += messages; }

  // Computes the current snapshot and diagnosis at `now` (O(ranks * phases)).
  JobSnapshot Snapshot(TimePoint now) const;

  // The job's durable state since the previous call (requires options.record_changes).
  JobCheckpoint TakeCheckpoint(TimePoint now, int64_t wall_now_unix_ns);

  // Rebuilds a pipeline from its metadata and its stored steps (ascending; at least every step
  // from the checkpoint's keep_from_step on). The result behaves exactly like the pipeline
  // that was checkpointed. A damaged state is DataLoss.
  static absl::StatusOr<std::unique_ptr<JobPipeline>> Restore(
      const state::v1::JobMeta& meta, const std::vector<state::v1::StoredStep>& steps,
      JobPipelineOptions options, TimePoint now, int64_t wall_now_unix_ns);

  const std::string& training_job() const { return training_job_; }
  uint32_t world_size() const { return aligner_->world_size(); }

 private:
  void Reset(uint32_t world_size);
  void Consume(TimePoint now, JobDelta* delta);
  // Counts hang loss up to `now` while the job is hung (as the step diagnosis would say).
  void CountHang(TimePoint now);

  const std::string training_job_;
  const JobPipelineOptions options_;
  std::unique_ptr<StepAligner> aligner_;
  std::unique_ptr<StepWindow> window_;
  std::unique_ptr<MemoryWindow> memory_window_;
  std::unique_ptr<MemoryTrend> memory_trend_;  // the job's lifetime memory peaks
  std::unique_ptr<LostTime> lost_;
  bool sharded_ = false;             // a collector said the job shards its parameters
  double hang_counted_seconds_ = 0;  // hang loss counted since the last progress
  uint64_t input_lost_messages_ = 0;
  std::vector<AlignedStep> closed_;                   // scratch, reused
  std::vector<state::v1::StoredStep> unsaved_steps_;  // with options.record_changes
  std::shared_ptr<const std::vector<std::string>> rank_nodes_;
  TimePoint last_progress_{};  // when a step last aligned, or when the job was first seen
  std::vector<bool> finished_ranks_;
  uint32_t finished_count_ = 0;
  bool seen_ = false;
  uint64_t aligned_steps_ = 0;
  uint64_t timed_out_steps_ = 0;
  int64_t last_record_unix_ns_ = 0;
};

}  // namespace rankwatch
