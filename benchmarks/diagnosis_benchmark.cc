// Cost of the step-time diagnosis: re-evaluating one job after an aligned step (the daemon
// does it at most every 100 ms per job), with a full K=100 window, for 1,024 and 16,384 ranks.
// Baseline in the same run: ComputePhaseStats alone (the window statistics every snapshot
// already paid for before the diagnosis existed).
#include <benchmark/benchmark.h>

#include "collectors/simulator/fleet_model.h"
#include "operators/job_pipeline.h"
#include "operators/memory_diagnosis.h"
#include "operators/memory_trend.h"
#include "operators/phase_stats.h"
#include "operators/step_time_diagnosis.h"

namespace rankwatch {
namespace {

struct Job {
  explicit Job(uint32_t ranks, bool fault = true)
      : window(ranks, {.steps = 100}), memory(ranks, {}) {
    FleetOptions o;
    o.ranks = ranks;
    o.report_collective = true;
    if (fault) o.faults.push_back(*ParseFaultSpec("slow-compute:7:0.3"));
    FleetModel model(o);
    std::vector<v1::StepRecord> rec;
    std::vector<bool> rep;
    for (uint32_t r = 0; r < ranks; ++r) nodes.push_back(model.NodeName(r));
    for (uint64_t s = 0; s < 100; ++s) {
      model.Step(s, &rec, &rep);
      AlignedStep a{s, ranks, false, {}};
      for (uint32_t r = 0; r < ranks; ++r) a.samples.push_back(ToStepSample(rec[r], r));
      window.Add(a);
      memory.Add(a);
    }
  }
  StepWindow window;
  MemoryWindow memory;
  std::vector<std::string> nodes;
};

void BM_DiagnoseStepTime(benchmark::State& state) {
  Job job(static_cast<uint32_t>(state.range(0)));
  for (auto _ : state) {
    StepDiagnosis d = DiagnoseStepTime(job.window, job.nodes, {}, {});
    if (d.label != StepLabel::kComputeStraggler) state.SkipWithError("wrong diagnosis");
    benchmark::DoNotOptimize(d);
  }
}
BENCHMARK(BM_DiagnoseStepTime)->Arg(1024)->Arg(16384)->Unit(benchmark::kMillisecond);

// A balanced job: no share score names anyone, so the statistical test runs on every signal's
// candidates (step_time/excess_check.h); range(1) = 0 turns it off (the share scores alone).
void BM_DiagnoseStepTimeBalanced(benchmark::State& state) {
  Job job(static_cast<uint32_t>(state.range(0)), /*fault=*/false);
  StepDiagnosisOptions o;
  o.statistical = state.range(1) != 0;
  for (auto _ : state) {
    StepDiagnosis d = DiagnoseStepTime(job.window, job.nodes, {}, o);
    if (!d.culprit_ranks.empty()) state.SkipWithError("a straggler in a balanced job");
    benchmark::DoNotOptimize(d);
  }
}
BENCHMARK(BM_DiagnoseStepTimeBalanced)
    ->Args({1024, 1})
    ->Args({16384, 0})
    ->Args({16384, 1})
    ->Unit(benchmark::kMillisecond);

void BM_DiagnoseMemory(benchmark::State& state) {
  Job job(static_cast<uint32_t>(state.range(0)));
  for (auto _ : state) benchmark::DoNotOptimize(DiagnoseMemory(job.memory, {}));
}
BENCHMARK(BM_DiagnoseMemory)->Arg(1024)->Arg(16384)->Unit(benchmark::kMillisecond);

// The memory diagnosis with a full lifetime trend (512 points a kind: 1,023 steps with memory,
// as any job past 512 steps has; a slow leak, so that every fit runs: both horizons, both
// series), Theil–Sen on at most range(1) pairs per fit: 1,024 (the default), 2,048, or every
// pair (130,816 for 512 points).
void BM_DiagnoseMemoryWithTrend(benchmark::State& state) {
  Job job(static_cast<uint32_t>(state.range(0)));
  MemoryTrend trend;
  for (uint64_t s = 0; s < 1023; ++s) {
    const double b =
        (40.0 + 0.01 * static_cast<double>(s % 7) + 0.001 * static_cast<double>(s)) * (1 << 30);
    trend.Add({s, job.memory.world_size(), {b, 1.04 * b}, {0.99 * b, 1.03 * b}, 80ull << 30});
  }
  MemoryDiagnosisOptions o;
  o.trend_max_pairs = static_cast<size_t>(state.range(1));
  for (auto _ : state) benchmark::DoNotOptimize(DiagnoseMemory(job.memory, &trend, o));
}
BENCHMARK(BM_DiagnoseMemoryWithTrend)
    ->Args({1024, 1024})
    ->Args({16384, 1024})
    ->Args({16384, 2048})
    ->Args({16384, 1 << 20})
    ->Unit(benchmark::kMillisecond);

// A lifetime trend of a `ranks`-rank job over 1,023 steps with memory whose per-rank series are
// full: 32 ranks (every 512th) grow 1 MiB a step on 40 GiB (+2.5 %, too little for a creep, so
// every per-rank fit runs, on both horizons), the others are flat; the summary chose them.
MemoryTrend GrowingRanksTrend(uint32_t ranks) {
  MemoryWindow window(ranks, {});
  MemoryTrend trend({}, ranks);
  AlignedStep a{0, ranks, false, {}};
  a.samples.resize(ranks);
  for (uint64_t s = 0; s < 1023; ++s) {
    a.step = s;
    for (uint32_t r = 0; r < ranks; ++r) {
      StepSample& x = a.samples[r];
      x.step = s;
      x.rank = r;
      const double grown = r % 512 == 0 ? static_cast<double>(s) * (1 << 20) : 0;
      x.peak_allocated_bytes =
          (40ull << 30) + static_cast<uint64_t>(grown) + (s * 7 + r) % 5 * 4096;
      x.peak_reserved_bytes = x.peak_allocated_bytes + (1ull << 30);
      x.device_capacity_bytes = 80ull << 30;
    }
    if (const MemoryWindow::Step* m = window.Add(a)) trend.Add(*m, &window);
  }
  return trend;
}

// The memory diagnosis with full per-rank series too (GrowingRanksTrend): the job series, the
// per-rank pre-ranking of 2 x 32 series, 2 x 8 ranks fitted on both horizons, and the window
// policy on the followed ranks' own peaks.
void BM_DiagnoseMemoryWithRankTrends(benchmark::State& state) {
  Job job(static_cast<uint32_t>(state.range(0)));
  const MemoryTrend trend = GrowingRanksTrend(job.memory.world_size());
  for (auto _ : state) benchmark::DoNotOptimize(DiagnoseMemory(job.memory, &trend, {}));
}
BENCHMARK(BM_DiagnoseMemoryWithRankTrends)->Arg(16384)->Unit(benchmark::kMillisecond);

void BM_PhaseStatsOnly(benchmark::State& state) {
  Job job(static_cast<uint32_t>(state.range(0)));
  for (auto _ : state) benchmark::DoNotOptimize(ComputePhaseStats(job.window));
}
BENCHMARK(BM_PhaseStatsOnly)->Arg(1024)->Arg(16384)->Unit(benchmark::kMillisecond);

// A job's whole re-evaluation as the daemon runs it: JobPipeline::Snapshot (window
// statistics, step-time and memory diagnoses) with full 100-step windows.
void BM_JobSnapshot(benchmark::State& state) {
  const auto ranks = static_cast<uint32_t>(state.range(0));
  FleetOptions o;
  o.ranks = ranks;
  o.report_collective = true;
  FleetModel model(o);
  JobPipeline pipeline("bench", ranks, {});
  std::vector<v1::StepRecord> rec;
  std::vector<bool> rep;
  const TimePoint now{};
  for (uint64_t s = 0; s < 100; ++s) {
    model.Step(s, &rec, &rep);
    for (uint32_t r = 0; r < ranks; ++r) {
      v1::Batch b;
      b.mutable_source()->set_training_job("bench");
      b.mutable_source()->set_rank(r);
      b.mutable_source()->set_world_size(ranks);
      b.mutable_source()->set_node(model.NodeName(r));
      *b.add_steps() = rec[r];
      pipeline.AddBatch(b, now);
    }
  }
  for (auto _ : state) benchmark::DoNotOptimize(pipeline.Snapshot(now));
}
BENCHMARK(BM_JobSnapshot)->Arg(1024)->Arg(16384)->Unit(benchmark::kMillisecond);

// BM_JobSnapshot for a long job: the same 100-step windows, restored from a checkpoint whose
// lifetime memory trend is full (512 points a kind: 1,023 steps of a slow leak), so every
// evaluation fits it. range(1) = 0: the trend off (the memory diagnosis of the window alone, as
// before the trend existed); 1: on (the default), the job series only; 2: on, with full
// per-rank series (GrowingRanksTrend: 2 x 32 ranks followed, 8 a kind fitted on both horizons).
void BM_JobSnapshotLongJob(benchmark::State& state) {
  const auto ranks = static_cast<uint32_t>(state.range(0));
  FleetOptions o;
  o.ranks = ranks;
  o.report_collective = true;
  FleetModel model(o);
  JobPipelineOptions options;
  options.record_changes = true;
  JobPipeline pipeline("bench", ranks, options);
  std::vector<v1::StepRecord> rec;
  std::vector<bool> rep;
  const TimePoint now{};
  for (uint64_t s = 0; s < 100; ++s) {
    model.Step(s, &rec, &rep);
    for (uint32_t r = 0; r < ranks; ++r) {
      v1::Batch b;
      b.mutable_source()->set_training_job("bench");
      b.mutable_source()->set_rank(r);
      b.mutable_source()->set_world_size(ranks);
      b.mutable_source()->set_node(model.NodeName(r));
      *b.add_steps() = rec[r];
      pipeline.AddBatch(b, now);
    }
  }
  JobCheckpoint c = pipeline.TakeCheckpoint(now, 0);
  MemoryTrend trend;
  if (state.range(1) == 2) {
    trend = GrowingRanksTrend(ranks);
  } else {
    for (uint64_t s = 0; s < 1023; ++s) {
      const double b =
          (40.0 + 0.01 * static_cast<double>(s % 7) + 0.001 * static_cast<double>(s)) * (1 << 30);
      trend.Add({s, ranks, {b, 1.04 * b}, {0.99 * b, 1.03 * b}, 80ull << 30});
    }
  }
  *c.meta.mutable_memory_trend() = trend.ExportState();
  options.memory.trend = state.range(1) != 0;
  auto long_job = JobPipeline::Restore(c.meta, c.new_steps, options, now, 0);
  if (!long_job.ok()) {
    state.SkipWithError("restore failed");
    return;
  }
  for (auto _ : state) benchmark::DoNotOptimize((*long_job)->Snapshot(now));
}
BENCHMARK(BM_JobSnapshotLongJob)
    ->Args({16384, 0})
    ->Args({16384, 1})
    ->Args({16384, 2})
    ->Unit(benchmark::kMillisecond);

// The operators end to end on one core: batches of one rank's 20 steps (already decoded)
// through alignment, both windows, and a full snapshot with the step and memory diagnoses
// after every aligned step (the daemon re-evaluates at most every 100 ms; this is the worst
// case of one evaluation per step). Reports rank-step records per second.
void BM_OperatorsDiagnosingEveryStep(benchmark::State& state) {
  const auto ranks = static_cast<uint32_t>(state.range(0));
  constexpr uint64_t kSteps = 200;
  constexpr uint32_t kPerBatch = 20;
  FleetOptions o;
  o.ranks = ranks;
  o.report_collective = true;
  FleetModel model(o);
  std::vector<v1::Batch> batches;
  std::vector<v1::Batch> pending(ranks);
  std::vector<v1::StepRecord> rec;
  std::vector<bool> rep;
  for (uint32_t r = 0; r < ranks; ++r) {
    pending[r].mutable_source()->set_training_job("bench");
    pending[r].mutable_source()->set_rank(r);
    pending[r].mutable_source()->set_world_size(ranks);
    pending[r].mutable_source()->set_node(model.NodeName(r));
  }
  for (uint64_t s = 0; s < kSteps; ++s) {
    model.Step(s, &rec, &rep);
    for (uint32_t r = 0; r < ranks; ++r) {
      *pending[r].add_steps() = rec[r];
      if (pending[r].steps_size() == kPerBatch) {
        batches.push_back(pending[r]);
        pending[r].clear_steps();
      }
    }
  }
  const TimePoint now{};
  int64_t records = 0;
  for (auto _ : state) {
    JobPipeline pipeline("bench", ranks, {});
    for (const v1::Batch& b : batches) {
      const JobDelta d = pipeline.AddBatch(b, now);
      for (uint32_t i = 0; i < d.aligned; ++i) benchmark::DoNotOptimize(pipeline.Snapshot(now));
      records += b.steps_size();
    }
  }
  state.SetItemsProcessed(records);
}
BENCHMARK(BM_OperatorsDiagnosingEveryStep)->Arg(1024)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace rankwatch

BENCHMARK_MAIN();
