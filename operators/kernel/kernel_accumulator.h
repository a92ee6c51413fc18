// KernelAccumulator: the live kernel stage of one training job. It collects the streamed
// kernel events (v1::KernelEvent) of each rank per step, and when a (rank, step) closes it runs
// the same loading pipeline and analyses as `rankwatch analyze` in the corrected mode
// (BuildTimelines, then AnalyzeRank on that step's window), so a replayed trace gives exactly
// the per-step numbers of `rankwatch analyze --format json`. Only summaries of closed steps are
// kept (the last `history_steps` per rank), so memory is bounded by the open steps.
//
// When a step closes: a rank's oldest open step closes once more than `open_steps_per_rank`
// steps are open (events of step N may still arrive while step N+1 has begun), and every open
// step of a rank closes with its final batch. Events for a step already closed are late:
// counted and dropped. Events without a step (step < 0) are counted and dropped: the live path
// analyses per-step windows only.
//
// Pure: the same batches give the same results. Not thread-safe: owned by the ingest thread.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "operators/kernel/kernel_job_summary.h"
#include "operators/kernel/kernel_report.h"
#include "operators/kernel/trace_event.h"
#include "rankwatch/v1/telemetry.pb.h"

namespace rankwatch::kernel {

struct KernelAccumulatorOptions {
  KernelAnalysisOptions analysis;  // default: corrected mode, HTA's cutoffs
  size_t open_steps_per_rank = 2;  // default 2: one step of grace for late kernels
  // Events kept for one (rank, step); further ones are dropped and counted. Default 4,000,000.
  size_t max_events_per_step = 4'000'000;
  // Events held in open steps over all ranks of the job (default 4,000,000, ~0.4 GB), and new
  // steps one batch may open (default 64): further events are dropped and counted over_limit,
  // so one hostile batch can neither hold unbounded memory nor force a million step analyses.
  size_t max_open_events = 4'000'000;
  size_t max_new_steps_per_batch = 64;
  // Distinct operator / kernel names kept per rank (default 65,536); further names are
  // counted under one "(other names)" entry.
  size_t max_names_per_rank = 65'536;
  size_t history_steps = 32;  // closed steps kept per rank: the job's window (default 32)
  KernelOutlierOptions outliers;
};

// What one Add changed.
struct KernelDelta {
  uint64_t accepted = 0;
  uint64_t late = 0;       // for a step already closed
  uint64_t unstepped = 0;  // step < 0
  uint64_t over_limit = 0;
  uint32_t steps_closed = 0;
};

class KernelAccumulator {
 public:
  KernelAccumulator(std::string training_job, KernelAccumulatorOptions options);

  // Adds the kernel events of one validated batch (all of one rank, `batch.source().rank()`),
  // then closes the steps that became complete (see above) and analyses them.
  KernelDelta Add(const v1::Batch& batch);

  // Closes and analyses every open step of every rank (the job ended or is being dropped).
  uint32_t CloseAll();

  // Per-rank windows, job aggregates and outliers now (O(ranks × history_steps)).
  KernelJobSnapshot Snapshot() const;

  uint64_t steps_closed() const { return steps_closed_; }

 private:
  struct OpenStep {
    std::vector<TraceEvent> events;
  };
  struct Rank {
    StringTable strings{std::string()};
    absl::flat_hash_map<std::string, uint32_t> ids{{std::string(), 0}};
    std::map<int64_t, OpenStep> open;  // by step
    int64_t closed_through = -1;       // every step <= this is closed
    uint32_t next_index = 1;           // synthetic row labels; 0 is HTA's "unlinked"
    std::deque<KernelStepSummary> recent;
    uint64_t steps_closed = 0;
  };

  uint32_t Intern(Rank& r, const std::string& s);
  void Close(uint32_t rank_id, Rank& r, int64_t step, OpenStep& open);

  const std::string training_job_;
  const KernelAccumulatorOptions options_;
  uint32_t world_size_ = 0;
  std::map<uint32_t, Rank> ranks_;
  std::vector<uint32_t> remap_;  // scratch: batch string id -> rank string id
  uint64_t accepted_ = 0, late_ = 0, unstepped_ = 0, over_limit_ = 0, steps_closed_ = 0;
  size_t open_events_ = 0;  // events held in open steps, over every rank
};

}  // namespace rankwatch::kernel
