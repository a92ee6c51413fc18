// The node agent's Flight Recorder half (collectors/agent/node_agent.h): dumps published as
// they appear, dump requests passed to PyTorch's pipes.
#include <spdlog/spdlog.h>

#include <algorithm>

#include "absl/strings/str_join.h"
#include "collectors/agent/node_agent.h"
#include "flight_recorder/fr_files.h"

namespace rankwatch {

uint32_t NodeAgent::DumpWorldSize(uint32_t rank) const {
  if (rank < options_.world_size) return options_.world_size;
  return std::max(dump_world_size_, rank + 1);
}

void NodeAgent::ReplyDump(const v1::ControlRequest& request, uint32_t rank, v1::ControlState state,
                          const std::string& reason, int64_t unix_ns) {
  v1::Batch b = NewBatch(rank, unix_ns, DumpWorldSize(rank));
  v1::ControlReply* r = b.add_control_replies();
  r->set_request_id(request.id());
  r->set_state(state);
  r->set_reason(reason);
  r->set_first_step(-1);
  const absl::Status s =
      PublishWaiting(&b, std::chrono::steady_clock::now() + std::chrono::seconds(5));
  if (!s.ok()) {
    spdlog::warn("agent: the answer to dump request {} for rank {} was not sent: {}", request.id(),
                 rank, std::string(s.message()));
  }
  if (state == v1::CONTROL_DONE) counters_.fr_ranks_done.fetch_add(1, std::memory_order_relaxed);
  if (state == v1::CONTROL_FAILED) {
    counters_.fr_ranks_failed.fetch_add(1, std::memory_order_relaxed);
  }
}

void NodeAgent::TakeDumpRequests(int64_t unix_ns) {
  if (!control_) return;
  // Dump requests do not wait for a step: the listener queues them with stacks requests (taken
  // here without pipes too, so that they do not fill its queue).
  for (v1::ControlRequest& r : control_->WaitStacks(std::chrono::milliseconds(0))) {
    if (r.action_case() != v1::ControlRequest::kFlightRecorder) continue;
    if (options_.flight_recorder_pipe_prefixes.empty()) continue;
    counters_.fr_requests.fetch_add(1, std::memory_order_relaxed);
    DumpRequest& d = dump_requests_.emplace_back();
    d.request = std::move(r);
    // The ranks addressed that have a pipe here, under the first prefix that has one.
    std::map<uint32_t, std::filesystem::path> pipes;
    for (const std::string& prefix : options_.flight_recorder_pipe_prefixes) {
      if (d.request.ranks_size() == 0) {
        for (uint32_t rank : FindDumpPipes(prefix))
          pipes.try_emplace(rank, DumpPipePath(prefix, rank));
        continue;
      }
      for (uint32_t rank : d.request.ranks()) {
        std::error_code ec;
        const std::filesystem::path pipe = DumpPipePath(prefix, rank);
        if (std::filesystem::exists(pipe, ec)) pipes.try_emplace(rank, pipe);
      }
    }
    std::vector<uint32_t> asked;
    for (const auto& [rank, pipe] : pipes) {
      if (absl::Status s = TriggerDumpPipe(pipe); !s.ok()) {
        ReplyDump(d.request, rank, v1::CONTROL_FAILED, std::string(s.message()), unix_ns);
        continue;
      }
      counters_.fr_ranks_triggered.fetch_add(1, std::memory_order_relaxed);
      d.triggered.insert(rank);
      asked.push_back(rank);
      ReplyDump(d.request, rank, v1::CONTROL_ACCEPTED, "", unix_ns);
    }
    spdlog::info("agent: dump request {} ({}): asked ranks {} through their pipes", d.request.id(),
                 d.request.requested_by(), asked.empty() ? "none" : absl::StrJoin(asked, ","));
  }
  std::erase_if(dump_requests_, [](const DumpRequest& d) { return d.triggered.empty(); });
}

void NodeAgent::ExpireDumpRequests(int64_t unix_ns) {
  std::erase_if(dump_requests_, [&](const DumpRequest& d) {
    if (unix_ns < d.request.deadline_unix_ns()) return false;
    for (uint32_t rank : d.triggered) {
      ReplyDump(d.request, rank, v1::CONTROL_FAILED,
                "rank " + std::to_string(rank) + " wrote no Flight Recorder dump by the deadline",
                unix_ns);
    }
    return true;
  });
}

void NodeAgent::PublishDump(const FoundDump& found, int64_t unix_ns) {
  fr::FrReadOptions ro;
  ro.max_frames = fr_transport_.max_frames;
  // The dump's own rank wins over its file name's (they agree when PyTorch wrote it).
  const fr::RankDump read = fr::LoadRankDump(found.rank, found.file, ro);
  const uint32_t rank = read.rank;
  v1::FlightRecorderDump dump;
  if (read.state == fr::DumpState::kUnreadable) {
    fr::UnreadableToProto(read.error, fr_transport_, &dump);
  } else {
    fr::DumpToProto(read.dump, fr_transport_, &dump);
    for (const fr::FrGroup& g : read.dump.groups) {
      for (uint32_t r : g.ranks) dump_world_size_ = std::max(dump_world_size_, r + 1);
    }
  }
  dump.set_rank(rank);
  dump.set_source(fr::WireString(found.file.string(), 4096));
  dump.set_node(options_.node);
  dump.set_file_mtime_unix_ns(std::max<int64_t>(0, found.mtime_unix_ns));
  dump.set_file_bytes(found.bytes);
  // The request that asked this rank, if one waits for it: answered DONE once sent.
  auto asked = std::find_if(dump_requests_.begin(), dump_requests_.end(),
                            [&](const DumpRequest& d) { return d.triggered.count(rank) > 0; });
  if (asked != dump_requests_.end()) dump.set_request_id(asked->request.id());
  v1::Batch b = NewBatch(rank, unix_ns, DumpWorldSize(rank));
  *b.add_flight_recorder_dumps() = std::move(dump);
  const absl::Status s =
      PublishWaiting(&b, std::chrono::steady_clock::now() + options_.trace_publish_timeout);
  if (!s.ok()) {
    counters_.fr_dumps_failed.fetch_add(1, std::memory_order_relaxed);
    spdlog::warn("agent: cannot publish the Flight Recorder dump {}: {}", found.file.string(),
                 std::string(s.message()));
    return;
  }
  const v1::FlightRecorderDump& sent = b.flight_recorder_dumps(0);
  if (read.state != fr::DumpState::kUnreadable) {
    counters_.fr_dumps_published.fetch_add(1, std::memory_order_relaxed);
    spdlog::info(
        "agent: published the Flight Recorder dump of rank {} ({}: {} entries, {} left "
        "out)",
        rank, found.file.string(), sent.entries_size(), sent.entries_omitted());
  } else {
    counters_.fr_dumps_unreadable.fetch_add(1, std::memory_order_relaxed);
    spdlog::warn("agent: the Flight Recorder dump {} is unreadable (published as such): {}",
                 found.file.string(), sent.error());
  }
  if (asked != dump_requests_.end()) {
    ReplyDump(asked->request, rank, v1::CONTROL_DONE, "", unix_ns);
    asked->triggered.erase(rank);
    if (asked->triggered.empty()) dump_requests_.erase(asked);
  }
}

}  // namespace rankwatch
