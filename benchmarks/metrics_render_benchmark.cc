// The cost of rankwatchd's metrics on prometheus-cpp with many jobs: rendering /metrics
// (Collect() and TextSerializer behind PrometheusRegistry::Render), and removing one job's
// series (the library removes a series by scanning its family). 20 gauge families of 5 series a
// job, label values shaped like rankwatchd's (training_job plus two short labels).
//
//   build/benchmarks/metrics_render_benchmark --benchmark_repetitions=5
#include <benchmark/benchmark.h>

#include <string>
#include <vector>

#include "metrics/prometheus_registry.h"

namespace rankwatch {
namespace {

std::vector<MetricFamily*> Fill(PrometheusRegistry* r, int jobs) {
  std::vector<MetricFamily*> families;
  for (int f = 0; f < 20; ++f) {
    MetricFamily* family = r->Gauge("rankwatch_bench_" + std::to_string(f) + "_seconds",
                                    "A family.", {"training_job", "phase", "stat"});
    for (int j = 0; j < jobs; ++j) {
      const std::string job = "soak1-" + std::to_string(j);
      for (int s = 0; s < 5; ++s) {
        family->WithLabels({job, "phase" + std::to_string(s), "median"})->Set(j * 0.001 + s);
      }
    }
    families.push_back(family);
  }
  return families;
}

void BM_Render(benchmark::State& state) {
  PrometheusRegistry r;
  Fill(&r, static_cast<int>(state.range(0)));
  size_t bytes = 0;
  for (auto _ : state) {
    std::string text = r.Render();
    bytes = text.size();
    benchmark::DoNotOptimize(text);
  }
  state.counters["series"] = static_cast<double>(state.range(0)) * 100;
  state.counters["bytes"] = static_cast<double>(bytes);
}
BENCHMARK(BM_Render)->Arg(1000)->Arg(10000)->Unit(benchmark::kMillisecond);

// Removing one job's 100 series (5 in each of the 20 families); they are added back untimed.
void BM_RemoveJob(benchmark::State& state) {
  PrometheusRegistry r;
  const std::vector<MetricFamily*> families = Fill(&r, static_cast<int>(state.range(0)));
  const std::string job = "soak1-" + std::to_string(state.range(0) / 2);
  for (auto _ : state) {
    for (MetricFamily* f : families) f->RemoveWhereFirstLabel(job);
    state.PauseTiming();
    for (MetricFamily* f : families) {
      for (int s = 0; s < 5; ++s) f->WithLabels({job, "phase" + std::to_string(s), "median"});
    }
    state.ResumeTiming();
  }
}
BENCHMARK(BM_RemoveJob)->Arg(1000)->Arg(10000)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace rankwatch

BENCHMARK_MAIN();
