// The live kernel path against the offline one: a synthetic job streamed as batches through
// KernelAccumulator must give exactly the per-(rank, step) numbers of BuildTimelines +
// AnalyzeRank on the whole traces (what `rankwatch analyze` prints), whatever the batching.
#include "operators/kernel/kernel_accumulator.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "operators/kernel/step_events.h"
#include "operators/kernel/timeline_builder.h"

namespace rankwatch::kernel {
namespace {

constexpr int64_t us = 1000;

struct TraceWriter {
  RankTrace t;
  uint32_t Id(const std::string& s) {
    for (uint32_t i = 0; i < t.strings.size(); ++i)
      if (t.strings[i] == s) return i;
    t.strings.push_back(s);
    return static_cast<uint32_t>(t.strings.size() - 1);
  }
  void Event(const std::string& cat, const std::string& name, int64_t ts, int64_t dur,
             int64_t stream = -1, int64_t corr = -1, double bw = 0) {
    TraceEvent e;
    e.ts_ns = ts;
    e.dur_ns = dur;
    e.stream = stream;
    e.correlation = corr;
    e.memory_bw_gbps = bw;
    e.name = Id(name);
    e.category = Id(cat);
    e.index = static_cast<uint32_t>(t.events.size()) + 3;  // not 0-based, as after metadata rows
    t.events.push_back(e);
  }
};

// A rank with `steps` ProfilerSteps of kernels, NCCL collectives and copies on three streams,
// warm-up launches before the first step, and kernels that run past the end of their step.
// `gap_us` is the mean host delay between launches (idle time).
RankTrace SyntheticRank(uint32_t rank, int steps, int64_t gap_us, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int64_t> jitter(0, 999);
  TraceWriter w;
  w.t.strings = {""};
  w.t.rank = rank;
  int64_t cpu = 1'000'000 * us + jitter(rng);
  int64_t stream_end[3] = {0, 0, 0};
  int64_t corr = 100;
  auto launch = [&](int kind) {
    const int64_t c = corr++;
    const int64_t call_dur = (4 + jitter(rng) % 60) * us / 2;
    const char* call = kind == 1   ? "cudaLaunchKernelExC"
                       : kind == 2 ? "cudaMemcpyAsync"
                                   : "cudaLaunchKernel";
    w.Event("cuda_runtime", call, cpu, call_dur, -1, c);
    const int stream = kind;
    const int64_t start = std::max(stream_end[stream], cpu + call_dur + jitter(rng) * 20);
    const int64_t dur = kind == 1   ? 300 * us + jitter(rng) * 100
                        : kind == 2 ? 3 * us
                                    : (5 + jitter(rng) % 40) * us;
    const char* names[] = {"void gemm_kernel<float>(...)",
                           "ncclKernel_AllReduce_RING_LL_Sum_float(...)",
                           "Memcpy HtoD (Pageable -> Device)"};
    const std::string name = kind == 0 && jitter(rng) % 2 ? "elementwise_kernel" : names[kind];
    w.Event(kind == 2 ? "gpu_memcpy" : "kernel", name, start, dur, 7 + 13 * stream, c,
            kind == 2 ? 12.5 : 0);
    stream_end[stream] = start + dur;
    cpu += call_dur + gap_us * us / 2 + jitter(rng) * gap_us;
  };
  for (int i = 0; i < 5; ++i) launch(i % 3);  // warm-up: no step
  w.Event("cpu_op", "aten::empty", cpu, 2 * us);
  for (int s = 1; s <= steps; ++s) {
    const int64_t step_start = cpu;
    const size_t marker = w.t.events.size();
    w.Event("user_annotation", "ProfilerStep#" + std::to_string(s), step_start, 0);
    for (int k = 0; k < 40; ++k) launch(k % 7 == 6 ? 1 : k % 11 == 10 ? 2 : 0);
    w.Event("cuda_sync", "Stream Sync", cpu, 2 * us, 7, corr++);
    cpu += 10 * us;
    w.t.events[marker].dur_ns = cpu - step_start;  // kernels launched last run past the step
    cpu += 1;
  }
  return w.t;
}

std::vector<RankTrace> SyntheticJob() {
  return {SyntheticRank(0, 6, 20, 1), SyntheticRank(1, 6, 22, 2), SyntheticRank(2, 6, 400, 3),
          SyntheticRank(3, 5, 21, 4)};
}

// The batches a collector would send: per rank, each step's events in trace order, `chunk`
// events per batch, interleaved across ranks; the last batch of each rank is final.
std::vector<v1::Batch> ToBatches(const std::vector<RankTrace>& traces, size_t chunk) {
  const auto split = SplitEventsBySteps(traces);
  std::vector<std::vector<v1::Batch>> per_rank(traces.size());
  for (size_t k = 0; k < traces.size(); ++k) {
    const RankTrace& t = traces[k];
    v1::Batch* b = nullptr;
    std::map<uint32_t, uint32_t> ids;
    auto str = [&](uint32_t id) {
      auto [it, added] = ids.try_emplace(id, b->strings_size());
      if (added) b->add_strings(t.strings[id]);
      return it->second;
    };
    for (const StepEvents& s : split[k]) {
      for (uint32_t pos : s.events) {
        if (b == nullptr || static_cast<size_t>(b->kernels_size()) >= chunk) {
          b = &per_rank[k].emplace_back();
          b->mutable_source()->set_training_job("j");
          b->mutable_source()->set_rank(t.rank);
          b->mutable_source()->set_world_size(static_cast<uint32_t>(traces.size()));
          b->add_strings("");
          ids = {{0, 0}};
        }
        const TraceEvent& e = t.events[pos];
        v1::KernelEvent* out = b->add_kernels();
        out->set_name(str(e.name));
        out->set_category(str(e.category));
        out->set_ts_ns(e.ts_ns);
        out->set_dur_ns(e.dur_ns);
        out->set_stream(e.stream);
        out->set_correlation(e.correlation);
        out->set_bytes(e.bytes);
        out->set_memory_bw_gbps(e.memory_bw_gbps);
        out->set_step(s.step);
      }
    }
    per_rank[k].back().set_final(true);
  }
  std::vector<v1::Batch> out;
  for (size_t i = 0;; ++i) {
    bool any = false;
    for (auto& list : per_rank) {
      if (i < list.size()) out.push_back(list[i]), any = true;
    }
    if (!any) break;
  }
  return out;
}

void ExpectSameStep(const KernelStepSummary& a, const KernelStepSummary& b) {
  SCOPED_TRACE("rank " + std::to_string(a.rank) + " step " + std::to_string(a.step));
  EXPECT_EQ(a.rank, b.rank);
  EXPECT_EQ(a.step, b.step);
  EXPECT_EQ(a.gpu_ops, b.gpu_ops);
  EXPECT_EQ(a.kernel_ns, b.kernel_ns);
  EXPECT_EQ(a.idle_ns, b.idle_ns);
  EXPECT_EQ(a.compute_ns, b.compute_ns);
  EXPECT_EQ(a.non_compute_ns, b.non_compute_ns);
  EXPECT_EQ(a.comm_ns, b.comm_ns);
  EXPECT_EQ(a.comm_overlap_ns, b.comm_overlap_ns);
  for (int c = 0; c < 3; ++c) EXPECT_EQ(a.idle_us[c], b.idle_us[c]) << c;
  EXPECT_EQ(a.kernel_type_ns, b.kernel_type_ns);
  EXPECT_EQ(a.launches, b.launches);
  EXPECT_EQ(a.short_kernels, b.short_kernels);
  EXPECT_EQ(a.runtime_outliers, b.runtime_outliers);
  EXPECT_EQ(a.launch_delay_outliers, b.launch_delay_outliers);
  EXPECT_EQ(a.delay_p50_us, b.delay_p50_us);
  EXPECT_EQ(a.delay_p99_us, b.delay_p99_us);
  EXPECT_EQ(a.delay_max_us, b.delay_max_us);
}

TEST(KernelAccumulator, StreamedStepsEqualTheOfflineAnalysis) {
  const std::vector<RankTrace> traces = SyntheticJob();
  TimelineOptions topt;  // corrected, per step: what `rankwatch analyze` runs
  const JobTimelines job = BuildTimelines(traces, topt);
  KernelAnalysisOptions aopt;
  std::map<std::pair<uint32_t, int64_t>, KernelStepSummary> expected;
  for (const RankTimeline& w : job.steps)
    expected[{w.rank, w.step}] = SummarizeStep(AnalyzeRank(w, aopt));
  ASSERT_EQ(expected.size(), 6u * 3 + 5);
  // Kernels launched at the end of a step run into the next: the windows overlap in time.
  EXPECT_GT((expected[{0, 1}].comm_ns), 0);

  for (size_t chunk : {size_t{1}, size_t{7}, size_t{1000}}) {
    SCOPED_TRACE("chunk " + std::to_string(chunk));
    KernelAccumulator acc("j", {});
    KernelDelta total;
    for (const v1::Batch& b : ToBatches(traces, chunk)) {
      const KernelDelta d = acc.Add(b);
      total.accepted += d.accepted;
      total.late += d.late;
      total.steps_closed += d.steps_closed;
    }
    EXPECT_EQ(total.late, 0u);
    EXPECT_EQ(total.steps_closed, expected.size());
    const KernelJobSnapshot s = acc.Snapshot();
    ASSERT_EQ(s.ranks.size(), 4u);
    size_t compared = 0;
    for (const RankKernelSummary& r : s.ranks) {
      for (const KernelStepSummary& step : r.recent) {
        ExpectSameStep(step, expected.at({r.rank, step.step}));
        ++compared;
      }
    }
    EXPECT_EQ(compared, expected.size());
  }
}

TEST(KernelAccumulator, ClosesTheOldestOpenStepAndCountsLateAndUnsteppedEvents) {
  KernelAccumulatorOptions o;
  o.open_steps_per_rank = 2;
  KernelAccumulator acc("j", o);
  auto batch = [](std::vector<int64_t> steps, bool final) {
    v1::Batch b;
    b.mutable_source()->set_rank(1);
    b.mutable_source()->set_world_size(2);
    b.add_strings("");
    b.add_strings("k");
    b.add_strings("kernel");
    for (int64_t s : steps) {
      v1::KernelEvent* e = b.add_kernels();
      e->set_name(1);
      e->set_category(2);
      e->set_stream(7);
      e->set_ts_ns(s * 1000);
      e->set_dur_ns(10);
      e->set_step(s);
    }
    b.set_final(final);
    return b;
  };
  EXPECT_EQ(acc.Add(batch({1, 2}, false)).steps_closed, 0u);
  // Step 3 opens a third step; steps close after the batch, so its event of step 1 still counts.
  const KernelDelta d = acc.Add(batch({3, 1, -1}, false));
  EXPECT_EQ(d.steps_closed, 1u);
  EXPECT_EQ(d.accepted, 2u);
  EXPECT_EQ(d.unstepped, 1u);
  EXPECT_EQ(acc.Add(batch({1}, false)).late, 1u);
  EXPECT_EQ(acc.Add(batch({}, true)).steps_closed, 2u);
  const KernelJobSnapshot s = acc.Snapshot();
  ASSERT_EQ(s.ranks.size(), 1u);
  EXPECT_EQ(s.ranks[0].rank, 1u);
  EXPECT_EQ(s.ranks[0].steps, 3u);
  EXPECT_EQ(s.ranks[0].recent[0].gpu_ops, 0u);  // no launch: an op without a step window
  EXPECT_EQ(s.events_late, 1u);
  EXPECT_EQ(s.events_unstepped, 1u);
}

TEST(KernelAccumulator, AHostileBatchIsBoundedInEventsStepsAndNames) {
  KernelAccumulatorOptions o;
  o.max_open_events = 1000;
  o.max_new_steps_per_batch = 8;
  o.max_names_per_rank = 16;
  KernelAccumulator acc("j", o);
  v1::Batch b;
  b.mutable_source()->set_world_size(1);
  b.add_strings("");
  for (int i = 0; i < 100; ++i) b.add_strings("kernel-" + std::to_string(i));
  // 5,000 events, each of another step and name: 8 steps open, the rest is over the limit.
  for (int i = 0; i < 5000; ++i) {
    v1::KernelEvent* e = b.add_kernels();
    e->set_step(i);
    e->set_name(1 + i % 100);
    e->set_stream(7);
    e->set_dur_ns(10);
  }
  KernelDelta d = acc.Add(b);
  EXPECT_EQ(d.accepted, 8u);
  EXPECT_EQ(d.over_limit, 4992u);
  EXPECT_EQ(d.steps_closed, 6u);  // all but open_steps_per_rank
  // 5,000 events of one step: held up to max_open_events over the job.
  b.clear_kernels();
  for (int i = 0; i < 5000; ++i) {
    v1::KernelEvent* e = b.add_kernels();
    e->set_step(10'000);
    e->set_name(1 + i % 100);
    e->set_stream(7);
    e->set_dur_ns(10);
  }
  d = acc.Add(b);
  EXPECT_EQ(d.accepted, 1000u - 2);  // the two steps still open hold one event each
  EXPECT_EQ(d.over_limit, 5000u - 998);
  b.clear_kernels();
  b.set_final(true);
  EXPECT_EQ(acc.Add(b).steps_closed, 2u);
  // Closed steps free their events.
  b.set_final(false);
  b.add_kernels()->set_step(20'000);
  EXPECT_EQ(acc.Add(b).accepted, 1u);
  EXPECT_EQ(acc.Snapshot().events_over_limit, 4992u + 4002u);
}

TEST(KernelAccumulator, TheEndOfATraceFileClosesItsStepsAndTheRankGoesOn) {
  KernelAccumulator acc("j", {});
  auto batch = [](int64_t step, bool end_of_file) {
    v1::Batch b;
    b.mutable_source()->set_rank(0);
    b.mutable_source()->set_world_size(1);
    b.add_strings("");
    b.add_strings("k");
    b.add_strings("kernel");
    v1::KernelEvent* e = b.add_kernels();
    e->set_name(1);
    e->set_category(2);
    e->set_stream(7);
    e->set_ts_ns(step * 1000);
    e->set_dur_ns(10);
    e->set_step(step);
    b.mutable_trace()->set_end_of_file(end_of_file);
    return b;
  };
  EXPECT_EQ(acc.Add(batch(5, false)).steps_closed, 0u);
  EXPECT_EQ(acc.Add(batch(6, true)).steps_closed, 2u);  // the file ended: steps 5 and 6
  // A later file of the same rank: its steps open and close the same way.
  EXPECT_EQ(acc.Add(batch(9, true)).steps_closed, 1u);
  EXPECT_EQ(acc.Snapshot().ranks[0].steps, 3u);
  EXPECT_EQ(acc.Snapshot().events_late, 0u);
}

KernelStepSummary Step(uint32_t rank, int64_t kernel, int64_t idle, int64_t comm) {
  KernelStepSummary s;
  s.rank = rank;
  s.step = 1;
  s.kernel_ns = kernel;
  s.idle_ns = idle;
  s.compute_ns = kernel - idle - comm / 2;
  s.non_compute_ns = comm / 2;
  s.comm_ns = comm;
  s.comm_overlap_ns = comm / 4;
  return s;
}

KernelJobSnapshot Job(const std::vector<KernelStepSummary>& steps) {
  KernelJobSnapshot j;
  for (const KernelStepSummary& s : steps) {
    RankKernelSummary& r = j.ranks.emplace_back();
    r.rank = s.rank;
    r.recent = {s};
  }
  SummarizeJob({}, &j);
  return j;
}

TEST(SummarizeJob, NamesTheRankWhoseIdleOrCommunicationShareStandsApart) {
  // Idle shares 0.20, 0.22, 0.21, 0.19, 0.60: rank 4 is 0.39 above the median (0.21).
  auto j = Job({Step(0, 1000, 200, 300), Step(1, 1000, 220, 310), Step(2, 1000, 210, 290),
                Step(3, 1000, 190, 305), Step(4, 1000, 600, 300)});
  ASSERT_EQ(j.outliers.size(), 1u);
  EXPECT_EQ(j.outliers[0].rank, 4u);
  EXPECT_EQ(j.outliers[0].signal, "idle");
  EXPECT_DOUBLE_EQ(j.outliers[0].median, 0.21);
  EXPECT_NEAR(j.gpu_idle_ratio, (200 + 220 + 210 + 190 + 600) / 5000.0, 1e-12);
  EXPECT_NEAR(j.overlap_median, 0.25, 0.002);

  // Communication: rank 1 has 0.05 vs ~0.30.
  j = Job({Step(0, 1000, 200, 300), Step(1, 1000, 200, 50), Step(2, 1000, 200, 310),
           Step(3, 1000, 200, 290)});
  ASSERT_EQ(j.outliers.size(), 1u);
  EXPECT_EQ(j.outliers[0].rank, 1u);
  EXPECT_EQ(j.outliers[0].signal, "communication");

  // Spread but no rank apart (each within 10 points of the median), and two ranks: none.
  EXPECT_TRUE(Job({Step(0, 1000, 200, 300), Step(1, 1000, 280, 300), Step(2, 1000, 250, 300)})
                  .outliers.empty());
  EXPECT_TRUE(Job({Step(0, 1000, 100, 300), Step(1, 1000, 900, 300)}).outliers.empty());
  // Large differences everywhere (no typical rank): 3 MADs are not reached.
  EXPECT_TRUE(Job({Step(0, 1000, 100, 300), Step(1, 1000, 400, 300), Step(2, 1000, 700, 300),
                   Step(3, 1000, 900, 300)})
                  .outliers.empty());
}

}  // namespace
}  // namespace rankwatch::kernel
