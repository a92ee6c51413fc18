// `rankwatch replay --brokers B --job J PATH...`: publishes vendor iteration traces (msprof,
// MindSpore, torch_npu) as the step records of one training job, so the daemon diagnoses them
// like any live job.
#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdio>
#include <map>
#include <memory>

#include "collectors/kafka_publisher.h"
#include "daemon/commands.h"
#include "ingest/batch_decoder.h"
#include "ingest/iteration_trace.h"

namespace rankwatch {
namespace {

struct ReplayFlags {
  std::string brokers;
  std::string topic = "rankwatch.telemetry";
  std::string job;
  uint32_t world_size = 0;
  uint32_t chunk_steps = 100;
  std::vector<std::string> paths;
};

struct RankTrace {
  std::string node, device;
  std::map<uint64_t, v1::StepRecord> steps;  // deduplicated by step number
};

int RunReplay(const ReplayFlags& f) {
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

  PublisherOptions po;
  po.brokers = f.brokers;
  po.topic = f.topic;
  po.client_id = "rankwatch-replay";
  auto publisher = BatchPublisher::Connect(po, std::chrono::seconds(10));
  if (!publisher.ok()) {
    std::fprintf(stderr, "rankwatch replay: %s\n", std::string(publisher.status().message()).c_str());
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
  std::printf("{\"files\": %zu, \"ranks\": %zu, \"world_size\": %u, \"records\": %llu, "
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
      "replay", "publish vendor iteration traces (msprof, MindSpore, torch_npu) as a job");
  cmd->add_option("--brokers", f->brokers, "Kafka bootstrap servers")->required();
  cmd->add_option("--topic", f->topic, "telemetry topic")->capture_default_str();
  cmd->add_option("--job", f->job, "training job id to publish as")->required();
  cmd->add_option("--world-size", f->world_size,
                  "ranks in the job (default: the highest rank found + 1)");
  cmd->add_option("--chunk-steps", f->chunk_steps, "steps per rank per Kafka message")
      ->capture_default_str()
      ->check(CLI::Range(1u, 10000u));
  cmd->add_option("paths", f->paths,
                  "trace files or directories (searched for step_trace_*.json, "
                  "step_trace_raw_*_detail_time.csv, step_trace_time.csv)")
      ->required();
  return [cmd, f]() -> int { return cmd->parsed() ? RunReplay(*f) : -1; };
}

}  // namespace rankwatch
