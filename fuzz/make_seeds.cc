// Writes the seeds of the targets whose inputs are binary (fuzz/seeds/{batch,job_state,
// changelog}): telemetry batches of a simulated 4-rank job (with a slow rank and a memory
// leak) and of one rank of a pipeline-parallel job (its layout, ops and GC pauses), and the
// durable state the 4-rank job's pipeline checkpoints, as store records and as changelog
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

// Two steps of rank 5 of a 16-rank DP 2 x PP 4 x TP 2 job, interleaved (2 model chunks): per
// step 4 microbatches, each a forward and a backward with their sends and receives, a GC
// pause, the data-parallel collectives and the optimizer.
v1::Batch PipelineBatch() {
  v1::Batch b;
  b.set_schema_version(1);
  b.set_created_unix_ns(1'700'000'001'000'000'000);
  v1::SourceIdentity* src = b.mutable_source();
  src->set_training_job("seed-pipeline-job");
  src->set_rank(5);
  src->set_world_size(16);
  src->set_node("node-0");
  v1::ParallelLayout* l = src->mutable_layout();
  l->set_data_rank(0);
  l->set_data_size(2);
  l->set_pipeline_rank(2);
  l->set_pipeline_size(4);
  l->set_tensor_rank(1);
  l->set_tensor_size(2);
  l->set_virtual_stages(2);
  for (uint64_t step = 0; step < 2; ++step) {
    v1::StepRecord* s = b.add_steps();
    s->set_step(100 + step);
    uint64_t t = 0;
    auto op = [&](v1::OpType type, uint32_t mb, uint32_t chunk, uint64_t us) {
      v1::OpRecord* r = s->add_ops();
      r->set_type(type);
      r->set_microbatch(mb);
      r->set_model_chunk(chunk);
      r->set_start_offset_us(t);
      r->set_duration_us(us);
      t += us + 20;
    };
    op(v1::OP_DATA_LOADING, 0, 0, 3000);
    for (uint32_t mb = 0; mb < 4; ++mb) {
      op(v1::OP_FORWARD_RECV, mb, mb % 2, 900);
      op(v1::OP_FORWARD_COMPUTE, mb, mb % 2, 21000);
      op(v1::OP_FORWARD_SEND, mb, mb % 2, 300);
    }
    op(v1::OP_GC, 0, 0, 4000);
    for (uint32_t mb = 0; mb < 4; ++mb) {
      op(v1::OP_BACKWARD_RECV, mb, mb % 2, 1200);
      op(v1::OP_BACKWARD_COMPUTE, mb, mb % 2, 43000);
      op(v1::OP_BACKWARD_SEND, mb, mb % 2, 300);
    }
    op(v1::OP_GRADS_REDUCE_SCATTER, 0, 0, 12000);
    op(v1::OP_OPTIMIZER_CLIP_MAIN_GRAD, 0, 0, 800);
    op(v1::OP_OPTIMIZER, 0, 0, 6000);
    op(v1::OP_PARAMS_ALL_GATHER, 0, 0, 9000);
    s->set_step_time_ns(t * 1000);
    s->set_ops_origin_unix_ns(1'700'000'000'000'000'000 + static_cast<int64_t>(step * t * 1000));
    s->set_end_unix_ns(s->ops_origin_unix_ns() + static_cast<int64_t>(t * 1000));
    s->set_gc_ns(4'000'000);
    s->set_gc_count(1);
  }
  return b;
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
  Write(seeds / "batch" / "pipeline-rank.pb", PipelineBatch().SerializeAsString());

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
