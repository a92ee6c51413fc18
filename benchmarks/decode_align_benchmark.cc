// Decode + align throughput of the daemon's hot path on one core: protobuf batches as
// `rankwatch simulate` produces them (one rank's 20 consecutive steps per message, messages in
// step-chunk order across ranks) through BatchDecoder and JobPipeline (alignment + window).
//
// Baseline in the same run: BM_ParseOnly, protobuf parsing alone, so the cost of validation,
// alignment and windowing reads as a ratio.
#include <benchmark/benchmark.h>

#include "collectors/simulator/fleet_model.h"
#include "ingest/batch_decoder.h"
#include "operators/job_pipeline.h"

namespace rankwatch {
namespace {

constexpr uint32_t kStepsPerBatch = 20;

// Messages for `ranks` x `steps`, in the order the simulator publishes them.
std::vector<std::string> MakeMessages(uint32_t ranks, uint64_t steps) {
  FleetOptions o;
  o.training_job = "bench";
  o.ranks = ranks;
  o.report_collective = true;
  FleetModel model(o);
  std::vector<v1::Batch> batches(ranks);
  for (uint32_t r = 0; r < ranks; ++r) {
    batches[r].set_schema_version(kSchemaVersion);
    batches[r].mutable_source()->set_training_job("bench");
    batches[r].mutable_source()->set_rank(r);
    batches[r].mutable_source()->set_world_size(ranks);
    batches[r].mutable_source()->set_node(model.NodeName(r));
  }
  std::vector<std::string> out;
  std::vector<v1::StepRecord> records;
  std::vector<bool> reported;
  for (uint64_t s = 0; s < steps; ++s) {
    model.Step(s, &records, &reported);
    for (uint32_t r = 0; r < ranks; ++r) {
      *batches[r].add_steps() = records[r];
      if (batches[r].steps_size() == kStepsPerBatch || s + 1 == steps) {
        out.push_back(batches[r].SerializeAsString());
        batches[r].clear_steps();
      }
    }
  }
  return out;
}

void BM_DecodeAlign(benchmark::State& state) {
  const auto ranks = static_cast<uint32_t>(state.range(0));
  const uint64_t steps = 200;
  const std::vector<std::string> messages = MakeMessages(ranks, steps);
  BatchDecoder decoder;
  v1::Batch batch;
  int64_t records = 0;
  uint64_t aligned = 0;
  const TimePoint now{};
  for (auto _ : state) {
    JobPipeline pipeline("bench", ranks, {});
    for (const std::string& m : messages) {
      if (decoder.Decode(m, &batch) != RejectReason::kNone) state.SkipWithError("rejected");
      aligned += pipeline.AddBatch(batch, now).aligned;
      records += batch.steps_size();
    }
  }
  if (aligned != steps * state.iterations()) state.SkipWithError("not every step aligned");
  state.SetItemsProcessed(records);
}
BENCHMARK(BM_DecodeAlign)->Arg(64)->Arg(256)->Arg(1024)->Unit(benchmark::kMillisecond);

// The daemon's path: the same over 600 steps, with every aligned step kept for the state
// (record_changes) and taken by a checkpoint every 20 messages a rank, and the job re-evaluated
// (Snapshot) every 10 aligned steps.
void BM_DecodeAlignRecorded(benchmark::State& state) {
  const auto ranks = static_cast<uint32_t>(state.range(0));
  const uint64_t steps = 600;  // the window (100 steps) full for most of them
  const std::vector<std::string> messages = MakeMessages(ranks, steps);
  BatchDecoder decoder;
  v1::Batch batch;
  int64_t records = 0;
  uint64_t aligned = 0;
  const TimePoint now{};
  JobPipelineOptions options;
  options.record_changes = true;
  for (auto _ : state) {
    JobPipeline pipeline("bench", ranks, options);
    size_t n = 0;
    uint64_t evaluated_at = 0;
    for (const std::string& m : messages) {
      if (decoder.Decode(m, &batch) != RejectReason::kNone) state.SkipWithError("rejected");
      aligned += pipeline.AddBatch(batch, now).aligned;
      records += batch.steps_size();
      if (++n % (20 * ranks) == 0) benchmark::DoNotOptimize(pipeline.TakeCheckpoint(now, 0));
      if (pipeline.complete_steps() >= evaluated_at + 10) {
        evaluated_at = pipeline.complete_steps();
        benchmark::DoNotOptimize(pipeline.Snapshot(now));
      }
    }
  }
  if (aligned != steps * state.iterations()) state.SkipWithError("not every step aligned");
  state.SetItemsProcessed(records);
}
BENCHMARK(BM_DecodeAlignRecorded)->Arg(256)->Arg(1024)->Unit(benchmark::kMillisecond);

void BM_ParseOnly(benchmark::State& state) {
  const auto ranks = static_cast<uint32_t>(state.range(0));
  const std::vector<std::string> messages = MakeMessages(ranks, 200);
  v1::Batch batch;
  int64_t records = 0;
  for (auto _ : state) {
    for (const std::string& m : messages) {
      batch.ParseFromString(m);
      records += batch.steps_size();
    }
  }
  state.SetItemsProcessed(records);
}
BENCHMARK(BM_ParseOnly)->Arg(64)->Arg(1024)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace rankwatch

BENCHMARK_MAIN();
