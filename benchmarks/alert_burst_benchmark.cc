// The ingest thread's pauses when many alerts change at once, with the alert log on disk.
//
// --jobs jobs (default 1,000) of --ranks ranks (default 8), each with a rank 50% slower in
// compute from step 0, are fed step by step into one JobRouter (the daemon's ingest stage)
// with an AlertHub writing to a RocksDB StateStore in --dir (fsync on every write, as the
// daemon runs it). Each round feeds one step of every job and ticks once, as the daemon's
// loop does every 20 ms; every job's straggler alert goes pending, then fires, in the same
// tick for all of them — a burst of --jobs alerts. Prints, as JSON, the longest and median
// time the ingest thread spent in a tick (which stores and publishes the alerts), the round
// the last job's alert fired in, and how many were stored. A job is re-evaluated at most every
// ten times what evaluating every job costs (PartitionTask::Evaluate): with 1,000 jobs the
// alerts go pending and fire over some 30 rounds, hence the default of 200.
//
//   build/benchmarks/alert_burst_benchmark [--jobs 1000] [--ranks 8] [--rounds 200] [--dir D]
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "collectors/simulator/fault_spec.h"
#include "collectors/simulator/fleet_model.h"
#include "ingest/batch_decoder.h"
#include "runtime/job_router.h"
#include "state/checkpoint_writer.h"
#include "state/job_state_store.h"

namespace rankwatch {
namespace {

using Millis = std::chrono::duration<double, std::milli>;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace
}  // namespace rankwatch

int main(int argc, char** argv) {
  using namespace rankwatch;
  uint32_t jobs = 1000, ranks = 8, rounds = 200;
  std::filesystem::path dir = std::filesystem::temp_directory_path() / "rankwatch-alert-burst";
  for (int i = 1; i + 1 < argc; ++i) {
    if (!std::strcmp(argv[i], "--jobs")) jobs = static_cast<uint32_t>(std::atoi(argv[i + 1]));
    if (!std::strcmp(argv[i], "--ranks")) ranks = static_cast<uint32_t>(std::atoi(argv[i + 1]));
    if (!std::strcmp(argv[i], "--rounds")) rounds = static_cast<uint32_t>(std::atoi(argv[i + 1]));
    if (!std::strcmp(argv[i], "--dir")) dir = argv[i + 1];
  }
  spdlog::set_level(spdlog::level::err);
  std::filesystem::remove_all(dir);
  auto store = StateStore::Open({dir});
  if (!store.ok()) {
    std::fprintf(stderr, "%s\n", std::string(store.status().message()).c_str());
    return 1;
  }
  PrometheusRegistry registry;
  DaemonMetrics metrics(&registry, "bench");
  SnapshotStore snapshots;
  CheckpointWriter writer(store->get(), {}, nullptr, nullptr);
  AlertHub hub(store->get(), &writer, {}, {});
  JobRouterOptions options;
  options.topic = "rankwatch.telemetry";
  JobRouter router(options, {&metrics, &snapshots, &hub});

  auto fault = ParseFaultSpec("slow-compute:3:0.5");
  if (!fault.ok()) return 1;
  std::vector<FleetModel> models;
  models.reserve(jobs);
  for (uint32_t j = 0; j < jobs; ++j) {
    FleetOptions o;
    o.training_job = "job-" + std::to_string(j);
    o.ranks = ranks;
    o.seed = j + 1;
    o.report_collective = true;
    o.faults = {*fault};
    models.emplace_back(o);
  }
  std::vector<v1::StepRecord> records;
  std::vector<bool> reported;
  v1::Batch batch;
  std::string bytes;
  std::vector<double> tick_ms;
  double longest_ms = 0;
  uint32_t fired_round = 0;
  TimePoint now{};
  int64_t wall = 1'795'000'000'000'000'000;
  for (uint32_t round = 0; round < rounds; ++round) {
    for (uint32_t j = 0; j < jobs; ++j) {
      models[j].Step(round, &records, &reported);
      for (uint32_t r = 0; r < ranks; ++r) {
        batch.Clear();
        batch.set_schema_version(kSchemaVersion);
        batch.mutable_source()->set_training_job(models[j].options().training_job);
        batch.mutable_source()->set_rank(r);
        batch.mutable_source()->set_world_size(ranks);
        batch.mutable_source()->set_node(models[j].NodeName(r));
        *batch.add_steps() = records[r];
        batch.SerializeToString(&bytes);
        router.HandleMessage(bytes, now, wall);
      }
    }
    const auto t = std::chrono::steady_clock::now();
    router.Tick(now, wall);
    const double ms = Millis(std::chrono::steady_clock::now() - t).count();
    tick_ms.push_back(ms);
    longest_ms = std::max(longest_ms, ms);
    (void)hub.Flush();  // outside the timed part: the next tick starts with an idle writer
    const std::string last_job = "job-" + std::to_string(jobs - 1);
    if (fired_round == 0 && !hub.Firing(last_job).empty()) fired_round = round;
    now += std::chrono::milliseconds(20);
    wall += 20'000'000;
  }
  (void)hub.Flush();
  auto stored = job_state::LastAlertSequence(**store);
  std::printf(
      "{\"jobs\": %u, \"ranks\": %u, \"rounds\": %u, \"fired_in_round\": %u, "
      "\"alerts_stored\": %llu, \"longest_tick_ms\": %.1f, \"median_tick_ms\": %.1f}\n",
      jobs, ranks, rounds, fired_round, static_cast<unsigned long long>(stored.ok() ? *stored : 0),
      longest_ms, Median(tick_ms));
  std::filesystem::remove_all(dir);
  return stored.ok() && *stored >= jobs ? 0 : 1;
}
