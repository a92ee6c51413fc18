// Writes the seeds of the targets whose inputs are binary (fuzz/seeds/{batch,job_state,
// changelog}): telemetry batches of a simulated 4-rank job (with a slow rank and a memory
// leak), and the durable state its pipeline checkpoints, as store records and as changelog
// records. Run once by hand (docs/fuzzing.md): fuzz_make_seeds <fuzz/seeds directory>.
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "collectors/simulator/fleet_model.h"
#include "fuzz/fuzz_support.h"
#include "operators/alert_tracker.h"
#include "operators/job_pipeline.h"
#include "state/job_state_store.h"
#include "state/state_changelog.h"

namespace rankwatch {
namespace {

std::vector<v1::Batch> Batches(uint32_t ranks, uint64_t steps, uint32_t per_batch) {
  FleetOptions o;
  o.training_job = "seed-job";
  o.ranks = ranks;
  o.report_collective = true;
  o.faults.push_back(*ParseFaultSpec("slow-compute:3:0.3:10"));
  o.faults.push_back(*ParseFaultSpec("memory-leak:all:64:5"));
  FleetModel model(o);
  std::vector<v1::Batch> pending(ranks), out;
  for (uint32_t r = 0; r < ranks; ++r) {
    pending[r].set_schema_version(1);
    pending[r].mutable_source()->set_training_job(o.training_job);
    pending[r].mutable_source()->set_rank(r);
    pending[r].mutable_source()->set_world_size(ranks);
    pending[r].mutable_source()->set_node(model.NodeName(r));
  }
  std::vector<v1::StepRecord> rec;
  std::vector<bool> rep;
  for (uint64_t s = 0; s < steps; ++s) {
    model.Step(s, &rec, &rep);
    for (uint32_t r = 0; r < ranks; ++r) {
      *pending[r].add_steps() = rec[r];
      if (pending[r].steps_size() == static_cast<int>(per_batch)) {
        out.push_back(pending[r]);
        pending[r].clear_steps();
      }
    }
  }
  return out;
}

void Write(const std::filesystem::path& path, const std::string& bytes) {
  fuzz::WriteFile(path, bytes);
  std::printf("%s: %zu bytes\n", path.c_str(), bytes.size());
}

// The store records of one checkpoint (fuzz_job_state framing).
std::string StoreRecords(Checkpoint c) {
  c.Materialize();
  std::string out;
  for (const Checkpoint::Op& op : c.ops()) {
    if (!op.value) continue;
    fuzz::AppendRecord(&out, op.family == StateFamily::kAlerts ? 1 : 0, op.key, *op.value);
  }
  return out;
}

std::string ChangelogInput(const std::vector<std::vector<ChangelogRecord>>& checkpoints) {
  std::string out;
  for (const auto& records : checkpoints) {
    for (const ChangelogRecord& r : records) {
      fuzz::AppendRecord(&out, r.value ? 0 : 1, r.key, r.value.value_or(""));
    }
  }
  return out;
}

int Main(const std::filesystem::path& seeds) {
  const std::vector<v1::Batch> batches = Batches(4, 24, 8);
  for (size_t i = 0; i < 3; ++i) {
    Write(seeds / "batch" / ("sim-" + std::to_string(i) + ".pb"), batches[i].SerializeAsString());
  }

  JobPipelineOptions options;
  options.record_changes = true;
  options.window.steps = 16;
  JobPipeline pipeline("seed-job", 4, options);
  const TimePoint t0{std::chrono::seconds(1000)};
  const int64_t wall = 1'700'000'000'000'000'000;
  std::vector<Checkpoint> checkpoints;
  for (size_t i = 0; i < batches.size(); ++i) {
    pipeline.AddBatch(batches[i], t0);
    if (i % 4 == 3) {
      JobCheckpoint jc = pipeline.TakeCheckpoint(t0, wall);
      jc.meta.set_kafka_partition(0);
      Checkpoint c;
      job_state::PutJob("seed-job", jc.meta, jc.new_steps, jc.keep_from_step, &c);
      checkpoints.push_back(std::move(c));
    }
  }
  AlertTracker tracker;
  Checkpoint alerts;
  job_state::PutJobAlerts("seed-job", tracker.ExportJob("seed-job"), &alerts);
  v1::Alert alert;
  alert.set_sequence(7);
  alert.set_training_job("seed-job");
  job_state::PutAlert(alert, &alerts);

  Checkpoint whole;
  for (const Checkpoint& c : checkpoints) whole.Append(c);
  whole.Append(alerts);
  Write(seeds / "job_state" / "whole-job.bin", StoreRecords(whole));
  Write(seeds / "job_state" / "first-checkpoint.bin", StoreRecords(checkpoints.front()));

  std::vector<std::vector<ChangelogRecord>> log;
  uint64_t sequence = 0;
  int64_t offset = 0;
  for (size_t i = 0; i < checkpoints.size() && i < 3; ++i) {
    Checkpoint c = checkpoints[i];
    c.Materialize();
    c.SetOffset("telemetry", 0, offset += 8);
    log.push_back(ChangelogRecords(c, offset, ++sequence, /*full=*/i == 0));
  }
  Write(seeds / "changelog" / "snapshot-and-deltas.bin", ChangelogInput(log));
  log.erase(log.begin() + 1, log.end());
  Write(seeds / "changelog" / "snapshot.bin", ChangelogInput(log));
  return 0;
}

}  // namespace
}  // namespace rankwatch

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: fuzz_make_seeds <fuzz/seeds directory>\n");
    return 2;
  }
  return rankwatch::Main(argv[1]);
}
