// Cost of the step-time diagnosis: re-evaluating one job after an aligned step (the daemon
// does it at most every 100 ms per job), with a full K=100 window, for 1,024 and 16,384 ranks.
// Baseline in the same run: ComputePhaseStats alone (the window statistics every snapshot
// already paid for before the diagnosis existed).
#include <benchmark/benchmark.h>

#include "collectors/simulator/fleet_model.h"
#include "operators/phase_stats.h"
#include "operators/step_time_diagnosis.h"

namespace rankwatch {
namespace {

struct Job {
  explicit Job(uint32_t ranks) : window(ranks, {.steps = 100}) {
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
    }
  }
  StepWindow window;
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

void BM_PhaseStatsOnly(benchmark::State& state) {
  Job job(static_cast<uint32_t>(state.range(0)));
  for (auto _ : state) benchmark::DoNotOptimize(ComputePhaseStats(job.window));
}
BENCHMARK(BM_PhaseStatsOnly)->Arg(1024)->Arg(16384)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace rankwatch

BENCHMARK_MAIN();
