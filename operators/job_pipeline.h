// JobPipeline: the chain of step operators for one training job — alignment across ranks, then
// the rolling windows of steps and memory, the lifetime memory trend, lost time and, for a
// pipeline-parallel job, the what-if (operators/whatif/) — and the read-only snapshot of its
// step-time and memory diagnoses that the metrics and queries publish (metrics/, serving/).
//
// Pure: given the same batches and the same `now` values it produces the same snapshots.
// Not thread-safe: owned by the PartitionTask of the job's partition (runtime/partition_task.h),
// on the daemon's ingest thread; snapshots are immutable copies, read from any thread.
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "operators/lost_time.h"
#include "operators/memory_diagnosis.h"
#include "operators/memory_trend.h"
#include "operators/memory_window.h"
#include "operators/phase_stats.h"
#include "operators/step_aligner.h"
#include "operators/step_time/onset.h"
#include "operators/step_time_diagnosis.h"
#include "operators/step_window.h"
#include "operators/whatif/step_assembler.h"
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
  // The what-if analysis of pipeline-parallel jobs (operators/whatif/, docs/whatif.md).
  whatif::AssemblerOptions whatif;
  // The straggler's onset is held across window slides and restarts (step_time/onset.h): the
  // step diagnosis checks it every this many aligned steps, a function of the steps alone (not
  // of when snapshots are taken). 0: a tenth of the window (at least 1).
  uint32_t onset_check_steps = 0;
  // Input that would corrupt a job is rejected and counted (JobDelta):
  // - A rank claimed by a second node while its node sent within this long: the second
  //   node's batches are rejected; after this much silence the rank moves. Default: 60 s.
  Duration rank_takeover_after = std::chrono::seconds(60);
  // - A world size change less than this after the previous one (ranks of two incarnations
  //   interleaving), or back to the previous size within six times this. Default: 10 s.
  Duration world_size_grace = std::chrono::seconds(10);
  // - A step record more than this many steps ahead of its rank's previous step. Default: 2^20.
  uint64_t max_step_jump = 1u << 20;
};

// What one call changed; the caller turns it into metrics.
struct JobDelta {
  uint32_t accepted = 0;
  uint32_t duplicate = 0;
  uint32_t late = 0;
  uint32_t rank_out_of_range = 0;
  uint32_t aligned = 0;
  uint32_t aligned_timed_out = 0;
  uint32_t rank_conflict = 0;     // batches: another node claims the rank
  uint32_t stale_world_size = 0;  // batches: a world size change too soon after the last
  uint32_t step_jump = 0;         // records: too far ahead of their rank's previous step
  uint32_t world_size_changed = 0;
  // The first time the job sees each kind of rejected input: one line for a person to read.
  std::string note;
};

// The scheduler's names for a job, as its ranks' collectors report them (SchedulerIdentity in
// telemetry.proto; the latest a rank sent wins). All "" when no collector says.
struct JobScheduler {
  std::string scheduler;      // "kubernetes", "slurm", "torchrun"
  std::string job;            // the scheduler's job id
  std::string k8s_namespace;  // Kubernetes namespace
  std::string owner;          // Kubernetes owner of the pods
  bool empty() const { return scheduler.empty() && job.empty(); }
  bool operator==(const JobScheduler&) const = default;
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
  // Records the job's collectors dropped before sending them (Batch.dropped_records: a full
  // buffer, a message over the size limit, a failed delivery), summed over its ranks.
  uint64_t collector_dropped_records = 0;
  // Step records accepted since the job started, by their clock: host, device, device_missing
  // (StepRecord.clock; checkpointed).
  std::array<uint64_t, 3> step_records_by_clock{};
  int64_t evaluated_unix_ns = 0;  // wall clock of the evaluation, set by the caller
  // Each rank's phase sums and counts over the window (for per-rank detail), and its memory
  // peaks over the memory window (0 = none reported), indexed by rank.
  std::shared_ptr<const std::vector<StepWindow::RankTotals>> rank_totals;
  std::shared_ptr<const std::vector<double>> rank_peak_allocated;
  std::shared_ptr<const std::vector<double>> rank_peak_reserved;
  // The lifetime memory trend's points of the kind the memory diagnosis reports.
  std::shared_ptr<const std::vector<MemoryTrend::Point>> memory_trend_points;
  // Node of each rank ("" when unknown); shared with the pipeline, replaced when one changes.
  std::shared_ptr<const std::vector<std::string>> rank_nodes;
  // The node of `rank`, or "" when unknown.
  const std::string& NodeOf(uint32_t rank) const;
  // Pod of each rank ("" when unknown), like rank_nodes; null when no rank said one.
  std::shared_ptr<const std::vector<std::string>> rank_pods;
  const std::string& PodOf(uint32_t rank) const;
  JobScheduler scheduler;
  // The what-if analysis and its verdict; null for a job without a pipeline layout.
  std::shared_ptr<const whatif::WhatIfSnapshot> whatif;
};

// What a checkpoint of one job writes: its metadata (aligner, lifetime memory trend, the
// what-if's state, the straggler's held onset, ...), the steps aligned since the previous
// checkpoint, and the oldest step any window still needs (older stored steps can go); for a
// pipeline job also the ops of the steps the what-if analysed since, and the oldest step of its
// window.
struct JobCheckpoint {
  state::v1::JobMeta meta;
  std::vector<state::v1::StoredStep> new_steps;
  uint64_t keep_from_step = 0;
  std::vector<state::v1::WhatIfStepOps> new_whatif_steps;
  uint64_t whatif_keep_from_step = 0;
};

class JobPipeline {
 public:
  JobPipeline(std::string training_job, uint32_t world_size, JobPipelineOptions options);

  // Adds the step records of a validated batch of this job. A batch that declares another
  // world size restarts alignment and the window at that size (an elastic restart), unless
  // it comes within options.world_size_grace of the previous change.
  JobDelta AddBatch(const v1::Batch& batch, TimePoint now);

  // Closes steps whose alignment timeout passed. Call periodically even without input.
  JobDelta Tick(TimePoint now);
  // The job's input could not be read for `by` (a restored state waiting for its partition):
  // its open steps' alignment timeouts move that much later.
  void DelayAlignment(Duration by) { aligner_->Delay(by); }

  // `ranks` serve evidence now (a capture: Evidence::BusyRanks) and their steps or telemetry
  // may lag. When one of them is among the ranks furthest behind (or every rank is), the hang
  // clock starts again at `now`: time spent serving evidence is not a hang, and the hang
  // diagnosis and its loss count from when the evidence let go. Held in memory only.
  void NoteEvidenceBusy(const std::vector<uint32_t>& ranks, TimePoint now);

  // Messages of the job's partition were lost before they were read (the consumer's position
  // jumped past them): the job's input may be incomplete.
  void NoteInputLost(uint64_t messages) { input_lost_messages_ += messages; }

  // Computes the current snapshot and diagnosis at `now` (O(ranks * phases)).
  JobSnapshot Snapshot(TimePoint now) const;

  // The job's durable state since the previous call (requires options.record_changes).
  JobCheckpoint TakeCheckpoint(TimePoint now, int64_t wall_now_unix_ns);

  // Rebuilds a pipeline from its metadata and its stored steps (ascending; at least every step
  // from the checkpoint's keep_from_step on) and, for a pipeline job, the what-if's stored steps
  // (ascending, from whatif_keep_from_step on). The result behaves exactly like the pipeline
  // that was checkpointed (the what-if's decompositions within its 1 % recompute tolerance).
  // A damaged state is DataLoss.
  static absl::StatusOr<std::unique_ptr<JobPipeline>> Restore(
      const state::v1::JobMeta& meta, const std::vector<state::v1::StoredStep>& steps,
      JobPipelineOptions options, TimePoint now, int64_t wall_now_unix_ns,
      const std::vector<state::v1::WhatIfStepOps>& whatif_steps = {});

  const std::string& training_job() const { return training_job_; }
  uint32_t world_size() const { return aligner_->world_size(); }
  // Steps every rank reported (aligned without a timeout).
  uint64_t complete_steps() const { return aligned_steps_ - timed_out_steps_; }
  // Whether the job has a diagnosis that time alone can change: enough steps in its window to
  // be judged (a hang; an alert's pending time). A job without it — an id that never became a
  // job — needs no re-evaluation while silent.
  bool judged() const { return window_->size() >= options_.diagnosis.min_steps; }

 private:
  void Reset(uint32_t world_size);
  void Consume(TimePoint now, JobDelta* delta);
  // The step diagnosis of the window as it stands, updating the straggler's held onset.
  void CheckOnset();
  // Counts hang loss up to `now` while the job is hung (as the step diagnosis would say).
  void CountHang(TimePoint now);
  // Whether a batch from `node` for `rank` is refused: another node holds the rank.
  bool RankClaimedElsewhere(uint32_t rank, const std::string& node, TimePoint now, JobDelta* delta);
  // Whether a batch declaring `world_size` is refused: a change too soon after the last.
  void NoteScheduler(uint32_t rank, const v1::SchedulerIdentity& s);
  bool StaleWorldSize(uint32_t world_size, TimePoint now, JobDelta* delta);
  // Sets delta->note to `note` the first time the job sees input of `kind`.
  void NoteOnce(int kind, JobDelta* delta, std::string note);
  // The oldest step either window still holds (0: none).
  uint64_t KeepFromStep() const;

  const std::string training_job_;
  const JobPipelineOptions options_;
  std::unique_ptr<StepAligner> aligner_;
  std::unique_ptr<StepWindow> window_;
  std::unique_ptr<MemoryWindow> memory_window_;
  std::unique_ptr<MemoryTrend> memory_trend_;
  std::unique_ptr<whatif::StepAssembler> whatif_;  // pipeline jobs' op records and what-if
  std::unique_ptr<LostTime> lost_;
  bool sharded_ = false;             // a collector said the job shards its parameters
  double hang_counted_seconds_ = 0;  // hang loss counted since the last progress
  uint64_t input_lost_messages_ = 0;
  uint64_t collector_dropped_records_ = 0;
  std::array<uint64_t, 3> step_records_by_clock_{};  // as JobSnapshot's
  std::vector<AlignedStep> closed_;                  // scratch, reused
  // With options.record_changes: the steps aligned since the last checkpoint that a window
  // still holds (older ones are dropped as the windows slide: a checkpoint would delete them),
  // encoded when a checkpoint takes them; the what-if's ops of the same steps, encoded.
  std::deque<AlignedStep> unsaved_steps_;
  std::deque<state::v1::WhatIfStepOps> unsaved_whatif_steps_;
  // The step diagnosis' straggler onset, held (updated by CheckOnset; snapshots read it).
  step_time::OnsetHold straggler_onset_;
  std::shared_ptr<const std::vector<std::string>> rank_nodes_;
  std::shared_ptr<const std::vector<std::string>> rank_pods_;  // null until a rank names its pod
  JobScheduler scheduler_;
  std::vector<TimePoint> rank_last_batch_;  // when each rank last sent a batch (in memory only)
  uint32_t previous_world_size_ = 0;        // before the last change (0: none)
  TimePoint world_size_changed_at_{};
  uint32_t noted_ = 0;         // kinds of rejected input already noted (bit per kind)
  TimePoint last_progress_{};  // when a step last aligned, or when the job was first seen
  // When a rank furthest behind last served evidence (min: never).
  TimePoint evidence_busy_at_ = TimePoint::min();
  // Where the hang clock starts: the later of the last progress and the last evidence served.
  TimePoint HangClockStart() const { return std::max(last_progress_, evidence_busy_at_); }
  std::vector<bool> finished_ranks_;
  uint32_t finished_count_ = 0;
  bool seen_ = false;
  uint64_t aligned_steps_ = 0;
  uint64_t timed_out_steps_ = 0;
  int64_t last_record_unix_ns_ = 0;
};

}  // namespace rankwatch
