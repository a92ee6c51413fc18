#include "operators/kernel/kernel_accumulator.h"

#include <algorithm>
#include <utility>

#include "operators/kernel/timeline_builder.h"

namespace rankwatch::kernel {

KernelAccumulator::KernelAccumulator(std::string training_job, KernelAccumulatorOptions options)
    : training_job_(std::move(training_job)), options_(std::move(options)) {}

uint32_t KernelAccumulator::Intern(Rank& r, const std::string& s) {
  if (r.strings.size() >= options_.max_names_per_rank) {
    auto found = r.ids.find(s);
    if (found != r.ids.end()) return found->second;
    static const std::string kOther = "(other names)";
    auto [it, inserted] = r.ids.try_emplace(kOther, static_cast<uint32_t>(r.strings.size()));
    if (inserted) r.strings.push_back(kOther);
    return it->second;
  }
  auto [it, inserted] = r.ids.try_emplace(s, static_cast<uint32_t>(r.strings.size()));
  if (inserted) r.strings.push_back(s);
  return it->second;
}

KernelDelta KernelAccumulator::Add(const v1::Batch& batch) {
  KernelDelta d;
  const uint32_t rank_id = batch.source().rank();
  world_size_ = batch.source().world_size();
  Rank& r = ranks_[rank_id];
  // Batch string ids are translated lazily: most batches use few of their strings' ids again.
  constexpr uint32_t kUnmapped = UINT32_MAX;
  remap_.assign(static_cast<size_t>(batch.strings_size()), kUnmapped);
  auto id = [&](uint32_t batch_id) -> uint32_t {
    if (batch_id >= remap_.size()) return 0;  // the decoder rejects these; stay safe anyway
    uint32_t& m = remap_[batch_id];
    if (m == kUnmapped) m = Intern(r, batch.strings(static_cast<int>(batch_id)));
    return m;
  };
  int64_t step = INT64_MIN;
  OpenStep* open = nullptr;
  size_t new_steps = 0;
  for (const v1::KernelEvent& e : batch.kernels()) {
    if (e.step() < 0) {
      ++d.unstepped;
      continue;
    }
    if (e.step() <= r.closed_through) {
      ++d.late;
      continue;
    }
    if (e.step() != step) {
      auto found = r.open.find(e.step());
      if (found == r.open.end()) {
        if (new_steps >= options_.max_new_steps_per_batch) {
          ++d.over_limit;
          continue;
        }
        ++new_steps;
        found = r.open.try_emplace(e.step()).first;
      }
      step = e.step();
      open = &found->second;
    }
    if (open->events.size() >= options_.max_events_per_step ||
        open_events_ >= options_.max_open_events) {
      ++d.over_limit;
      continue;
    }
    ++open_events_;
    TraceEvent& t = open->events.emplace_back();
    t.ts_ns = e.ts_ns();
    t.dur_ns = e.dur_ns();
    t.stream = e.stream();
    t.correlation = e.correlation();
    t.bytes = e.bytes();
    t.memory_bw_gbps = e.memory_bw_gbps();
    t.name = id(e.name());
    t.category = id(e.category());
    t.index = r.next_index++;
    ++d.accepted;
  }
  while (r.open.size() > options_.open_steps_per_rank) {
    auto it = r.open.begin();
    Close(rank_id, r, it->first, it->second);
    r.open.erase(it);
    ++d.steps_closed;
  }
  if (batch.final() || batch.trace().end_of_file()) {
    for (auto& [s, o] : r.open) Close(rank_id, r, s, o);
    d.steps_closed += static_cast<uint32_t>(r.open.size());
    r.open.clear();
  }
  accepted_ += d.accepted;
  late_ += d.late;
  unstepped_ += d.unstepped;
  over_limit_ += d.over_limit;
  return d;
}

uint32_t KernelAccumulator::CloseAll() {
  uint32_t closed = 0;
  for (auto& [rank_id, r] : ranks_) {
    for (auto& [s, o] : r.open) Close(rank_id, r, s, o);
    closed += static_cast<uint32_t>(r.open.size());
    r.open.clear();
  }
  return closed;
}

void KernelAccumulator::Close(uint32_t rank_id, Rank& r, int64_t step, OpenStep& open) {
  open_events_ -= std::min(open_events_, open.events.size());
  r.closed_through = std::max(r.closed_through, step);
  ++r.steps_closed;
  ++steps_closed_;
  // The rank's string table moves into the trace for the analysis and back: no copy per step.
  std::vector<RankTrace> traces(1);
  RankTrace& t = traces[0];
  t.rank = rank_id;
  t.strings = std::move(r.strings);
  t.events = std::move(open.events);
  TimelineOptions topt;
  topt.mode = AnalysisMode::kCorrected;
  topt.per_step = true;
  const JobTimelines job = BuildTimelines(traces, topt);
  KernelAnalysisOptions aopt = options_.analysis;
  aopt.mode = AnalysisMode::kCorrected;
  aopt.keep_launch_rows = true;  // for the delay quantiles; dropped with the report
  KernelStepSummary summary;
  summary.rank = rank_id;
  summary.step = step;
  for (const RankTimeline& w : job.steps) {
    if (w.step == step) summary = SummarizeStep(AnalyzeRank(w, aopt));
  }
  r.strings = std::move(t.strings);
  r.recent.push_back(std::move(summary));
  while (r.recent.size() > options_.history_steps) r.recent.pop_front();
}

KernelJobSnapshot KernelAccumulator::Snapshot() const {
  KernelJobSnapshot s;
  s.training_job = training_job_;
  s.world_size = world_size_;
  for (const auto& [rank_id, r] : ranks_) {
    if (r.recent.empty()) continue;
    RankKernelSummary& rs = s.ranks.emplace_back();
    rs.rank = rank_id;
    rs.steps_closed_total = r.steps_closed;
    rs.recent.assign(r.recent.begin(), r.recent.end());
  }
  s.events_accepted = accepted_;
  s.events_late = late_;
  s.events_unstepped = unstepped_;
  s.events_over_limit = over_limit_;
  s.steps_closed = steps_closed_;
  SummarizeJob(options_.outliers, &s);
  return s;
}

}  // namespace rankwatch::kernel
