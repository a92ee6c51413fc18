// `rankwatch replay --brokers B --job J PATH...`: publishes vendor iteration traces (msprof,
// MindSpore, torch_npu), or step records recorded as JSON Lines (`*.steps.jsonl`), as the step
// records of one training job, or Kineto (PyTorch profiler) traces as its kernel events
// (collectors/kineto_replay.h), so the daemon diagnoses them like any live job.
#include <spdlog/spdlog.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>

#include "cli/commands.h"
#include "collectors/batch_publisher.h"
#include "collectors/kineto_replay.h"
#include "common/wall_clock.h"
#include "ingest/batch_decoder.h"
#include "traces/iteration_trace.h"
#include "traces/kineto_trace_reader.h"
#include "traces/step_records_jsonl.h"
#include "traces/whatif_chrome_trace.h"
#include "wire/schema.h"

namespace rankwatch {
namespace {

struct ReplayFlags {
  std::string brokers;
  std::string topic = "rankwatch.telemetry";
  std::string job;
  uint32_t world_size = 0;
  uint32_t chunk_steps = 100;
  uint32_t chunk_events = 20'000;
  size_t max_message_bytes = kDefaultMaxMessageBytes;
  std::string format = "auto";  // auto, steps, records, kineto, whatif
  std::vector<std::string> paths;
};

struct RankTrace {
  std::string node, device;
  std::map<uint64_t, v1::StepRecord> steps;  // deduplicated by step number
  std::optional<v1::ParallelLayout> layout;
};

// A producer that blocks when its queue is full (a replay must not lose data), connected
// within 10 s: InvalidArgument for a bad configuration, Unavailable when no broker answers.
absl::StatusOr<std::unique_ptr<BatchPublisher>> ConnectPublisher(const ReplayFlags& f) {
  PublisherOptions po;
  po.brokers = f.brokers;
  po.topic = f.topic;
  po.client_id = "rankwatch-replay";
  po.warn_as = "rankwatch replay";
  po.max_message_bytes = static_cast<int>(f.max_message_bytes);
  return BatchPublisher::Connect(po, std::chrono::seconds(10));
}

int RunKinetoReplay(const ReplayFlags& f, const std::vector<std::filesystem::path>& files) {
  auto publisher = ConnectPublisher(f);
  if (!publisher.ok()) {
    std::fprintf(stderr, "rankwatch replay: %s\n",
                 std::string(publisher.status().message()).c_str());
    return publisher.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  KinetoReplayOptions o;
  o.collector = "rankwatch-replay/" RANKWATCH_VERSION;
  o.training_job = f.job;
  o.world_size = f.world_size;
  o.max_events = f.chunk_events;
  o.max_bytes = (*publisher)->max_batch_bytes();
  o.created_unix_ns = WallNowUnixNs();
  KinetoReplayStats stats;
  std::string buffer;
  absl::Status s = ReplayKinetoTraces(
      files, o,
      [&](const v1::Batch& b) {
        b.SerializeToString(&buffer);
        return (*publisher)->Publish(f.job, buffer, b.kernels_size());
      },
      &stats);
  if (s.ok()) s = (*publisher)->Flush(std::chrono::seconds(60));
  if (!s.ok()) {
    std::fprintf(stderr, "rankwatch replay: %s\n", std::string(s.message()).c_str());
    return s.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  if (stats.truncated_names > 0) {
    spdlog::warn("replay: {} names longer than 4096 bytes were cut", stats.truncated_names);
  }
  std::printf(
      "{\"files\": %zu, \"ranks\": %zu, \"world_size\": %u, \"kernel_events\": %llu, "
      "\"steps\": %llu, \"unstepped_events\": %llu, \"messages\": %llu, \"failed\": %llu}\n",
      stats.files, stats.ranks, stats.world_size, static_cast<unsigned long long>(stats.events),
      static_cast<unsigned long long>(stats.steps),
      static_cast<unsigned long long>(stats.unstepped),
      static_cast<unsigned long long>(stats.batches),
      static_cast<unsigned long long>((*publisher)->failed()));
  return (*publisher)->failed() == 0 ? 0 : 1;
}

// Publishes the ranks' step records in chunks of steps across all ranks, so that alignment never
// holds the whole trace; the last batch of each rank is final. A chunk is at most --chunk-steps
// steps and what a message of --max-message-bytes holds; a step record too large alone (ops of
// a huge pipeline step) goes without its ops, counted. Prints the summary line.
int PublishSteps(const ReplayFlags& f, std::map<uint32_t, RankTrace>& ranks, uint32_t world,
                 size_t files) {
  auto publisher = ConnectPublisher(f);
  if (!publisher.ok()) {
    std::fprintf(stderr, "rankwatch replay: %s\n",
                 std::string(publisher.status().message()).c_str());
    return publisher.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  const size_t max_batch_bytes = (*publisher)->max_batch_bytes();
  // Publish in chunks of steps across all ranks, so alignment never holds the whole trace.
  std::map<uint32_t, std::map<uint64_t, v1::StepRecord>::iterator> cursor;
  for (auto& [rank, r] : ranks) cursor[rank] = r.steps.begin();
  uint64_t records = 0, messages = 0, sequence = 0, steps_without_ops = 0, ops_dropped = 0;
  const int64_t now = WallNowUnixNs();
  bool more = true;
  std::string buffer;
  while (more) {
    more = false;
    for (auto& [rank, r] : ranks) {
      v1::Batch b;
      b.set_schema_version(kSchemaVersion);
      b.set_sequence(sequence++);
      b.set_created_unix_ns(now);
      v1::SourceIdentity* src = b.mutable_source();
      src->set_training_job(f.job);
      src->set_rank(rank);
      src->set_world_size(world);
      src->set_node(r.node);
      src->set_device(r.device);
      src->set_collector("rankwatch-replay/" RANKWATCH_VERSION);
      if (r.layout) *src->mutable_layout() = *r.layout;
      auto& it = cursor[rank];
      if (it == r.steps.end()) continue;
      // The envelope as it will be, `final` set.
      const size_t envelope = b.ByteSizeLong() + 2;
      size_t bytes = envelope;
      for (uint32_t n = 0; n < f.chunk_steps && it != r.steps.end(); ++n, ++it) {
        v1::StepRecord& step = it->second;
        size_t need = EncodedFieldBytes(step.ByteSizeLong());
        if (envelope + need > max_batch_bytes && step.ops_size() > 0) {
          // Alone it would not fit a message: it goes without its ops.
          if (steps_without_ops++ == 0) {
            spdlog::warn(
                "replay: step {} of rank {} with {} ops is {} bytes, more than a message of "
                "--max-message-bytes {} holds: sent without its ops (further ones counted)",
                step.step(), rank, step.ops_size(), need, f.max_message_bytes);
          }
          ops_dropped += step.ops_size();
          step.clear_ops();
          step.clear_ops_origin_unix_ns();
          need = EncodedFieldBytes(step.ByteSizeLong());
        }
        if (b.steps_size() > 0 && bytes + need > max_batch_bytes) break;
        *b.add_steps() = step;
        bytes += need;
      }
      // A trace is a finished run: its last batch says so, so its silence is not a hang.
      if (it != r.steps.end()) {
        more = true;
      } else {
        b.set_final(true);
      }
      records += b.steps_size();
      ++messages;
      b.SerializeToString(&buffer);
      if (auto s = (*publisher)->Publish(f.job, buffer, b.steps_size()); !s.ok()) {
        std::fprintf(stderr, "rankwatch replay: %s\n", std::string(s.message()).c_str());
        return 1;
      }
    }
  }
  if (auto s = (*publisher)->Flush(std::chrono::seconds(60)); !s.ok()) {
    std::fprintf(stderr, "rankwatch replay: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  std::printf(
      "{\"files\": %zu, \"ranks\": %zu, \"world_size\": %u, \"records\": %llu, "
      "\"messages\": %llu, \"failed\": %llu, \"steps_without_ops\": %llu, "
      "\"ops_dropped\": %llu}\n",
      files, ranks.size(), world, static_cast<unsigned long long>(records),
      static_cast<unsigned long long>(messages),
      static_cast<unsigned long long>((*publisher)->failed()),
      static_cast<unsigned long long>(steps_without_ops),
      static_cast<unsigned long long>(ops_dropped));
  return (*publisher)->failed() == 0 ? 0 : 1;
}

// Whether `paths` is one what-if study trace: a `timeline-*.json[.gz]` file or a directory
// holding one.
bool IsWhatifTrace(const std::vector<std::string>& paths) {
  if (paths.size() != 1) return false;
  auto is_timeline = [](const std::filesystem::path& p) {
    const std::string name = p.filename().string();
    return name.rfind("timeline-", 0) == 0 &&
           (name.ends_with(".json") || name.ends_with(".json.gz"));
  };
  const std::filesystem::path path(paths[0]);
  std::error_code ec;
  if (!std::filesystem::is_directory(path, ec)) return is_timeline(path);
  for (const auto& entry : std::filesystem::directory_iterator(path, ec)) {
    if (is_timeline(entry.path())) return true;
  }
  return false;
}

// The what-if study's per-op Chrome trace as a pipeline job: each worker (data rank, stage) is
// published as its tensor ranks (Megatron's order: rank = (stage * dp + data rank) * tp +
// tensor rank), each with its layout; tensor rank 0 carries the worker's ops (the trace holds
// only its lanes; its peers move in lockstep), the others their step records alone. Op times
// keep the trace's common clock: a step's ops count from its earliest op on any worker, put
// in the recent past.
int RunWhatifReplay(const ReplayFlags& f) {
  auto trace = ReadWhatifChromeTrace(f.paths[0]);
  if (!trace.ok()) {
    std::fprintf(stderr, "rankwatch replay: %s\n", std::string(trace.status().message()).c_str());
    return 2;
  }
  const whatif::Layout& l = trace->layout;
  const uint32_t world = l.dp * l.pp * l.tp;
  if (f.world_size != 0 && f.world_size != world) {
    std::fprintf(stderr,
                 "rankwatch replay: the trace's layout has %u ranks, --world-size says %u\n", world,
                 f.world_size);
    return 2;
  }
  double last_end_us = 0;
  for (const whatif::StepOps& step : trace->steps) {
    for (const auto& ops : step.workers) {
      for (const whatif::Op& op : ops)
        last_end_us = std::max(last_end_us, op.start_us + op.duration_us);
    }
  }
  // The trace's time 0, so that its last op ended a second ago.
  const int64_t base_ns = WallNowUnixNs() - static_cast<int64_t>(last_end_us * 1e3) - 1'000'000'000;
  std::map<uint32_t, RankTrace> ranks;
  for (uint32_t stage = 0; stage < l.pp; ++stage) {
    for (uint32_t dp = 0; dp < l.dp; ++dp) {
      for (uint32_t tp = 0; tp < l.tp; ++tp) {
        RankTrace& r = ranks[(stage * l.dp + dp) * l.tp + tp];
        r.node = "dp" + std::to_string(dp) + "-pp" + std::to_string(stage);
        v1::ParallelLayout& layout = r.layout.emplace();
        layout.set_data_rank(dp);
        layout.set_data_size(l.dp);
        layout.set_pipeline_rank(stage);
        layout.set_pipeline_size(l.pp);
        layout.set_tensor_rank(tp);
        layout.set_tensor_size(l.tp);
        layout.set_virtual_stages(l.vpp);
      }
    }
  }
  for (const whatif::StepOps& step : trace->steps) {
    double first_us = INFINITY, end_us = 0;
    for (const auto& ops : step.workers) {
      for (const whatif::Op& op : ops) {
        first_us = std::min(first_us, op.start_us);
        end_us = std::max(end_us, op.start_us + op.duration_us);
      }
    }
    if (!std::isfinite(first_us)) continue;
    for (uint32_t w = 0; w < step.workers.size(); ++w) {
      const uint32_t stage = w / l.dp, dp = w % l.dp;
      v1::StepRecord record;
      record.set_step(step.step);
      uint64_t forward = 0, backward = 0, optimizer = 0, collective = 0, gc = 0, gc_count = 0;
      v1::StepRecord with_ops = record;
      for (const whatif::Op& op : step.workers[w]) {
        const auto dur = static_cast<uint64_t>(std::llround(op.duration_us));
        switch (op.kind) {
          case whatif::OpKind::kForwardCompute: forward += dur; break;
          case whatif::OpKind::kBackwardCompute:
          case whatif::OpKind::kBackwardWeightCompute: backward += dur; break;
          case whatif::OpKind::kOptimizer: optimizer += dur; break;
          case whatif::OpKind::kGc:
            gc += dur;
            ++gc_count;
            break;
          default:
            if (whatif::IsCommunication(op.kind)) collective += dur;
        }
        v1::OpRecord* o = with_ops.add_ops();
        o->set_type(static_cast<v1::OpType>(op.kind));
        o->set_microbatch(op.microbatch);
        o->set_model_chunk(op.chunk);
        o->set_start_offset_us(static_cast<uint64_t>(std::llround(op.start_us - first_us)));
        o->set_duration_us(dur);
      }
      for (v1::StepRecord* r : {&record, &with_ops}) {
        r->set_forward_ns(forward * 1000);
        r->set_backward_ns(backward * 1000);
        r->set_optimizer_ns(optimizer * 1000);
        r->set_collective_ns(collective * 1000);
        r->set_gc_ns(gc * 1000);
        r->set_gc_count(static_cast<uint32_t>(gc_count));
        r->set_step_time_ns(static_cast<uint64_t>(std::llround((end_us - first_us) * 1e3)));
        r->set_end_unix_ns(base_ns + static_cast<int64_t>(end_us * 1e3));
      }
      with_ops.set_ops_origin_unix_ns(base_ns + static_cast<int64_t>(std::llround(first_us * 1e3)));
      for (uint32_t tp = 0; tp < l.tp; ++tp) {
        ranks[(stage * l.dp + dp) * l.tp + tp].steps.emplace(step.step,
                                                             tp == 0 ? with_ops : record);
      }
    }
  }
  spdlog::info("replay: {}: DP {} x PP {} x TP {}, {} steps, {} ops (tensor rank 0's lanes)",
               trace->file.string(), l.dp, l.pp, l.tp, trace->steps.size(), trace->events);
  return PublishSteps(f, ranks, world, 1);
}

// Step records recorded as JSON Lines (a collector on a machine without Kafka): each line a
// rank's record in protobuf's JSON mapping, published as they are. The world size is
// --world-size, else the largest the lines declare, else the highest rank + 1.
int RunRecordsReplay(const ReplayFlags& f) {
  auto files = FindStepRecordFiles(f.paths);
  if (!files.ok()) {
    std::fprintf(stderr, "rankwatch replay: %s\n", std::string(files.status().message()).c_str());
    return 1;
  }
  std::map<uint32_t, RankTrace> ranks;
  uint32_t declared = 0;
  for (const auto& file : *files) {
    auto lines = ReadStepRecordsJsonl(file);
    if (!lines.ok()) {
      std::fprintf(stderr, "rankwatch replay: %s\n", std::string(lines.status().message()).c_str());
      return 1;
    }
    size_t added = 0;
    for (StepRecordLine& l : *lines) {
      RankTrace& r = ranks[l.rank];
      if (!l.node.empty()) r.node = std::move(l.node);
      if (!l.device.empty()) r.device = std::move(l.device);
      declared = std::max(declared, l.world_size);
      const uint64_t step = l.record.step();
      added += r.steps.emplace(step, std::move(l.record)).second;
    }
    spdlog::info("replay: {}: {} records ({} new)", file.string(), lines->size(), added);
  }
  if (ranks.empty()) {
    std::fprintf(stderr, "rankwatch replay: no step records in %zu file(s)\n", files->size());
    return 1;
  }
  const uint32_t highest = ranks.rbegin()->first;
  const uint32_t world = f.world_size > 0 ? f.world_size : std::max(declared, highest + 1);
  if (highest >= world) {
    std::fprintf(stderr, "rankwatch replay: rank %u found, but --world-size is %u\n", highest,
                 world);
    return 2;
  }
  if (ranks.size() < world) {
    spdlog::warn("replay: records of {} of {} ranks; steps will align by the alignment timeout",
                 ranks.size(), world);
  }
  return PublishSteps(f, ranks, world, files->size());
}

// Whether every path is a step-records file or a directory holding one (`--format auto`).
bool AreStepRecords(const std::vector<std::string>& paths) {
  return FindStepRecordFiles(paths).ok();
}

int RunReplay(const ReplayFlags& f) {
  if (f.format == "whatif" || (f.format == "auto" && IsWhatifTrace(f.paths))) {
    return RunWhatifReplay(f);
  }
  if (f.format == "records" || (f.format == "auto" && AreStepRecords(f.paths))) {
    return RunRecordsReplay(f);
  }
  if (f.format != "steps") {
    // auto: Kineto when the paths hold no iteration trace but do hold *.json / *.json.gz.
    const bool kineto = f.format == "kineto" || !FindIterationTraces(f.paths).ok();
    if (kineto) {
      auto kineto_files = FindKinetoTraces(f.paths);
      if (!kineto_files.ok()) {
        std::fprintf(stderr, "rankwatch replay: %s\n",
                     std::string(kineto_files.status().message()).c_str());
        return 1;
      }
      return RunKinetoReplay(f, *kineto_files);
    }
  }
  auto files = FindIterationTraces(f.paths);
  if (!files.ok()) {
    std::fprintf(stderr, "rankwatch replay: %s\n", std::string(files.status().message()).c_str());
    return 1;
  }
  std::map<uint32_t, RankTrace> ranks;
  for (const auto& file : *files) {
    auto trace = ReadIterationTrace(file);
    if (!trace.ok()) {
      std::fprintf(stderr, "rankwatch replay: %s\n", std::string(trace.status().message()).c_str());
      return 1;
    }
    RankTrace& r = ranks[trace->rank];
    r.node = trace->node;
    r.device = trace->device;
    size_t added = 0;
    for (v1::StepRecord& s : trace->steps) added += r.steps.emplace(s.step(), std::move(s)).second;
    spdlog::info("replay: {} -> rank {}, {} steps ({} new)", file.string(), trace->rank,
                 trace->steps.size(), added);
  }
  const uint32_t world = f.world_size > 0 ? f.world_size : ranks.rbegin()->first + 1;
  if (ranks.rbegin()->first >= world) {
    std::fprintf(stderr, "rankwatch replay: rank %u found, but --world-size is %u\n",
                 ranks.rbegin()->first, world);
    return 2;
  }
  if (ranks.size() < world) {
    spdlog::warn("replay: traces for {} of {} ranks; steps will align by the alignment timeout",
                 ranks.size(), world);
  }

  return PublishSteps(f, ranks, world, files->size());
}

}  // namespace

CommandRunner AddReplayCommand(CLI::App& app) {
  auto f = std::make_shared<ReplayFlags>();
  CLI::App* cmd = app.add_subcommand(
      "replay",
      "publish vendor iteration traces (msprof, MindSpore, torch_npu), recorded step records "
      "(*.steps.jsonl) or Kineto traces as a job");
  cmd->add_option("--brokers", f->brokers, "Kafka bootstrap servers")->required();
  cmd->add_option("--topic", f->topic, "telemetry topic")->capture_default_str();
  cmd->add_option("--job", f->job, "training job id to publish as")->required();
  cmd->add_option("--world-size", f->world_size,
                  "ranks in the job (default: the highest rank found + 1)");
  cmd->add_option("--chunk-steps", f->chunk_steps, "steps per rank per Kafka message")
      ->capture_default_str()
      ->check(CLI::Range(1u, 10000u));
  cmd->add_option(
         "--format", f->format,
         "steps: iteration traces as step records; records: step records recorded as JSON "
         "Lines (*.steps.jsonl); kineto: Kineto traces as kernel events; whatif: a per-op "
         "Chrome trace of a pipeline job (the OSDI'25 what-if study's timeline-*.json[.gz], with "
         "its meta-*.yaml) as step records with op records; auto: whatif for a timeline-* trace, "
         "records for *.steps.jsonl files, else kineto when no iteration trace is found")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "steps", "records", "kineto", "whatif"}));
  cmd->add_option("--chunk-events", f->chunk_events, "kernel events per Kafka message (Kineto)")
      ->capture_default_str()
      ->check(CLI::Range(1u, 200000u));
  cmd->add_option("--max-message-bytes", f->max_message_bytes,
                  "the largest Kafka message sent (librdkafka's message.max.bytes; set it to the "
                  "brokers' and the topic's limit): chunks of steps and of kernel events stay "
                  "below it, and a step too large alone goes without its ops")
      ->capture_default_str()
      ->check(CLI::Range(kMinMaxMessageBytes, size_t{1'000'000'000}));
  cmd->add_option(
         "paths", f->paths,
         "trace files or directories (searched for step_trace_*.json, "
         "step_trace_raw_*_detail_time.csv, step_trace_time.csv; or *.steps.jsonl; or Kineto "
         "*.json, *.json.gz; or one what-if timeline-*.json[.gz] or its folder)")
      ->required();
  return [cmd, f]() -> int { return cmd->parsed() ? RunReplay(*f) : -1; };
}

}  // namespace rankwatch
