#include "collectors/kineto_replay.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <map>

#include "absl/container/flat_hash_map.h"
#include "operators/kernel/step_events.h"
#include "traces/kineto_trace_reader.h"
#include "wire/schema.h"

namespace rankwatch {
namespace {

struct RankInput {
  KinetoTrace trace;  // events are moved into `analysis`; the metadata stays
  size_t slot = 0;    // position in the traces given to SplitEventsBySteps
};

// Builds one rank's batches; `Next` returns false when the rank has nothing more.
class RankBatcher {
 public:
  RankBatcher(const KinetoReplayOptions& o, const KinetoTrace& meta, const kernel::RankTrace& t,
              std::vector<kernel::StepEvents> steps, uint32_t world, KinetoReplayStats* stats)
      : o_(o), meta_(meta), t_(t), steps_(std::move(steps)), world_(world), stats_(stats) {}

  // The next batch, up to the end of the current step (a batch never mixes steps of one rank,
  // so the daemon sees a rank's steps in order). The last batch of the rank is final.
  bool Next(v1::Batch* b) {
    if (done_) return false;
    b->Clear();
    b->set_schema_version(kSchemaVersion);
    b->set_sequence(sequence_++);
    b->set_created_unix_ns(o_.created_unix_ns);
    v1::SourceIdentity* src = b->mutable_source();
    src->set_training_job(o_.training_job);
    src->set_rank(t_.rank);
    src->set_world_size(world_);
    src->set_device("cuda");
    src->set_node(o_.node);
    src->set_collector(o_.collector);
    v1::KernelTraceInfo* info = b->mutable_trace();
    info->set_source_format("kineto");
    info->set_base_time_unix_ns(meta_.base_time_unix_ns.value_or(0));
    info->set_fractional_timestamps(meta_.ts_is_float);
    info->set_file(meta_.file.string());
    b->add_strings("");
    ids_.clear();
    ids_.emplace(0, 0);
    // The envelope as it will be, `final` and `end_of_file` set (4 bytes at most).
    size_t bytes = b->ByteSizeLong() + 4;
    v1::KernelEvent k;
    while (step_ < steps_.size()) {
      const kernel::StepEvents& s = steps_[step_];
      if (pos_ == s.events.size()) {
        ++step_;
        pos_ = 0;
        break;  // one step per batch at most
      }
      if (static_cast<size_t>(b->kernels_size()) >= o_.max_events) break;
      const kernel::TraceEvent& e = t_.events[s.events[pos_]];
      // Its bytes with the indexes its strings would get (new ones: at most strings_size + 2),
      // checked before it goes in: the batch stays within max_bytes.
      size_t new_bytes = 0;
      k.Clear();
      k.set_name(Provisional(b, e.name, &new_bytes));
      k.set_category(Provisional(b, e.category, &new_bytes));
      k.set_ts_ns(e.ts_ns);
      k.set_dur_ns(e.dur_ns);
      k.set_stream(e.stream);
      k.set_correlation(e.correlation);
      k.set_external_id(-1);
      k.set_bytes(e.bytes);
      k.set_memory_bw_gbps(e.memory_bw_gbps);
      k.set_wait_on_stream(-1);
      k.set_wait_on_cuda_event_record_corr_id(-1);
      k.set_process_rank(-1);
      k.set_step(s.step);
      const size_t need = EncodedFieldBytes(k.ByteSizeLong()) + new_bytes;
      if (b->kernels_size() > 0 && bytes + need > o_.max_bytes) break;
      ++pos_;
      k.set_name(Str(b, e.name));
      k.set_category(Str(b, e.category));
      *b->add_kernels() = k;
      bytes += need;
    }
    if (step_ == steps_.size() ||
        (step_ + 1 == steps_.size() && pos_ == steps_[step_].events.size())) {
      step_ = steps_.size();
      b->set_final(o_.final);
      info->set_end_of_file(true);
      done_ = true;
    }
    return true;
  }

 private:
  // The index of string `id` in `b`, or (not there yet) an index at least as large as the one
  // it will get, its bytes added to `new_bytes`.
  uint32_t Provisional(const v1::Batch* b, uint32_t id, size_t* new_bytes) const {
    if (auto it = ids_.find(id); it != ids_.end()) return it->second;
    *new_bytes += EncodedFieldBytes(std::min(t_.strings[id].size(), o_.max_string_bytes));
    return static_cast<uint32_t>(b->strings_size()) + 2;
  }

  uint32_t Str(v1::Batch* b, uint32_t id) {
    auto [it, added] = ids_.try_emplace(id, static_cast<uint32_t>(b->strings_size()));
    if (added) {
      const std::string& s = t_.strings[id];
      if (s.size() > o_.max_string_bytes) {
        b->add_strings(s.substr(0, o_.max_string_bytes));
        ++stats_->truncated_names;
      } else {
        b->add_strings(s);
      }
    }
    return it->second;
  }

  const KinetoReplayOptions& o_;
  const KinetoTrace& meta_;
  const kernel::RankTrace& t_;
  const std::vector<kernel::StepEvents> steps_;
  const uint32_t world_;
  KinetoReplayStats* stats_;
  absl::flat_hash_map<uint32_t, uint32_t> ids_;
  size_t step_ = 0, pos_ = 0;
  uint64_t sequence_ = 0;
  bool done_ = false;
};

}  // namespace

absl::Status ReplayKinetoTraces(const std::vector<std::filesystem::path>& files,
                                const KinetoReplayOptions& o,
                                const std::function<absl::Status(const v1::Batch&)>& publish,
                                KinetoReplayStats* stats) {
  *stats = KinetoReplayStats{};
  stats->files = files.size();
  std::map<uint32_t, KinetoTrace> by_rank;  // a later file of the same rank wins (as analyze)
  for (const auto& file : files) {
    auto t = ReadKinetoTrace(file);
    if (!t.ok()) return t.status();
    const uint32_t rank = t->rank();
    if (by_rank.contains(rank))
      spdlog::warn("replay: two traces for rank {}; {} wins", rank, file.string());
    spdlog::info("replay: {} -> rank {}, {} events", file.string(), rank, t->events.size());
    by_rank[rank] = std::move(*t);
  }
  if (by_rank.empty()) return absl::NotFoundError("no Kineto traces");
  const uint32_t world = o.world_size > 0 ? o.world_size : by_rank.rbegin()->first + 1;
  if (by_rank.rbegin()->first >= world) {
    return absl::InvalidArgumentError("rank " + std::to_string(by_rank.rbegin()->first) +
                                      " found, but the world size is " + std::to_string(world));
  }
  stats->ranks = by_rank.size();
  stats->world_size = world;
  std::vector<kernel::RankTrace> traces;
  std::vector<const KinetoTrace*> metas;
  for (auto& [rank, t] : by_rank) {
    kernel::RankTrace& r = traces.emplace_back();
    r.rank = rank;
    r.strings = std::move(t.strings);
    r.ts_is_float = t.ts_is_float;
    r.backend = t.backend;
    r.events.reserve(t.events.size());
    for (const KinetoEvent& e : t.events) {
      r.events.push_back({e.ts_ns, e.dur_ns, e.stream, e.correlation, e.bytes, e.memory_bw_gbps,
                          e.name, e.category, e.index});
    }
    t.events = {};
    metas.push_back(&t);
  }
  auto split = kernel::SplitEventsBySteps(traces);
  std::vector<std::unique_ptr<RankBatcher>> batchers;
  for (size_t k = 0; k < traces.size(); ++k) {
    uint64_t stepped = 0;
    for (const auto& s : split[k]) stepped += s.events.size();
    stats->steps += split[k].size();
    stats->unstepped += traces[k].events.size() - stepped;
    batchers.push_back(
        std::make_unique<RankBatcher>(o, *metas[k], traces[k], std::move(split[k]), world, stats));
  }
  // Round robin: each rank's next batch in turn, so every rank advances step by step.
  v1::Batch b;
  for (bool more = true; more;) {
    more = false;
    for (auto& batcher : batchers) {
      if (!batcher->Next(&b)) continue;
      more = true;
      if (auto s = publish(b); !s.ok()) return s;
      ++stats->batches;
      stats->events += b.kernels_size();
    }
  }
  return absl::OkStatus();
}

}  // namespace rankwatch
