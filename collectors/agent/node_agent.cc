#include "collectors/agent/node_agent.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_join.h"

#include "collectors/kineto_replay.h"
#include "traces/iteration_trace.h"
#include "wire/schema.h"

#ifndef RANKWATCH_VERSION
#define RANKWATCH_VERSION "0"
#endif

namespace rankwatch {

namespace {
constexpr int kMaxStepsPerBatch = 10000;
static_assert(static_cast<size_t>(kMaxStepsPerBatch) <= BatchLimits{}.max_steps);
// Room a Kineto trace's batches keep for the capture id its copies for a capture carry
// (ForwardToCaptures; request ids are at most 128 bytes), and a Flight Recorder dump's batch for
// its envelope (identity, counters).
constexpr size_t kCaptureIdRoom = 256;
constexpr size_t kDumpEnvelopeRoom = 4096;
}  // namespace

NodeAgent::NodeAgent(NodeAgentOptions options, BatchPublisher* publisher,
                     std::unique_ptr<ControlListener> control)
    : options_(std::move(options)),
      publisher_(publisher),
      fr_transport_(options_.flight_recorder_transport),
      sampler_(options_.proc),
      control_(std::move(control)) {
  const size_t batch = publisher_->max_batch_bytes();
  fr_transport_.max_bytes =
      std::min(fr_transport_.max_bytes,
               batch > 2 * kDumpEnvelopeRoom ? batch - kDumpEnvelopeRoom : batch / 2);
  nvml_ = NvmlProbe::Open(options_.nvml_library);
  if (!options_.trace_dir.empty()) {
    watcher_ = std::make_unique<TraceWatcher>(
        TraceWatcherOptions{options_.trace_dir, options_.include_existing_traces});
  }
  if (!options_.flight_recorder_prefixes.empty()) {
    dump_watcher_ = std::make_unique<FrDumpWatcher>(
        FrDumpWatcherOptions{options_.flight_recorder_prefixes, options_.include_existing_dumps});
  }
}

v1::Batch NodeAgent::NewBatch(uint32_t rank, int64_t unix_ns, uint32_t world_size) {
  v1::Batch b;
  b.set_schema_version(kSchemaVersion);
  b.set_created_unix_ns(unix_ns);
  v1::SourceIdentity* src = b.mutable_source();
  src->set_training_job(options_.training_job);
  src->set_rank(rank);
  src->set_world_size(world_size == 0 ? options_.world_size : world_size);
  src->set_node(options_.node);
  src->set_pid(static_cast<uint32_t>(getpid()));
  src->set_collector("rankwatch-agent/" RANKWATCH_VERSION);
  return b;
}

bool NodeAgent::Publish(v1::Batch* b) {
  b->set_sequence(sequence_++);
  b->set_dropped_records(dropped_since_last_);
  b->SerializeToString(&buffer_);
  const absl::Status s =
      publisher_->Publish(options_.training_job, buffer_, b->samples_size() + b->steps_size());
  if (s.ok()) {
    counters_.batches_sent.fetch_add(1, std::memory_order_relaxed);
    dropped_since_last_ = 0;
    return true;
  }
  if (absl::IsOutOfRange(s)) counters_.batches_oversized.fetch_add(1, std::memory_order_relaxed);
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
  TakeCaptures(unix_ns);
  if (watcher_) {
    for (const FoundTrace& trace : watcher_->Poll()) PublishTrace(trace, unix_ns);
  }
  ExpireCaptures(unix_ns);
  TakeDumpRequests(unix_ns);
  if (dump_watcher_) {
    for (const FoundDump& dump : dump_watcher_->Poll()) PublishDump(dump, unix_ns);
  }
  ExpireDumpRequests(unix_ns);
}

bool NodeAgent::Addresses(const Capture& c, uint32_t rank) const {
  if (c.answered.count(rank) > 0) return false;
  if (c.request.ranks_size() == 0) return rank < options_.world_size;
  return std::find(c.request.ranks().begin(), c.request.ranks().end(), rank) !=
         c.request.ranks().end();
}

void NodeAgent::TakeCaptures(int64_t unix_ns) {
  if (!control_ || !control_->pending()) return;
  for (v1::ControlRequest& r : control_->Take()) {
    if (r.action_case() != v1::ControlRequest::kCapture) continue;  // the listener refuses others
    counters_.capture_requests.fetch_add(1, std::memory_order_relaxed);
    Capture& c = captures_.emplace_back();
    c.request = std::move(r);
    spdlog::info(
        "agent: capture {} ({} steps, {}): ranks {} wait for their next trace in '{}'",
        c.request.id(), c.request.capture().steps(), c.request.requested_by(),
        c.request.ranks_size() == 0 ? std::string("all") : absl::StrJoin(c.request.ranks(), ","),
        options_.trace_dir);
    for (uint32_t rank : trace_ranks_) {
      if (Addresses(c, rank)) Accept(c, rank, unix_ns);
    }
  }
}

void NodeAgent::Accept(Capture& c, uint32_t rank, int64_t unix_ns) {
  if (!c.accepted.insert(rank).second) return;
  v1::ControlReply r;
  r.set_request_id(c.request.id());
  r.set_state(v1::CONTROL_ACCEPTED);
  r.set_first_step(-1);
  Reply(rank, std::move(r), unix_ns);
}

void NodeAgent::Reply(uint32_t rank, v1::ControlReply reply, int64_t unix_ns) {
  v1::Batch b = NewBatch(rank, unix_ns);
  *b.add_control_replies() = std::move(reply);
  // A reply waits for room like a trace's batch: the daemon follows the capture by it.
  const absl::Status s =
      PublishWaiting(&b, std::chrono::steady_clock::now() + std::chrono::seconds(5));
  if (!s.ok()) {
    spdlog::warn("agent: the answer to capture {} for rank {} was not sent: {}",
                 b.control_replies(0).request_id(), rank, std::string(s.message()));
  }
}

void NodeAgent::ExpireCaptures(int64_t unix_ns) {
  for (auto it = captures_.begin(); it != captures_.end();) {
    Capture& c = *it;
    if (unix_ns < c.request.deadline_unix_ns()) {
      ++it;
      continue;
    }
    for (uint32_t rank : c.accepted) {
      v1::ControlReply r;
      r.set_request_id(c.request.id());
      r.set_state(v1::CONTROL_FAILED);
      r.set_first_step(-1);
      r.set_reason("no trace of rank " + std::to_string(rank) + " completed in '" +
                   options_.trace_dir + "' before the request's deadline");
      Reply(rank, std::move(r), unix_ns);
      counters_.capture_ranks_failed.fetch_add(1, std::memory_order_relaxed);
    }
    it = captures_.erase(it);
  }
}

absl::Status NodeAgent::ForwardToCaptures(const v1::Batch& batch,
                                          std::chrono::steady_clock::time_point deadline,
                                          std::map<std::string, FileCapture>* file,
                                          int64_t unix_ns) {
  const uint32_t rank = batch.source().rank();
  trace_ranks_.insert(rank);
  for (Capture& c : captures_) {
    if (!Addresses(c, rank)) continue;
    auto [at, first] = file->try_emplace(c.request.id());
    FileCapture& fc = at->second;
    if (first) {
      fc.rank = rank;
      Accept(c, rank, unix_ns);
    } else if (fc.rank != rank) {
      continue;  // a file of two ranks: the first one's steps only
    }
    v1::Batch copy;
    copy.set_schema_version(batch.schema_version());
    copy.set_created_unix_ns(batch.created_unix_ns());
    *copy.mutable_source() = batch.source();
    *copy.mutable_trace() = batch.trace();
    copy.mutable_trace()->set_capture_id(c.request.id());
    copy.mutable_trace()->set_end_of_file(false);
    *copy.mutable_strings() = batch.strings();
    const size_t want = c.request.capture().steps();
    for (const v1::KernelEvent& k : batch.kernels()) {
      // The profiler's step ranges are not operators: the comparison leaves them out.
      if (k.name() < static_cast<uint32_t>(batch.strings_size()) &&
          absl::StartsWith(batch.strings(k.name()), "ProfilerStep#")) {
        continue;
      }
      if (fc.steps.count(k.step()) == 0) {
        if (fc.steps.size() >= want) continue;
        fc.steps.insert(k.step());
      }
      *copy.add_kernels() = k;
      auto [span, added] = fc.span.try_emplace(k.step(), k.ts_ns(), k.ts_ns() + k.dur_ns());
      if (!added) {
        span->second.first = std::min(span->second.first, k.ts_ns());
        span->second.second = std::max(span->second.second, k.ts_ns() + k.dur_ns());
      }
    }
    if (copy.kernels_size() == 0) continue;
    fc.events += copy.kernels_size();
    if (absl::Status s = PublishWaiting(&copy, deadline); !s.ok()) return s;
  }
  return absl::OkStatus();
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
  const size_t max_bytes = publisher_->max_batch_bytes();
  absl::Status status;
  size_t batches = 0;
  // Batches of at most kMaxStepsPerBatch steps and max_bytes (one step at least).
  for (size_t i = 0; i < it->steps.size() || i == 0;) {
    v1::Batch b = NewBatch(it->rank, unix_ns);
    b.mutable_source()->set_device(it->device);
    if (!it->node.empty()) b.mutable_source()->set_node(it->node);
    b.mutable_trace()->set_file(trace.file.string());
    // The envelope as PublishWaiting sends it (sequence, dropped records: 22 bytes at most).
    size_t bytes = b.ByteSizeLong() + 22;
    for (; i < it->steps.size() && b.steps_size() < kMaxStepsPerBatch; ++i) {
      const size_t need = EncodedFieldBytes(it->steps[i].ByteSizeLong());
      if (b.steps_size() > 0 && bytes + need > max_bytes) break;
      *b.add_steps() = it->steps[i];
      bytes += need;
    }
    status = PublishWaiting(&b, deadline);
    if (!status.ok()) break;
    ++batches;
    if (i >= it->steps.size()) break;
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
    absl::Status sent =
        publisher_->Publish(options_.training_job, buffer_,
                            b->steps_size() + b->kernels_size() + b->flight_recorder_dumps_size());
    if (sent.ok()) {
      counters_.batches_sent.fetch_add(1, std::memory_order_relaxed);
      return sent;
    }
    if (absl::IsOutOfRange(sent)) {  // too large: never retried
      counters_.batches_oversized.fetch_add(1, std::memory_order_relaxed);
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
  // Within a message, with room for the capture id of the copies sent for a capture.
  o.max_bytes = std::max(publisher_->max_batch_bytes(), 2 * kCaptureIdRoom) - kCaptureIdRoom;
  const auto deadline = std::chrono::steady_clock::now() + options_.trace_publish_timeout;
  KinetoReplayStats stats;
  std::map<std::string, FileCapture> captured;  // request id: what this file gave it
  const absl::Status s = ReplayKinetoTraces(
      {trace.file}, o,
      [&](const v1::Batch& batch) {
        v1::Batch b = batch;
        if (absl::Status sent = PublishWaiting(&b, deadline); !sent.ok()) return sent;
        return ForwardToCaptures(batch, deadline, &captured, unix_ns);
      },
      &stats);
  // Each capture this file served is answered: DONE with what was sent, or FAILED.
  for (auto& [id, fc] : captured) {
    auto c = std::find_if(captures_.begin(), captures_.end(),
                          [&](const Capture& x) { return x.request.id() == id; });
    if (c == captures_.end()) continue;
    v1::ControlReply r;
    r.set_request_id(id);
    if (s.ok() && fc.events > 0) {
      r.set_state(v1::CONTROL_DONE);
      r.set_first_step(*fc.steps.begin());
      r.set_steps(static_cast<uint32_t>(fc.steps.size()));
      r.set_events(fc.events);
      int64_t span_ns = 0;
      for (const auto& [step, span] : fc.span) span_ns += span.second - span.first;
      r.set_profiled_step_ns(static_cast<uint64_t>(std::max<int64_t>(0, span_ns)));
      counters_.capture_ranks_done.fetch_add(1, std::memory_order_relaxed);
      spdlog::info("agent: capture {}: rank {} sent {} events of steps {}-{} from {}", id, fc.rank,
                   fc.events, *fc.steps.begin(), *fc.steps.rbegin(), trace.file.string());
    } else {
      r.set_state(v1::CONTROL_FAILED);
      r.set_first_step(-1);
      r.set_reason(s.ok() ? "the trace " + trace.file.string() + " has no profiler step"
                          : "the trace " + trace.file.string() +
                                " could not be sent: " + std::string(s.message()));
      counters_.capture_ranks_failed.fetch_add(1, std::memory_order_relaxed);
    }
    Reply(fc.rank, std::move(r), unix_ns);
    c->accepted.erase(fc.rank);
    c->answered.insert(fc.rank);
  }
  // A capture every addressed rank answered is closed.
  std::erase_if(captures_, [&](const Capture& c) {
    if (!c.accepted.empty()) return false;
    if (c.request.ranks_size() == 0) return false;  // every rank: open until its deadline
    for (uint32_t r : c.request.ranks()) {
      if (c.answered.count(r) == 0) return false;
    }
    return true;
  });
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
