// What one core of rankwatchd's ingest thread handles: serialized telemetry messages through
// JobRouter::HandleMessage (decode, validate, route, align, windows, memory, lost time, the
// step diagnosis' onset checks, metrics), its 20-ms ticks (the jobs' evaluations and alerts) and
// a checkpoint collected and serialized every 500,000 records, as rankwatchd's main loop does
// them — without librdkafka and RocksDB. Items are step records.
//
// Workloads (the benchmark's argument):
//   0  ddp-256:       one data-parallel job of 256 ranks (benchmarks/e2e_throughput.py's job)
//   1  ddp-16x16:     16 data-parallel jobs of 16 ranks (benchmarks/catchup.py's jobs)
//   2  pipeline+ddp:  a 256-rank pipeline job (dp 8 x pp 4 x tp 8, 8 microbatches, 1F1B: a
//                     middle stage's rank-step carries 54 ops) and a 256-rank DDP job, their
//                     messages interleaved
//   3  ddp-256-straggler: workload 0 with rank 17 50% slower in compute from the first step
//                     (`simulate --fault slow-compute:17:0.5`)
// Messages as `rankwatch simulate` publishes them: one rank's 20 consecutive steps a message,
// in step-chunk order across ranks, 2,000 steps a job.
#include <benchmark/benchmark.h>
#include <spdlog/spdlog.h>

#include <string>
#include <vector>

#include "collectors/simulator/fault_spec.h"
#include "collectors/simulator/fleet_model.h"
#include "collectors/simulator/pipeline_schedule.h"
#include "common/wall_clock.h"
#include "metrics/daemon_metrics.h"
#include "runtime/job_router.h"
#include "state/state_store.h"

namespace rankwatch {
namespace {

// The daemon's log lines (a new job, an alert firing) are not what is measured.
const bool kQuiet = (spdlog::set_level(spdlog::level::err), true);

constexpr uint32_t kStepsPerBatch = 20;
constexpr uint64_t kSteps = 2000;
constexpr int64_t kRecordsPerCheckpoint = 500'000;
constexpr auto kTick = std::chrono::milliseconds(20);

struct Message {
  std::string payload;
  int records;
};

// One job's messages, in the order the simulator publishes them.
std::vector<Message> JobMessages(const std::string& job, uint32_t ranks,
                                 const std::string& parallel = "", const std::string& fault = "") {
  FleetOptions o;
  o.training_job = job;
  o.ranks = ranks;
  o.report_collective = true;
  if (!fault.empty()) o.faults.push_back(*ParseFaultSpec(fault));
  if (!parallel.empty()) o.parallel = *ParsePipelineSpec(parallel);
  FleetModel model(o);
  model.set_job_start_unix_ns(WallNowUnixNs() - 2 * static_cast<int64_t>(kSteps) * 100'000'000);
  std::vector<v1::Batch> batches(ranks);
  for (uint32_t r = 0; r < ranks; ++r) {
    batches[r].set_schema_version(kSchemaVersion);
    v1::SourceIdentity* src = batches[r].mutable_source();
    src->set_training_job(job);
    src->set_rank(r);
    src->set_world_size(ranks);
    src->set_node(model.NodeName(r));
    if (o.parallel.has_value()) *src->mutable_layout() = model.LayoutOf(r);
  }
  std::vector<Message> out;
  std::vector<v1::StepRecord> records;
  std::vector<bool> reported;
  for (uint64_t s = 0; s < kSteps; ++s) {
    model.Step(s, &records, &reported);
    for (uint32_t r = 0; r < ranks; ++r) {
      *batches[r].add_steps() = records[r];
      if (batches[r].steps_size() == kStepsPerBatch || s + 1 == kSteps) {
        out.push_back({batches[r].SerializeAsString(), batches[r].steps_size()});
        batches[r].clear_steps();
      }
    }
  }
  return out;
}

// Several jobs' messages, interleaved one by one.
std::vector<Message> Interleave(const std::vector<std::vector<Message>>& jobs) {
  std::vector<Message> out;
  for (size_t i = 0;; ++i) {
    bool any = false;
    for (const auto& j : jobs) {
      if (i < j.size()) out.push_back(j[i]), any = true;
    }
    if (!any) return out;
  }
}

std::vector<Message> Workload(int64_t kind) {
  switch (kind) {
    case 0: return JobMessages("ddp-256", 256);
    case 1: {
      std::vector<std::vector<Message>> jobs;
      for (int j = 0; j < 16; ++j) jobs.push_back(JobMessages("ddp-16-" + std::to_string(j), 16));
      return Interleave(jobs);
    }
    case 3: return JobMessages("ddp-256", 256, "", "slow-compute:17:0.5");
    default:
      return Interleave(
          {JobMessages("pipeline-256", 256, "dp=8,pp=4,tp=8,mb=8"), JobMessages("ddp-256", 256)});
  }
}

void BM_Ingest(benchmark::State& state) {
  const std::vector<Message> messages = Workload(state.range(0));
  int64_t records = 0;
  for (auto _ : state) {
    state.PauseTiming();
    PrometheusRegistry registry;
    DaemonMetrics metrics(&registry, "bench");
    SnapshotStore snapshots;
    JobRouterOptions options;
    options.task.pipeline.record_changes = true;
    options.topic = "rankwatch.telemetry";
    auto router = std::make_unique<JobRouter>(options, TaskSinks{&metrics, &snapshots});
    state.ResumeTiming();
    TimePoint next_tick = Clock::now() + kTick;
    int64_t since_checkpoint = 0;
    int64_t offset = 0;
    for (const Message& m : messages) {
      const TimePoint now = Clock::now();
      router->HandleMessage(m.payload, 0, offset++, now, WallNowUnixNs());
      records += m.records;
      since_checkpoint += m.records;
      if (now >= next_tick) {
        router->Tick(now, WallNowUnixNs());
        next_tick = now + kTick;
      }
      if (since_checkpoint >= kRecordsPerCheckpoint) {
        since_checkpoint = 0;
        Checkpoint checkpoint;
        router->Checkpoint(&checkpoint, now, WallNowUnixNs());
        checkpoint.Materialize();  // the checkpoint writer's serialization
        benchmark::DoNotOptimize(checkpoint.bytes());
      }
    }
    state.PauseTiming();
    router.reset();
    state.ResumeTiming();
  }
  state.SetItemsProcessed(records);
}
BENCHMARK(BM_Ingest)
    ->ArgName("workload")
    ->Arg(0)
    ->Arg(1)
    ->Arg(2)
    ->Arg(3)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace rankwatch

BENCHMARK_MAIN();
