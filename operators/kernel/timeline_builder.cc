#include "operators/kernel/timeline_builder.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "absl/container/flat_hash_map.h"

namespace rankwatch::kernel {
namespace {

// What the pipeline needs to know about a string id, computed once per table.
struct StringInfo {
  std::optional<int64_t> step;       // ^ProfilerStep#(\d+)
  std::optional<int64_t> iteration;  // ProfilerStep\s*#\s*(\d+)
  KernelType type = KernelType::kOther;
  bool gpu_sync_name = false, launch_stats = false, queue_launch = false;
  bool trace_cat = false, idle_cat = false, sync_cat = false, cpu_op_cat = false;
};

std::vector<StringInfo> Describe(const StringTable& strings) {
  std::vector<StringInfo> out(strings.size());
  for (size_t i = 0; i < strings.size(); ++i) {
    const std::string& s = strings[i];
    StringInfo& x = out[i];
    x.step = ProfilerStepNumber(s);
    x.iteration = IterationStepNumber(s);
    x.type = ClassifyKernel(s);
    x.gpu_sync_name = IsGpuSyncName(s);
    x.launch_stats = IsLaunchStatsCall(s);
    x.queue_launch = IsQueueLaunchCall(s);
    x.trace_cat = s == "Trace";
    x.idle_cat = IsIdleCategory(s);
    x.sync_cat = s == "cuda_sync";
    x.cpu_op_cat = s == "cpu_op";
  }
  return out;
}

struct Row {
  TraceEvent e;
  bool gpu_filter = false;
  int64_t index_correlation = -1;
  int64_t iteration = -1;
};

// Spec 1.2 steps 3-4 (HTA) or the corrected equivalent: the rows every analysis starts from.
std::vector<Row> LoadRows(const RankTrace& t, const std::vector<StringInfo>& info, bool hta) {
  std::vector<Row> rows;
  rows.reserve(t.events.size());
  for (const TraceEvent& e : t.events) {
    if (info[e.category].trace_cat) continue;
    Row r{e};
    if (hta && t.ts_is_float) {
      const double ts = static_cast<double>(e.ts_ns) / 1000.0;
      const double end = ts + static_cast<double>(e.dur_ns) / 1000.0;
      const int64_t ts_us = static_cast<int64_t>(std::ceil(ts));
      const int64_t end_us = static_cast<int64_t>(std::floor(end));
      r.e.ts_ns = ts_us * 1000;
      r.e.dur_ns = (end_us - ts_us) * 1000;
    }
    if (!hta && r.e.dur_ns < 0) continue;
    r.gpu_filter = (e.stream >= 0 && e.correlation >= 0) || info[e.name].gpu_sync_name;
    rows.push_back(r);
  }
  return rows;
}

// Spec 1.3: index of the partner row of the other side with the same correlation.
void LinkCorrelations(std::vector<Row>& rows) {
  absl::flat_hash_map<int64_t, uint32_t> last_cpu, last_gpu;
  for (const Row& r : rows) {
    if (r.e.correlation == -1) continue;
    (r.gpu_filter ? last_gpu : last_cpu)[r.e.correlation] = r.e.index;
  }
  for (Row& r : rows) {
    if (r.e.correlation == -1) continue;
    const auto& other = r.gpu_filter ? last_cpu : last_gpu;
    auto it = other.find(r.e.correlation);
    r.index_correlation = it == other.end() ? std::min<int64_t>(r.e.correlation, 0) : it->second;
  }
}

bool IsCpuIterationRow(const Row& r, const std::vector<StringInfo>& info) {
  return r.e.stream < 0 || (r.e.stream == 0 && info[r.e.category].cpu_op_cat);
}

// Spec 11: the iteration of every row (CPU rows by ProfilerStep containment, GPU rows via
// their launch).
void AssignIterations(std::vector<Row>& rows, const std::vector<StringInfo>& info) {
  struct Step {
    int64_t ts, end, n;
  };
  std::vector<Step> steps;
  for (const Row& r : rows) {
    if (IsCpuIterationRow(r, info) && info[r.e.name].iteration) {
      steps.push_back({r.e.ts_ns, r.e.ts_ns + r.e.dur_ns, *info[r.e.name].iteration});
    }
  }
  std::stable_sort(steps.begin(), steps.end(),
                   [](const Step& a, const Step& b) { return a.ts < b.ts; });
  absl::flat_hash_map<uint32_t, int64_t> by_index;
  for (Row& r : rows) {
    if (!IsCpuIterationRow(r, info)) continue;
    r.iteration = -1;
    auto it = std::upper_bound(steps.begin(), steps.end(), r.e.ts_ns,
                               [](int64_t ts, const Step& s) { return ts < s.ts; });
    while (it != steps.begin()) {
      --it;
      if (r.e.ts_ns < it->end) {
        r.iteration = it->n;
        break;
      }
    }
    if (r.e.correlation != -1) by_index[r.e.index] = r.iteration;
  }
  for (Row& r : rows) {
    if (IsCpuIterationRow(r, info)) continue;
    if (r.e.stream == 0) {
      r.iteration = kNoIteration;
      continue;
    }
    auto it = r.index_correlation > 0 ? by_index.find(static_cast<uint32_t>(r.index_correlation))
                                      : by_index.end();
    r.iteration = it == by_index.end() ? -1 : it->second;
  }
}

}  // namespace

JobTimelines BuildTimelines(const std::vector<RankTrace>& traces, const TimelineOptions& options) {
  const bool hta = options.mode == AnalysisMode::kHtaCompat;
  JobTimelines out;
  std::vector<std::vector<StringInfo>> infos;
  std::vector<std::vector<Row>> all_rows;
  std::set<std::string> step_names;
  int64_t min_ts = std::numeric_limits<int64_t>::max();
  for (const RankTrace& t : traces) {
    infos.push_back(Describe(t.strings));
    all_rows.push_back(LoadRows(t, infos.back(), hta));
    for (const Row& r : all_rows.back()) {
      min_ts = std::min(min_ts, r.e.ts_ns);
      if (infos.back()[r.e.name].step) step_names.insert(t.strings[r.e.name]);
    }
  }
  if (min_ts == std::numeric_limits<int64_t>::max()) min_ts = 0;
  out.min_ts_ns = min_ts;
  const bool filter = hta && step_names.size() >= 2;
  if (hta && !filter) {
    out.warnings.push_back(
        "fewer than 2 ProfilerSteps: nothing filtered (HTA analyses every event)");
  }
  std::set<int64_t> kept_steps;

  for (size_t k = 0; k < traces.size(); ++k) {
    const RankTrace& t = traces[k];
    const std::vector<StringInfo>& info = infos[k];
    std::vector<Row>& rows = all_rows[k];
    for (Row& r : rows) r.e.ts_ns -= min_ts;
    LinkCorrelations(rows);
    AssignIterations(rows, info);

    // Spec 1.5: keep CPU rows before the last step; GPU rows by their launch, with multiplicity.
    std::vector<const Row*> kept_gpu, kept_cpu;
    if (filter) {
      int64_t last_start = std::numeric_limits<int64_t>::min(), last_end = last_start;
      int64_t cpu_min_ts = std::numeric_limits<int64_t>::max(), cpu_min_end = cpu_min_ts;
      bool any_step = false;
      for (const Row& r : rows) {
        if (r.gpu_filter) continue;
        cpu_min_ts = std::min(cpu_min_ts, r.e.ts_ns);
        cpu_min_end = std::min(cpu_min_end, r.e.ts_ns + r.e.dur_ns);
        if (info[r.e.name].step) {
          any_step = true;
          last_start = std::max(last_start, r.e.ts_ns);
          last_end = std::max(last_end, r.e.ts_ns + r.e.dur_ns);
        }
      }
      if (!any_step) {
        last_start = cpu_min_ts;
        last_end = cpu_min_end;
        out.warnings.push_back("rank " + std::to_string(t.rank) +
                               " has no ProfilerStep while others do: all its events are dropped");
      }
      absl::flat_hash_map<int64_t, uint32_t> cpu_correlations;
      for (const Row& r : rows) {
        if (r.gpu_filter) continue;
        const bool keep =
            options.include_last_profiler_step ? r.e.ts_ns <= last_end : r.e.ts_ns < last_start;
        if (!keep) continue;
        kept_cpu.push_back(&r);
        ++cpu_correlations[r.e.correlation];
      }
      for (const Row& r : rows) {
        if (!r.gpu_filter) continue;
        auto it = cpu_correlations.find(r.e.correlation);
        if (it == cpu_correlations.end()) continue;
        for (uint32_t m = 0; m < it->second; ++m) kept_gpu.push_back(&r);
      }
    } else {
      for (const Row& r : rows) (r.gpu_filter ? kept_gpu : kept_cpu).push_back(&r);
    }

    RankTimeline tl;
    tl.rank = t.rank;
    tl.strings = &t.strings;
    absl::flat_hash_map<uint32_t, int64_t> ts_by_index;
    int64_t lo = std::numeric_limits<int64_t>::max(), hi = std::numeric_limits<int64_t>::min();
    for (const auto* list : {&kept_gpu, &kept_cpu}) {
      for (const Row* r : *list) {
        ts_by_index.emplace(r->e.index, r->e.ts_ns);
        lo = std::min(lo, r->e.ts_ns);
        hi = std::max(hi, r->e.ts_ns);
      }
    }
    tl.min_ts = lo == std::numeric_limits<int64_t>::max() ? 0 : lo;
    tl.max_ts = hi == std::numeric_limits<int64_t>::min() ? 0 : hi;
    for (const auto* list : {&kept_gpu, &kept_cpu}) {
      for (const Row* r : *list) {
        const TraceEvent& e = r->e;
        if (e.stream != -1) {
          GpuOp op;
          op.ts = e.ts_ns;
          op.dur = e.dur_ns;
          op.stream = e.stream;
          op.correlation = e.correlation;
          op.index_correlation = r->index_correlation;
          if (r->index_correlation >= 0) {
            auto it = ts_by_index.find(static_cast<uint32_t>(r->index_correlation));
            if (it != ts_by_index.end()) op.runtime_ts = it->second;
          }
          op.iteration = r->iteration;
          op.memory_bw_gbps = e.memory_bw_gbps;
          op.name = e.name;
          op.category = e.category;
          op.index = e.index;
          op.type = info[e.name].type;
          op.idle_eligible = info[e.category].idle_cat;
          op.is_sync = info[e.category].sync_cat || info[e.name].gpu_sync_name;
          tl.gpu.push_back(op);
        } else if (e.correlation != -1) {
          CpuCall c;
          c.ts = e.ts_ns;
          c.dur = e.dur_ns;
          c.correlation = e.correlation;
          c.index_correlation = r->index_correlation;
          c.iteration = r->iteration;
          c.name = e.name;
          c.index = e.index;
          c.launch_stats = info[e.name].launch_stats;
          c.queue_launch = info[e.name].queue_launch;
          tl.calls.push_back(c);
        } else if (info[e.name].step) {
          kept_steps.insert(*info[e.name].step);
        }
      }
    }
    if (options.per_step) {
      std::map<int64_t, RankTimeline> by_step;
      auto window = [&](int64_t step) -> RankTimeline& {
        RankTimeline& w = by_step[step];
        w.rank = t.rank;
        w.step = step;
        w.strings = &t.strings;
        return w;
      };
      for (const GpuOp& op : tl.gpu) {
        if (op.iteration >= 0) window(op.iteration).gpu.push_back(op);
      }
      for (const CpuCall& c : tl.calls) {
        if (c.iteration >= 0) window(c.iteration).calls.push_back(c);
      }
      for (auto& [step, w] : by_step) {
        w.min_ts = std::numeric_limits<int64_t>::max();
        w.max_ts = std::numeric_limits<int64_t>::min();
        for (const GpuOp& op : w.gpu)
          w.min_ts = std::min(w.min_ts, op.ts), w.max_ts = std::max(w.max_ts, op.ts);
        for (const CpuCall& c : w.calls)
          w.min_ts = std::min(w.min_ts, c.ts), w.max_ts = std::max(w.max_ts, c.ts);
        out.steps.push_back(std::move(w));
      }
    }
    out.ranks.push_back(std::move(tl));
  }
  out.profiler_steps.assign(kept_steps.begin(), kept_steps.end());
  return out;
}

}  // namespace rankwatch::kernel
