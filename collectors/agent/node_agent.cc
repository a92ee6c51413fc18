#include "collectors/agent/node_agent.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include "collectors/kineto_replay.h"
#include "ingest/iteration_trace.h"
#include "wire/schema.h"

#ifndef RANKWATCH_VERSION
#define RANKWATCH_VERSION "0"
#endif

namespace rankwatch {

namespace {
constexpr int kMaxStepsPerBatch = 10000;
static_assert(static_cast<size_t>(kMaxStepsPerBatch) <= BatchLimits{}.max_steps);
}  // namespace

NodeAgent::NodeAgent(NodeAgentOptions options, BatchPublisher* publisher)
    : options_(std::move(options)), publisher_(publisher), sampler_(options_.proc) {
  nvml_ = NvmlProbe::Open(options_.nvml_library);
  if (!options_.trace_dir.empty()) {
    watcher_ = std::make_unique<TraceWatcher>(
        TraceWatcherOptions{options_.trace_dir, options_.include_existing_traces});
  }
}

v1::Batch NodeAgent::NewBatch(uint32_t rank, int64_t unix_ns) {
  v1::Batch b;
  b.set_schema_version(kSchemaVersion);
  b.set_created_unix_ns(unix_ns);
  v1::SourceIdentity* src = b.mutable_source();
  src->set_training_job(options_.training_job);
  src->set_rank(rank);
  src->set_world_size(options_.world_size);
  src->set_node(options_.node);
  src->set_pid(static_cast<uint32_t>(getpid()));
  src->set_collector("rankwatch-agent/" RANKWATCH_VERSION);
  return b;
}

bool NodeAgent::Publish(v1::Batch* b) {
  b->set_sequence(sequence_++);
  b->set_dropped_records(dropped_since_last_);
  b->SerializeToString(&buffer_);
  if (publisher_->Publish(options_.training_job, buffer_).ok()) {
    counters_.batches_sent.fetch_add(1, std::memory_order_relaxed);
    dropped_since_last_ = 0;
    return true;
  }
  counters_.batches_dropped.fetch_add(1, std::memory_order_relaxed);
  dropped_since_last_ += b->samples_size() + b->steps_size();
  return false;
}

void NodeAgent::Tick(int64_t unix_ns) {
  v1::Batch b = NewBatch(options_.rank, unix_ns);
  v1::SystemSample* s = b.add_samples();
  *s = sampler_.Sample(unix_ns);
  if (nvml_) nvml_->Sample(s);
  if (Publish(&b)) counters_.samples.fetch_add(1, std::memory_order_relaxed);
  if (!watcher_) return;
  for (const FoundTrace& trace : watcher_->Poll()) PublishTrace(trace, unix_ns);
}

void NodeAgent::PublishTrace(const FoundTrace& trace, int64_t unix_ns) {
  if (trace.kind == TraceKind::kKineto) {
    PublishKinetoTrace(trace, unix_ns);
    return;
  }
  auto it = ReadIterationTrace(trace.file);
  if (!it.ok() || it->rank >= options_.world_size) {
    counters_.trace_files_failed.fetch_add(1, std::memory_order_relaxed);
    spdlog::warn("agent: cannot publish {}: {}", trace.file.string(),
                 it.ok() ? "rank " + std::to_string(it->rank) + " is not below --world-size " +
                               std::to_string(options_.world_size)
                         : std::string(it.status().message()));
    return;
  }
  const auto deadline = std::chrono::steady_clock::now() + options_.trace_publish_timeout;
  absl::Status status;
  size_t batches = 0;
  for (size_t i = 0; i < it->steps.size() || i == 0; i += kMaxStepsPerBatch) {
    v1::Batch b = NewBatch(it->rank, unix_ns);
    b.mutable_source()->set_device(it->device);
    if (!it->node.empty()) b.mutable_source()->set_node(it->node);
    b.mutable_trace()->set_file(trace.file.string());
    for (size_t j = i; j < std::min(it->steps.size(), i + kMaxStepsPerBatch); ++j) {
      *b.add_steps() = it->steps[j];
    }
    status = PublishWaiting(&b, deadline);
    if (!status.ok()) break;
    ++batches;
    if (it->steps.empty()) break;
  }
  if (!status.ok()) {
    counters_.trace_files_failed.fetch_add(1, std::memory_order_relaxed);
    spdlog::warn("agent: cannot publish {}: {} ({} batches sent)", trace.file.string(),
                 std::string(status.message()), batches);
    return;
  }
  counters_.trace_steps.fetch_add(it->steps.size(), std::memory_order_relaxed);
  counters_.trace_files_published.fetch_add(1, std::memory_order_relaxed);
  spdlog::info("agent: published {} ({} steps of rank {})", trace.file.string(), it->steps.size(),
               it->rank);
}

absl::Status NodeAgent::PublishWaiting(v1::Batch* b,
                                       std::chrono::steady_clock::time_point deadline) {
  b->set_sequence(sequence_++);
  b->SerializeToString(&buffer_);
  while (true) {
    absl::Status sent = publisher_->Publish(options_.training_job, buffer_);
    if (sent.ok()) {
      counters_.batches_sent.fetch_add(1, std::memory_order_relaxed);
      return sent;
    }
    if (!absl::IsResourceExhausted(sent)) return sent;
    if (std::chrono::steady_clock::now() >= deadline) {
      return absl::DeadlineExceededError("Kafka took no batch within the trace publish timeout (" +
                                         std::to_string(options_.trace_publish_timeout.count()) +
                                         " ms)");
    }
    (void)publisher_->Flush(std::chrono::milliseconds(50));  // room frees as batches deliver
  }
}

void NodeAgent::PublishKinetoTrace(const FoundTrace& trace, int64_t unix_ns) {
  KinetoReplayOptions o;
  o.training_job = options_.training_job;
  o.world_size = options_.world_size;
  o.node = options_.node;
  o.collector = "rankwatch-agent/" RANKWATCH_VERSION;
  o.final = false;  // the job goes on: only this file's steps are complete
  o.created_unix_ns = unix_ns;
  const auto deadline = std::chrono::steady_clock::now() + options_.trace_publish_timeout;
  KinetoReplayStats stats;
  const absl::Status s = ReplayKinetoTraces(
      {trace.file}, o,
      [&](const v1::Batch& batch) {
        v1::Batch b = batch;
        return PublishWaiting(&b, deadline);
      },
      &stats);
  counters_.trace_kernel_events.fetch_add(stats.events, std::memory_order_relaxed);
  if (!s.ok()) {
    counters_.trace_files_failed.fetch_add(1, std::memory_order_relaxed);
    spdlog::warn("agent: cannot publish {}: {} ({} batches with {} kernel events sent)",
                 trace.file.string(), std::string(s.message()), stats.batches, stats.events);
    return;
  }
  counters_.trace_files_published.fetch_add(1, std::memory_order_relaxed);
  spdlog::info(
      "agent: published {}: {} steps, {} kernel events in {} batches ({} events "
      "outside every step left out)",
      trace.file.string(), stats.steps, stats.events, stats.batches, stats.unstepped);
}

}  // namespace rankwatch
