// `rankwatch replay --brokers B --job J PATH...`: publishes vendor iteration traces (msprof,
// MindSpore, torch_npu) as the step records of one training job, or Kineto (PyTorch profiler)
// traces as its kernel events (collectors/kineto_replay.h), so the daemon diagnoses them like any
// live job.
#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdio>
#include <map>
#include <memory>

#include "cli/commands.h"
#include "collectors/batch_publisher.h"
#include "collectors/kineto_replay.h"
#include "ingest/batch_decoder.h"
#include "ingest/iteration_trace.h"
#include "ingest/kineto_trace_reader.h"

namespace rankwatch {
namespace {

struct ReplayFlags {
  std::string brokers;
  std::string topic = "rankwatch.telemetry";
  std::string job;
  uint32_t world_size = 0;
  uint32_t chunk_steps = 100;
  uint32_t chunk_events = 20'000;
  std::string format = "auto";  // auto, steps, kineto
  std::vector<std::string> paths;
};

struct RankTrace {
  std::string node, device;
  std::map<uint64_t, v1::StepRecord> steps;  // deduplicated by step number
};

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// A producer that blocks when its queue is full (a replay must not lose data), connected
// within 10 s: InvalidArgument for a bad configuration, Unavailable when no broker answers.
absl::StatusOr<std::unique_ptr<BatchPublisher>> ConnectPublisher(const ReplayFlags& f) {
  PublisherOptions po;
  po.brokers = f.brokers;
  po.topic = f.topic;
  po.client_id = "rankwatch-replay";
  po.warn_as = "rankwatch replay";
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
  o.created_unix_ns = NowNs();
  KinetoReplayStats stats;
  std::string buffer;
  absl::Status s = ReplayKinetoTraces(
      files, o,
      [&](const v1::Batch& b) {
        b.SerializeToString(&buffer);
        return (*publisher)->Publish(f.job, buffer);
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

int RunReplay(const ReplayFlags& f) {
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

  auto publisher = ConnectPublisher(f);
  if (!publisher.ok()) {
    std::fprintf(stderr, "rankwatch replay: %s\n",
                 std::string(publisher.status().message()).c_str());
    return publisher.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  // Publish in chunks of steps across all ranks, so alignment never holds the whole trace.
  std::map<uint32_t, std::map<uint64_t, v1::StepRecord>::iterator> cursor;
  for (auto& [rank, r] : ranks) cursor[rank] = r.steps.begin();
  uint64_t records = 0, messages = 0, sequence = 0;
  const int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count();
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
      auto& it = cursor[rank];
      if (it == r.steps.end()) continue;
      for (uint32_t n = 0; n < f.chunk_steps && it != r.steps.end(); ++n, ++it) {
        *b.add_steps() = it->second;
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
      if (auto s = (*publisher)->Publish(f.job, buffer); !s.ok()) {
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
      "\"messages\": %llu, \"failed\": %llu}\n",
      files->size(), ranks.size(), world, static_cast<unsigned long long>(records),
      static_cast<unsigned long long>(messages),
      static_cast<unsigned long long>((*publisher)->failed()));
  return (*publisher)->failed() == 0 ? 0 : 1;
}

}  // namespace

CommandRunner AddReplayCommand(CLI::App& app) {
  auto f = std::make_shared<ReplayFlags>();
  CLI::App* cmd = app.add_subcommand(
      "replay",
      "publish vendor iteration traces (msprof, MindSpore, torch_npu) or Kineto traces as a job");
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
         "steps: iteration traces as step records; kineto: Kineto traces as kernel events; "
         "auto: kineto when no iteration trace is found")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "steps", "kineto"}));
  cmd->add_option("--chunk-events", f->chunk_events, "kernel events per Kafka message (Kineto)")
      ->capture_default_str()
      ->check(CLI::Range(1u, 200000u));
  cmd->add_option(
         "paths", f->paths,
         "trace files or directories (searched for step_trace_*.json, "
         "step_trace_raw_*_detail_time.csv, step_trace_time.csv; or Kineto *.json, *.json.gz)")
      ->required();
  return [cmd, f]() -> int { return cmd->parsed() ? RunReplay(*f) : -1; };
}

}  // namespace rankwatch
