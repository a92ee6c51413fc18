// The live kernel path on one core: the kernel events of a Kineto fixture, as `rankwatch replay`
// publishes them (each event tagged with its step, batches of 20,000 events at most), through
// KernelAccumulator — accumulate per (rank, step), then on each step's close the loading
// pipeline and every analysis (BuildTimelines + AnalyzeRank, corrected mode). Items = kernel
// events; target (issue #6): >= 1,000,000 events/s.
//
// BM_DecodeAndAccumulate also parses each serialized batch with BatchDecoder first (what the
// daemon does per Kafka message); BM_DecodeOnly is that parse alone, as a baseline.
#include <benchmark/benchmark.h>
#include <spdlog/spdlog.h>

#include <string>
#include <vector>

#include "collectors/kineto_replay.h"
#include "ingest/batch_decoder.h"
#include "operators/kernel/kernel_accumulator.h"

namespace rankwatch {
namespace {

const char* const kFixtures[] = {"hta-trace-filter-2rank", "hta-negative-queue-rank0",
                                 "hta-nccl-ddp-rank0"};

struct Input {
  std::vector<v1::Batch> batches;
  std::vector<std::string> messages;
  int64_t events = 0;
};

const Input& Load(int fixture) {
  static Input inputs[3];
  Input& in = inputs[fixture];
  if (!in.batches.empty()) return in;
  const std::string dir = std::string(RANKWATCH_FIXTURES) + "/kineto/" + kFixtures[fixture];
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().extension() == ".gz") files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  spdlog::set_level(spdlog::level::warn);
  KinetoReplayOptions o;
  o.training_job = "bench";
  KinetoReplayStats stats;
  auto s = ReplayKinetoTraces(
      files, o,
      [&](const v1::Batch& b) {
        in.batches.push_back(b);
        in.messages.push_back(b.SerializeAsString());
        in.events += b.kernels_size();
        return absl::OkStatus();
      },
      &stats);
  if (!s.ok()) std::abort();
  return in;
}

void BM_Accumulate(benchmark::State& state) {
  const Input& in = Load(static_cast<int>(state.range(0)));
  uint64_t closed = 0;
  for (auto _ : state) {
    kernel::KernelAccumulator acc("bench", {});
    for (const v1::Batch& b : in.batches) closed += acc.Add(b).steps_closed;
    benchmark::DoNotOptimize(acc.steps_closed());
  }
  state.SetItemsProcessed(state.iterations() * in.events);
  state.SetLabel(std::string(kFixtures[state.range(0)]) + ", " + std::to_string(in.events) +
                 " events, " + std::to_string(closed / state.iterations()) +
                 " (rank, step) windows");
}

void BM_DecodeAndAccumulate(benchmark::State& state) {
  const Input& in = Load(static_cast<int>(state.range(0)));
  BatchDecoder decoder;
  v1::Batch batch;
  std::string detail;
  for (auto _ : state) {
    kernel::KernelAccumulator acc("bench", {});
    for (const std::string& m : in.messages) {
      if (decoder.Decode(m, &batch, &detail) != RejectReason::kNone) std::abort();
      acc.Add(batch);
    }
    benchmark::DoNotOptimize(acc.steps_closed());
  }
  state.SetItemsProcessed(state.iterations() * in.events);
  state.SetLabel(kFixtures[state.range(0)]);
}

void BM_DecodeOnly(benchmark::State& state) {
  const Input& in = Load(static_cast<int>(state.range(0)));
  BatchDecoder decoder;
  v1::Batch batch;
  std::string detail;
  for (auto _ : state) {
    for (const std::string& m : in.messages) {
      if (decoder.Decode(m, &batch, &detail) != RejectReason::kNone) std::abort();
    }
    benchmark::DoNotOptimize(batch);
  }
  state.SetItemsProcessed(state.iterations() * in.events);
  state.SetLabel(kFixtures[state.range(0)]);
}

BENCHMARK(BM_Accumulate)->DenseRange(0, 2)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_DecodeAndAccumulate)->DenseRange(0, 2)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_DecodeOnly)->DenseRange(0, 2)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace rankwatch

BENCHMARK_MAIN();
