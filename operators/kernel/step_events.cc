#include "operators/kernel/step_events.h"

#include <algorithm>
#include <map>

#include "absl/container/flat_hash_map.h"
#include "operators/kernel/kernel_type.h"
#include "operators/kernel/timeline_builder.h"

namespace rankwatch::kernel {

std::vector<std::vector<StepEvents>> SplitEventsBySteps(const std::vector<RankTrace>& traces) {
  TimelineOptions topt;
  topt.mode = AnalysisMode::kCorrected;
  topt.per_step = true;
  const JobTimelines job = BuildTimelines(traces, topt);
  std::vector<std::vector<StepEvents>> out(traces.size());
  for (size_t k = 0; k < traces.size(); ++k) {
    const RankTrace& t = traces[k];
    absl::flat_hash_map<uint32_t, uint32_t> position;  // trace index -> position in events
    for (uint32_t i = 0; i < t.events.size(); ++i) position.emplace(t.events[i].index, i);
    std::map<int64_t, std::vector<uint32_t>> by_step;
    // BuildTimelines returns the windows of trace k in order among job.steps; timelines point
    // at their trace's string table, which identifies the trace.
    for (const RankTimeline& w : job.steps) {
      if (w.strings != &t.strings) continue;
      std::vector<uint32_t>& list = by_step[w.step];
      for (const GpuOp& op : w.gpu) list.push_back(position.at(op.index));
      for (const CpuCall& c : w.calls) list.push_back(position.at(c.index));
    }
    // The step markers, CPU-side rows named ProfilerStep#N (they give CPU rows their step).
    for (uint32_t i = 0; i < t.events.size(); ++i) {
      const TraceEvent& e = t.events[i];
      if (e.stream >= 0) continue;
      const auto n = IterationStepNumber(t.strings[e.name]);
      if (!n) continue;
      auto it = by_step.find(*n);
      if (it != by_step.end()) it->second.push_back(i);
    }
    for (auto& [step, list] : by_step) {
      std::sort(list.begin(), list.end());
      list.erase(std::unique(list.begin(), list.end()), list.end());
      out[k].push_back({step, std::move(list)});
    }
  }
  return out;
}

}  // namespace rankwatch::kernel
