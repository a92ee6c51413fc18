// `rankwatch simulate`: a synthetic fleet that publishes one step record per rank per step,
// batched per rank, to Kafka (see collectors/simulator/fleet_model.h for the model; with
// --parallel, a 3D-parallel job whose records carry op records, pipeline_schedule.h).
#include <spdlog/spdlog.h>

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <thread>

#include "cli/commands.h"
#include "collectors/batch_publisher.h"
#include "collectors/simulator/fleet_model.h"
#include "common/stop_signal.h"
#include "common/wall_clock.h"
#include "ingest/batch_decoder.h"
#include "operators/time.h"
#include "wire/schema.h"

namespace rankwatch {
namespace {

struct SimulateFlags {
  std::string brokers;
  std::string topic = "rankwatch.telemetry";
  std::string job;
  uint32_t jobs = 1;  // > 1: JOB-000, JOB-001, ... of the same shape, one producer
  uint32_t ranks = 0;
  uint64_t steps = 0;
  uint32_t ranks_per_node = 8;
  double step_ms = 100;
  std::string speed = "realtime";
  std::string sync = "ddp";
  bool report_collective = false;
  double jitter = 0.05;
  uint64_t seed = 1;
  std::vector<std::string> faults;
  std::string parallel;  // dp=D,pp=P,tp=T[,mb=M]; empty: flat data parallelism
  double op_noise = 0.02;
  double clock_skew_us = 0;
  uint32_t batch_steps = 20;
  size_t max_message_bytes = kDefaultMaxMessageBytes;
  double rate = 0;  // records/s across the fleet with --speed max; 0 = unpaced
  std::string compression = "lz4";
};

// Each rank's batch of step records, sent when it has --batch-steps records or when the next
// record would take it over what a message of --max-message-bytes holds; a record too large
// alone (a huge pipeline step) goes without its ops, counted.
class FleetPublisher {
 public:
  FleetPublisher(const FleetModel& model, BatchPublisher* publisher)
      : publisher_(publisher), max_batch_bytes_(publisher->max_batch_bytes()) {
    const FleetOptions& o = model.options();
    batches_.resize(o.ranks);
    for (uint32_t r = 0; r < o.ranks; ++r) {
      v1::SourceIdentity* src = batches_[r].mutable_source();
      src->set_training_job(o.training_job);
      src->set_rank(r);
      src->set_world_size(o.ranks);
      src->set_node(model.NodeName(r));
      src->set_local_rank(r % o.ranks_per_node);
      src->set_pid(100000 + r);
      src->set_device("cuda:" + std::to_string(r % o.ranks_per_node));
      src->set_collector("rankwatch-simulate/" RANKWATCH_VERSION);
      if (o.parallel.has_value()) *src->mutable_layout() = model.LayoutOf(r);
      batches_[r].set_schema_version(kSchemaVersion);
    }
    sequence_.assign(o.ranks, 0);
    for (const v1::Batch& b : batches_) envelope_.push_back(Envelope(b));
    bytes_ = envelope_;
  }

  absl::Status Append(uint32_t rank, v1::StepRecord* record) {
    v1::Batch& b = batches_[rank];
    size_t need = EncodedFieldBytes(record->ByteSizeLong());
    if (envelope_[rank] + need > max_batch_bytes_ && record->ops_size() > 0) {
      if (steps_without_ops_++ == 0) {
        spdlog::warn(
            "simulate: a step of rank {} with {} ops is {} bytes, more than a message of "
            "--max-message-bytes holds: sent without its ops (further ones counted)",
            rank, record->ops_size(), need);
      }
      record->clear_ops();
      record->clear_ops_origin_unix_ns();
      need = EncodedFieldBytes(record->ByteSizeLong());
    }
    if (b.steps_size() > 0 && bytes_[rank] + need > max_batch_bytes_) {
      if (absl::Status s = Flush(rank); !s.ok()) return s;
    }
    b.add_steps()->Swap(record);
    bytes_[rank] += need;
    return absl::OkStatus();
  }
  size_t Pending(uint32_t rank) const { return batches_[rank].steps_size(); }

  absl::Status Flush(uint32_t rank) {
    v1::Batch& b = batches_[rank];
    if (b.steps_size() == 0) return absl::OkStatus();
    b.set_sequence(sequence_[rank]++);
    b.set_created_unix_ns(WallNowUnixNs());
    b.SerializeToString(&buffer_);
    const uint64_t records = b.steps_size();
    records_ += records;
    ++messages_;
    b.clear_steps();
    bytes_[rank] = envelope_[rank];
    return publisher_->Publish(b.source().training_job(), buffer_, records);
  }

  absl::Status FlushAll() {
    for (uint32_t r = 0; r < batches_.size(); ++r) {
      if (auto s = Flush(r); !s.ok()) return s;
    }
    return absl::OkStatus();
  }

  // Tells the daemon that `rank` ends cleanly: an empty batch marked final.
  absl::Status Finish(uint32_t rank) {
    v1::Batch& b = batches_[rank];
    b.clear_steps();
    b.set_final(true);
    b.set_sequence(sequence_[rank]++);
    b.set_created_unix_ns(WallNowUnixNs());
    b.SerializeToString(&buffer_);
    ++messages_;
    return publisher_->Publish(b.source().training_job(), buffer_);
  }

  uint64_t records() const { return records_; }
  uint64_t messages() const { return messages_; }
  uint64_t steps_without_ops() const { return steps_without_ops_; }

 private:
  // A batch's bytes without its steps, at most (sequence, creation time and `final` included).
  static size_t Envelope(const v1::Batch& b) {
    v1::Batch e;
    *e.mutable_source() = b.source();
    return e.ByteSizeLong() + 32;
  }

  BatchPublisher* publisher_;
  const size_t max_batch_bytes_;
  std::vector<v1::Batch> batches_;
  std::vector<uint64_t> sequence_;
  std::vector<size_t> envelope_;  // each rank's Envelope
  std::vector<size_t> bytes_;     // each rank's batch's bytes, at most
  uint64_t steps_without_ops_ = 0;
  std::string buffer_;
  uint64_t records_ = 0;
  uint64_t messages_ = 0;
};

// The training job id of job `i` of `jobs`: JOB itself for one job, else JOB-000, JOB-001, ...
std::string JobId(const std::string& job, uint32_t i, uint32_t jobs) {
  if (jobs == 1) return job;
  const int width = std::max<int>(3, std::to_string(jobs - 1).size());
  return fmt::format("{}-{:0{}}", job, i, width);
}

int RunSimulate(SimulateFlags f) {
  FleetOptions o;
  if (!f.parallel.empty()) {
    auto spec = ParsePipelineSpec(f.parallel);
    if (!spec.ok()) {
      std::fprintf(stderr, "rankwatch simulate: %s\n",
                   std::string(spec.status().message()).c_str());
      return 2;
    }
    o.parallel = *spec;
    if (f.ranks == 0) f.ranks = spec->world_size();
  } else if (f.ranks == 0) {
    std::fprintf(stderr, "rankwatch simulate: --ranks or --parallel is required\n");
    return 2;
  }
  o.op_noise = f.op_noise;
  o.clock_skew_us = f.clock_skew_us;
  o.ranks = f.ranks;
  o.ranks_per_node = f.ranks_per_node;
  o.step_ms = f.step_ms;
  o.sync = f.sync == "ddp" ? FleetOptions::Sync::kDdp : FleetOptions::Sync::kNone;
  o.report_collective = f.report_collective;
  o.jitter = f.jitter;
  o.seed = f.seed;
  for (const std::string& text : f.faults) {
    auto fault = ParseFaultSpec(text);
    if (!fault.ok()) {
      std::fprintf(stderr, "rankwatch simulate: %s\n",
                   std::string(fault.status().message()).c_str());
      return 2;
    }
    o.faults.push_back(*fault);
  }
  if (absl::Status s = CheckFleetOptions(o); !s.ok()) {
    std::fprintf(stderr, "rankwatch simulate: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  const bool realtime = f.speed == "realtime";

  PublisherOptions po;
  po.brokers = f.brokers;
  po.topic = f.topic;
  po.compression = f.compression;
  po.client_id = "rankwatch-simulate";
  po.warn_as = "rankwatch simulate";
  po.max_message_bytes = static_cast<int>(f.max_message_bytes);
  auto publisher = BatchPublisher::Connect(po, std::chrono::seconds(10));
  if (!publisher.ok()) {
    std::fprintf(stderr, "rankwatch simulate: %s\n",
                 std::string(publisher.status().message()).c_str());
    return publisher.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }

  // One model and one set of batches per job; the jobs step in lock step through one producer.
  struct Job {
    std::unique_ptr<FleetModel> model;
    std::unique_ptr<FleetPublisher> fleet;
    std::vector<v1::StepRecord> records;
    std::vector<bool> reported;
  };
  std::vector<Job> jobs(f.jobs);
  // A job played at --speed max ran in the past: its clock starts twice its nominal length ago,
  // so that its steps' timestamps stay behind the present (a daemon rejects records more than an
  // hour ahead of its clock) even when faults make it slower than nominal.
  const int64_t start_wall = std::max<int64_t>(
      0, WallNowUnixNs() - (realtime ? 0
                                     : static_cast<int64_t>(2.0 * static_cast<double>(f.steps) *
                                                            f.step_ms * 1e6)));
  for (uint32_t i = 0; i < f.jobs; ++i) {
    FleetOptions jo = o;
    jo.training_job = JobId(f.job, i, f.jobs);
    jo.seed = f.seed + i;
    jobs[i].model = std::make_unique<FleetModel>(jo);
    jobs[i].model->set_job_start_unix_ns(start_wall);
    jobs[i].fleet = std::make_unique<FleetPublisher>(*jobs[i].model, publisher->get());
  }
  auto records_sent = [&jobs] {
    uint64_t n = 0;
    for (const Job& j : jobs) n += j.fleet->records();
    return n;
  };
  auto job_elapsed_ns = [&jobs] {
    int64_t ns = 0;
    for (const Job& j : jobs) ns = std::max<int64_t>(ns, j.model->elapsed_ns());
    return ns;
  };
  const auto start = Clock::now();
  auto last_flush = start;
  auto last_progress = start;
  spdlog::info(
      "simulate: {} '{}', {} ranks{} x {} steps, {} ms steps, sync {}, speed {}, {} faults",
      f.jobs == 1 ? "job" : fmt::format("{} jobs", f.jobs),
      f.jobs == 1 ? f.job : JobId(f.job, 0, f.jobs) + "..." + JobId(f.job, f.jobs - 1, f.jobs),
      f.ranks,
      o.parallel ? fmt::format(" (dp {} x pp {} x tp {}, {} microbatches, 1F1B)", o.parallel->dp,
                               o.parallel->pp, o.parallel->tp, o.parallel->microbatches)
                 : "",
      f.steps, f.step_ms, f.sync, f.speed, o.faults.size());
  absl::Status status;
  for (uint64_t step = 0; step < f.steps && status.ok() && !StopRequested(); ++step) {
    for (Job& j : jobs) j.model->Step(step, &j.records, &j.reported);
    if (realtime) {
      std::this_thread::sleep_until(start + std::chrono::nanoseconds(job_elapsed_ns()));
    } else if (f.rate > 0) {
      const double due_s = static_cast<double>(records_sent()) / f.rate;
      std::this_thread::sleep_until(start + std::chrono::duration_cast<std::chrono::nanoseconds>(
                                                std::chrono::duration<double>(due_s)));
    }
    const auto now = Clock::now();
    const bool interval_due = realtime && now - last_flush >= std::chrono::seconds(1);
    for (Job& j : jobs) {
      for (uint32_t r = 0; r < f.ranks && status.ok(); ++r) {
        if (j.reported[r]) status = j.fleet->Append(r, &j.records[r]);
        if (!status.ok()) break;
        if (j.fleet->Pending(r) >= f.batch_steps || interval_due) status = j.fleet->Flush(r);
      }
    }
    if (interval_due) last_flush = now;
    if (now - last_progress >= std::chrono::seconds(2)) {
      last_progress = now;
      const double secs = std::chrono::duration<double>(now - start).count();
      spdlog::info("simulate: step {}/{}, {} records sent ({:.0f}/s)", step + 1, f.steps,
                   records_sent(), records_sent() / secs);
    }
  }
  for (Job& j : jobs) {
    if (status.ok()) status = j.fleet->FlushAll();
  }
  // Ranks that ran to the end say so; hung ranks (and an interrupted run) stay silent.
  const bool completed = !StopRequested();
  for (Job& j : jobs) {
    for (uint32_t r = 0; r < f.ranks && status.ok() && completed; ++r) {
      if (j.reported.empty() || j.reported[r]) status = j.fleet->Finish(r);
    }
  }
  if (status.ok()) status = (*publisher)->Flush(std::chrono::seconds(60));
  const double secs = std::chrono::duration<double>(Clock::now() - start).count();
  uint64_t messages = 0, steps_without_ops = 0;
  for (const Job& j : jobs) {
    messages += j.fleet->messages();
    steps_without_ops += j.fleet->steps_without_ops();
  }
  if (steps_without_ops > 0) {
    spdlog::warn("simulate: {} step records went without their ops (--max-message-bytes)",
                 steps_without_ops);
  }
  std::printf(
      "{\"jobs\": %u, \"records\": %llu, \"messages\": %llu, \"seconds\": %.3f, "
      "\"records_per_second\": %.0f, \"delivered\": %llu, \"failed\": %llu, "
      "\"job_seconds\": %.9f}\n",
      f.jobs, static_cast<unsigned long long>(records_sent()),
      static_cast<unsigned long long>(messages), secs, records_sent() / secs,
      static_cast<unsigned long long>((*publisher)->delivered()),
      static_cast<unsigned long long>((*publisher)->failed()),
      static_cast<double>(job_elapsed_ns()) * 1e-9);
  std::fflush(stdout);
  if (!status.ok()) {
    spdlog::error("simulate: {}", std::string(status.message()));
    return 1;
  }
  return (*publisher)->failed() == 0 ? 0 : 1;
}

}  // namespace

CommandRunner AddSimulateCommand(CLI::App& app) {
  auto f = std::make_shared<SimulateFlags>();
  CLI::App* cmd =
      app.add_subcommand("simulate", "publish a synthetic training job's step records to Kafka");
  cmd->add_option("--brokers", f->brokers, "Kafka bootstrap servers")->required();
  cmd->add_option("--topic", f->topic, "telemetry topic")->capture_default_str();
  cmd->add_option("--job", f->job, "training job id")->required();
  cmd->add_option("--jobs", f->jobs,
                  "simulate this many jobs of the same shape through one producer, as "
                  "JOB-000, JOB-001, ... (seeds SEED, SEED+1, ...); --rate is their total")
      ->capture_default_str()
      ->check(CLI::Range(1u, 100000u));
  cmd->add_option("--ranks", f->ranks,
                  "ranks (world size); required without --parallel, with it dp x pp x tp")
      ->check(CLI::Range(1u, 1u << 20));
  cmd->add_option(
      "--parallel", f->parallel,
      "dp=D,pp=P,tp=T[,mb=M][,schedule=S][,vpp=V]: a data x pipeline x tensor parallel job "
      "(world D*P*T, Megatron's rank order, tensor rank fastest), each step a simulated "
      "pipeline schedule of M microbatches (default 8) whose op records every rank publishes; "
      "S: 1f1b (default), interleaved, zb, zbv, dualpipev; V: model chunks per stage");
  cmd->add_option("--op-noise", f->op_noise,
                  "with --parallel: each op's duration x lognormal(0, sigma), seeded")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--clock-skew-us", f->clock_skew_us,
                  "with --parallel: each node's clock off by N(0, this) microseconds")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1e7));
  cmd->add_option("--steps", f->steps, "steps to simulate")->required();
  cmd->add_option("--ranks-per-node", f->ranks_per_node, "ranks per node")
      ->capture_default_str()
      ->check(CLI::Range(1u, 1024u));
  cmd->add_option("--step-ms", f->step_ms,
                  "nominal step time, ms (with --parallel: 80% 1F1B compute, docs/cli.md)")
      ->capture_default_str()
      ->check(CLI::Range(0.001, 3.6e6));
  cmd->add_option("--speed", f->speed, "realtime: paced like a real job; max: as fast as possible")
      ->capture_default_str()
      ->check(CLI::IsMember({"realtime", "max"}));
  cmd->add_option("--sync", f->sync,
                  "ddp: ranks finish each step together (data parallel); none: independent")
      ->capture_default_str()
      ->check(CLI::IsMember({"ddp", "none"}));
  cmd->add_flag("--report-collective", f->report_collective,
                "report time in collectives (allreduce + waiting for slower ranks)");
  cmd->add_option("--jitter", f->jitter,
                  "uniform per-phase, per-step jitter (0.05 = +-5%); flat jobs (--op-noise with "
                  "--parallel)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 0.9));
  cmd->add_option("--seed", f->seed, "random seed")->capture_default_str();
  cmd->add_option(
      "--fault", f->faults,
      "KIND:TARGET[:MAGNITUDE[:FROM_STEP[-UNTIL_STEP]]]; KIND slow-compute, slow-input, "
      "slow-host (host code outside every phase, MAGNITUDE x step), input-bound, wait, "
      "memory-leak, memory-imbalance, memory-pressure, hang; TARGET a rank, node<N> or all. "
      "Or KIND:KEY=VALUE,...[:FROM_STEP[-UNTIL_STEP]]: gc:rank=R[,every=N][,ms=X] (a GC pause of "
      "X ms on rank R every N-th step, defaults 10, 100); with --parallel "
      "slow-worker:dp=D,pp=S[,factor=F] (that worker's compute x F, 1.3), "
      "stage-imbalance:stage=S[,factor=F] (the stage's compute on every replica x F, 1.25), "
      "sequence-imbalance[:spread=X] (each step each replica's compute x (1 + X v), v uniform in "
      "[-1,1), X < 1, 0.3); slow-input, input-bound, wait, slow-host are flat only");
  cmd->add_option("--rate", f->rate,
                  "with --speed max: offer at most this many records/s (0 = as fast as possible)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1e9));
  cmd->add_option("--batch-steps", f->batch_steps, "step records per Kafka message")
      ->capture_default_str()
      ->check(CLI::Range(1u, 10000u));
  cmd->add_option("--max-message-bytes", f->max_message_bytes,
                  "the largest Kafka message sent (librdkafka's message.max.bytes; set it to the "
                  "brokers' and the topic's limit): a rank's batch is sent before a step record "
                  "would take it over, and a step too large alone goes without its ops")
      ->capture_default_str()
      ->check(CLI::Range(kMinMaxMessageBytes, size_t{1'000'000'000}));
  cmd->add_option("--compression", f->compression, "Kafka compression codec")
      ->capture_default_str()
      ->check(CLI::IsMember({"none", "gzip", "snappy", "lz4", "zstd"}));
  return [cmd, f]() -> int { return cmd->parsed() ? RunSimulate(*f) : -1; };
}

}  // namespace rankwatch
