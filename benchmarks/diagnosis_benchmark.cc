// Cost of the step-time diagnosis: re-evaluating one job after an aligned step (the daemon
// does it at most every 100 ms per job), with a full K=100 window, for 1,024 and 16,384 ranks.
// Baseline in the same run: ComputePhaseStats alone (the window statistics every snapshot
// already paid for before the diagnosis existed).
#include <benchmark/benchmark.h>

#include "collectors/simulator/fleet_model.h"
#include "operators/job_pipeline.h"
#include "operators/memory_diagnosis.h"
#include "operators/phase_stats.h"
#include "operators/step_time_diagnosis.h"

namespace rankwatch {
namespace {

struct Job {
  explicit Job(uint32_t ranks) : window(ranks, {.steps = 100}), memory(ranks, {}) {
    FleetOptions o;
    o.ranks = ranks;
    o.report_collective = true;
    o.faults.push_back(*ParseFaultSpec("slow-compute:7:0.3"));
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

void BM_DiagnoseMemory(benchmark::State& state) {
  Job job(static_cast<uint32_t>(state.range(0)));
  for (auto _ : state) benchmark::DoNotOptimize(DiagnoseMemory(job.memory, {}));
}
BENCHMARK(BM_DiagnoseMemory)->Arg(1024)->Arg(16384)->Unit(benchmark::kMillisecond);

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
