// Recovery time and checkpoint cost of rankwatchd's durable state (issue #4, acceptance 4):
// 100 jobs x 1,024 ranks with full 100-step windows, in a RocksDB StateStore on local disk,
// checkpointed the way the daemon does it (StateSync: the ingest thread collects budgeted
// rounds of whole partitions, a CheckpointWriter thread serialises, writes and fsyncs them).
//
// Measures, in one run:
//   * the first (full) checkpoint: rounds, the longest pause of the calling (ingest) thread in
//     one round, the time until all of it is durable, and bytes;
//   * a steady-state checkpoint after one more aligned step of every job (what a 1 s interval
//     writes when every job advanced by a step): the ingest thread's pause, the writer's time,
//     bytes;
//   * recovery: open the store, restore every job, publish every job's snapshot (the point at
//     which GetDiagnosis answers again): seconds.
// With --crash the first store is closed without flushing, as after a SIGKILL: recovery then
// replays whatever RocksDB's write-ahead log holds beyond the writer's last flush (a crash
// right after the first full checkpoint: the worst case). With --crash-steady the first
// checkpoint is also flushed to tables before the steady one, and only the last checkpoint's
// log is replayed.
// With --parallel SPEC (`rankwatch simulate --parallel`'s, e.g. dp=8,pp=8,tp=16,mb=8; --ranks is
// then its world size) the jobs are pipeline-parallel with a slow worker: their what-if state and
// the ops of its window are checkpointed too, and `whatif_bytes` says how much of the store they
// take (keys "w" and the metadata's WhatIfState). --without-whatif sends the same records without
// their layout: no what-if, as before its state was checkpointed.
// Prints one JSON line. Usage: recovery_benchmark [--jobs 100] [--ranks 1024] [--partitions 6]
//   [--budget-mib 16] [--dir D] [--crash | --crash-steady] [--parallel SPEC [--without-whatif]]
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <thread>

#include "collectors/simulator/fleet_model.h"
#include "collectors/simulator/pipeline_schedule.h"
#include "ingest/batch_decoder.h"
#include "runtime/job_router.h"
#include "runtime/task_manager.h"
#include "state/checkpoint_writer.h"

#include <spdlog/spdlog.h>

namespace rankwatch {
namespace {

using Seconds = std::chrono::duration<double>;

// Feeds `steps` steps of `ranks` ranks for `job` into the router, 20 steps per message.
bool with_layout = true;

void Feed(JobRouter& router, FleetModel& model, const std::string& job, uint32_t ranks,
          uint64_t first, uint64_t steps, int32_t partition, int64_t* offset) {
  std::vector<v1::Batch> pending(ranks);
  for (uint32_t r = 0; r < ranks; ++r) {
    pending[r].set_schema_version(kSchemaVersion);
    pending[r].mutable_source()->set_training_job(job);
    pending[r].mutable_source()->set_rank(r);
    pending[r].mutable_source()->set_world_size(ranks);
    pending[r].mutable_source()->set_node(model.NodeName(r));
    if (model.options().parallel && with_layout) {
      *pending[r].mutable_source()->mutable_layout() = model.LayoutOf(r);
    }
  }
  std::vector<v1::StepRecord> rec;
  std::vector<bool> rep;
  std::string bytes;
  const TimePoint now{};
  for (uint64_t s = first; s < first + steps; ++s) {
    model.Step(s, &rec, &rep);
    for (uint32_t r = 0; r < ranks; ++r) {
      *pending[r].add_steps() = rec[r];
      if (pending[r].steps_size() == 20 || s + 1 == first + steps) {
        pending[r].SerializeToString(&bytes);
        router.HandleMessage(bytes, partition, (*offset)++, now, 0);
        pending[r].clear_steps();
      }
    }
  }
}

}  // namespace
}  // namespace rankwatch

int main(int argc, char** argv) {
  using namespace rankwatch;
  uint32_t jobs = 100, ranks = 1024, partitions = 6;
  size_t budget_mib = TaskManagerOptions().checkpoint_max_bytes >> 20;
  std::filesystem::path dir = std::filesystem::temp_directory_path() / "rankwatch-recovery-bench";
  bool crash = false, steady = false;
  std::optional<PipelineSpec> parallel;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--crash")) crash = true;
    if (!std::strcmp(argv[i], "--crash-steady")) crash = steady = true;
    if (!std::strcmp(argv[i], "--without-whatif")) with_layout = false;
    if (i + 1 >= argc) continue;
    if (!std::strcmp(argv[i], "--jobs")) jobs = static_cast<uint32_t>(std::atoi(argv[i + 1]));
    if (!std::strcmp(argv[i], "--ranks")) ranks = static_cast<uint32_t>(std::atoi(argv[i + 1]));
    if (!std::strcmp(argv[i], "--partitions")) {
      partitions = static_cast<uint32_t>(std::max(1, std::atoi(argv[i + 1])));
    }
    if (!std::strcmp(argv[i], "--budget-mib"))
      budget_mib = static_cast<size_t>(std::atoi(argv[i + 1]));
    if (!std::strcmp(argv[i], "--dir")) dir = argv[i + 1];
    if (!std::strcmp(argv[i], "--parallel")) {
      auto spec = ParsePipelineSpec(argv[i + 1]);
      if (!spec.ok()) {
        std::fprintf(stderr, "%s\n", std::string(spec.status().message()).c_str());
        return 2;
      }
      parallel = *spec;
      ranks = parallel->world_size();
    }
  }
  std::filesystem::remove_all(dir);
  spdlog::set_level(spdlog::level::warn);
  PrometheusRegistry registry;
  DaemonMetrics metrics(&registry, "bench");
  SnapshotStore snapshots;
  JobRouterOptions options;
  options.task.pipeline.record_changes = true;
  options.topic = "rankwatch.telemetry";
  const TimePoint now{};
  const int64_t wall = 1'795'000'000'000'000'000;

  std::vector<int64_t> offsets(partitions, 0);
  std::vector<std::unique_ptr<FleetModel>> models;
  {
    StateStoreOptions first{dir};
    first.flush_on_close = !crash;
    auto store = StateStore::Open(first);
    if (!store.ok()) {
      std::fprintf(stderr, "%s\n", std::string(store.status().message()).c_str());
      return 1;
    }
    JobRouter router(options, {&metrics, &snapshots});
    std::fprintf(stderr, "recovery_benchmark: building %u jobs x %u ranks x 100 steps...\n", jobs,
                 ranks);
    for (uint32_t j = 0; j < jobs; ++j) {
      FleetOptions o;
      o.ranks = ranks;
      o.seed = j + 1;
      o.report_collective = true;
      if (parallel) {
        o.parallel = parallel;
        o.faults.push_back(*ParseFaultSpec("slow-worker:dp=0,pp=1,factor=1.3"));
      }
      models.push_back(std::make_unique<FleetModel>(o));
      Feed(router, *models.back(), "job-" + std::to_string(j), ranks, 0, 100,
           static_cast<int32_t>(j % partitions), &offsets[j % partitions]);
    }
    bool failed = false;
    StateHealth health(&metrics, [&](const absl::Status&) { failed = true; });
    CheckpointWriter writer(
        store->get(), {},
        [&](const CheckpointCommitStats& stats) {
          metrics.checkpoints->Add(1);
          metrics.checkpoint_bytes->Set(static_cast<double>(stats.bytes));
        },
        [&](const absl::Status& s) { health.Fail(s); });
    TaskManagerOptions sync_options;
    sync_options.checkpoint_max_bytes = budget_mib << 20;
    TaskManager sync("rankwatch.telemetry", store->get(), &writer, nullptr, &router, &metrics,
                     &health, sync_options);
    // The first full checkpoint, as the daemon's loop writes it: one budgeted round, then a
    // catch-up round whenever the writer is idle. The pause is each call's time on this thread.
    double full_pause_s = 0;
    const auto timed = [&](const auto& call) {
      const auto t = Clock::now();
      call();
      full_pause_s = std::max(full_pause_s, Seconds(Clock::now() - t).count());
    };
    auto t0 = Clock::now();
    timed([&] { sync.Checkpoint(now, wall); });
    while (sync.backlog()) {
      timed([&] { sync.CatchUp(now, wall); });  // a no-op while the writer is busy
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    (void)writer.Drain();  // until all of it is durable
    const double full_s = Seconds(Clock::now() - t0).count();
    const int full_rounds = static_cast<int>(metrics.checkpoints->Get());
    size_t full_bytes = 0, whatif_bytes = 0;
    if (!(*store)
             ->ForEach(StateFamily::kJobs, "",
                       [&](std::string_view k, std::string_view v) {
                         full_bytes += k.size() + v.size();
                         if (k[0] == 'w') whatif_bytes += k.size() + v.size();
                         if (k[0] == 'm') {
                           state::v1::JobMeta meta;
                           if (meta.ParseFromArray(v.data(), static_cast<int>(v.size()))) {
                             whatif_bytes += meta.whatif().ByteSizeLong();
                           }
                         }
                       })
             .ok()) {
      return 1;
    }
    if (steady && !(*store)->Flush().ok()) return 1;

    for (uint32_t j = 0; j < jobs; ++j) {
      Feed(router, *models[j], "job-" + std::to_string(j), ranks, 100, 1,
           static_cast<int32_t>(j % partitions), &offsets[j % partitions]);
    }
    t0 = Clock::now();
    sync.Checkpoint(now, wall);
    const double steady_pause_s = Seconds(Clock::now() - t0).count();
    (void)writer.Drain();
    const double steady_s = Seconds(Clock::now() - t0).count();
    if (failed || sync.backlog()) {
      std::fprintf(stderr, "the steady checkpoint failed or did not fit one round\n");
      return 1;
    }
    std::printf(
        "{\"jobs\": %u, \"ranks\": %u, \"partitions\": %u, \"budget_mib\": %zu, "
        "\"full_checkpoint_rounds\": %d, \"full_checkpoint_max_pause_ms\": %.1f, "
        "\"full_checkpoint_durable_s\": %.3f, \"full_checkpoint_bytes\": %zu, "
        "\"whatif_bytes\": %zu, "
        "\"steady_checkpoint_pause_ms\": %.2f, \"steady_checkpoint_write_s\": %.4f, "
        "\"steady_checkpoint_bytes\": %.0f, ",
        jobs, ranks, partitions, budget_mib, full_rounds, full_pause_s * 1e3, full_s, full_bytes,
        whatif_bytes, steady_pause_s * 1e3, steady_s, metrics.checkpoint_bytes->Get());
  }
  // Recovery: open, restore every job, publish every snapshot.
  const auto t0 = Clock::now();
  auto store = StateStore::Open({dir});
  if (!store.ok()) return 1;
  PrometheusRegistry registry2;
  DaemonMetrics metrics2(&registry2, "bench");
  SnapshotStore snapshots2;
  JobRouter restored(options, {&metrics2, &snapshots2});
  if (auto s = restored.Restore(**store, now, wall); !s.ok()) {
    std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
    return 1;
  }
  restored.Tick(now, wall);
  const double recovery_s = Seconds(Clock::now() - t0).count();
  const auto published = snapshots2.Get()->size();
  std::printf("\"after\": \"%s\", \"recovery_s\": %.3f, \"jobs_serving\": %zu}\n",
              steady  ? "crash in steady state"
              : crash ? "crash after the first checkpoint"
                      : "clean shutdown",
              recovery_s, published);
  std::filesystem::remove_all(dir);
  return published == jobs ? 0 : 1;
}
