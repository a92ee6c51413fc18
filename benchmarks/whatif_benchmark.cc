// Cost of the what-if analysis (operators/whatif): one aligned step added and the window's
// result re-evaluated (S, its decompositions by data rank, stage, op group and worker, M_W,
// M_S), the daemon's work per step of a job, on one core:
//   - a synthetic 16,384-rank job: DP 64 x PP 16 x TP 16 (1,024 workers), 8 microbatches in
//     1F1B, a 64-step window, one worker 2x slower in compute (so the decompositions run);
//   - the study's two jobs in the repository (tests/fixtures/whatif-stragglers), end to end:
//     every step added to a fresh analyzer and the window evaluated once (trace reading apart).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "operators/whatif/whatif.h"
#include "traces/whatif_chrome_trace.h"

namespace rankwatch::whatif {
namespace {

// One step of a DP x PP job in 1F1B: each data rank's pipeline timed op by op (a compute
// starts after the previous compute of its stage and, for a forward, the previous stage's
// forward of its microbatch plus the send; for a backward, the next stage's backward), then
// layernorm, the embedding all-reduce of the first and last stage, a reduce-scatter per stage
// synced over the data ranks, clip over every worker, the optimizer.
class OneFOneBJob {
 public:
  OneFOneBJob(uint32_t dp, uint32_t pp, uint32_t microbatches, uint32_t slow_worker)
      : dp_(dp), pp_(pp), mb_(microbatches), slow_(slow_worker) {}

  StepOps Make(uint64_t step) {
    std::mt19937_64 rng(step * 7919 + 1);
    std::normal_distribution<double> noise(1.0, 0.03);
    const double kLat = 150;  // µs, a send/receive after the later side is ready
    StepOps out;
    out.step = step;
    out.workers.assign(size_t{dp_} * pp_, {});
    out_ = &out.workers;
    stage_end_.assign(size_t{dp_} * pp_, 0);
    std::vector<double> f_end(size_t{pp_} * mb_), b_end(size_t{pp_} * mb_);
    std::vector<double> last_end(pp_);  // per stage: end of the stage's last compute
    for (uint32_t d = 0; d < dp_; ++d) {
      // Each stage's compute order.
      std::vector<std::vector<std::pair<bool, uint32_t>>> order(pp_);
      for (uint32_t s = 0; s < pp_; ++s) {
        const uint32_t warm = std::min(pp_ - s - 1, mb_);
        for (uint32_t i = 0; i < warm; ++i) order[s].push_back({true, i});
        for (uint32_t i = 0; i < mb_ - warm; ++i) {
          order[s].push_back({true, warm + i});
          order[s].push_back({false, i});
        }
        for (uint32_t i = mb_ - warm; i < mb_; ++i) order[s].push_back({false, i});
      }
      std::fill(f_end.begin(), f_end.end(), -1);
      std::fill(b_end.begin(), b_end.end(), -1);
      std::vector<size_t> next(pp_, 0);
      std::vector<double> free_at(pp_, 0);
      std::vector<double> fwd_prev_end(pp_, 0), bwd_prev_end(pp_, 0);
      // Params all-gather first on every stage.
      for (uint32_t s = 0; s < pp_; ++s) {
        const double g = 800 * noise(rng);
        Add(d, s, OpKind::kParamsAllGather, 0, 0, g);
        free_at[s] = g;
      }
      for (bool progress = true; progress;) {
        progress = false;
        for (uint32_t s = 0; s < pp_; ++s) {
          if (next[s] == order[s].size()) continue;
          const auto [forward, i] = order[s][next[s]];
          const size_t at = size_t{s} * mb_ + i;
          double ready = free_at[s];
          if (forward && s > 0) {
            if (f_end[at - mb_] < 0) continue;
            ready = std::max(ready, f_end[at - mb_] + kLat);
            // The receive, posted after this stage's previous forward.
            Add(d, s, OpKind::kForwardRecv, i, fwd_prev_end[s], f_end[at - mb_] + kLat);
          }
          if (!forward && s + 1 < pp_) {
            if (b_end[at + mb_] < 0) continue;
            ready = std::max(ready, b_end[at + mb_] + kLat);
            Add(d, s, OpKind::kBackwardRecv, i, bwd_prev_end[s], b_end[at + mb_] + kLat);
          }
          const bool slow = s * dp_ + d == slow_;
          const double dur = (forward ? 10'000 : 20'000) * noise(rng) * (slow ? 2.0 : 1.0);
          Add(d, s, forward ? OpKind::kForwardCompute : OpKind::kBackwardCompute, i, ready,
              ready + dur);
          const double end = ready + dur;
          (forward ? f_end : b_end)[at] = end;
          (forward ? fwd_prev_end : bwd_prev_end)[s] = end;
          if (forward && s + 1 < pp_) Add(d, s, OpKind::kForwardSend, i, end, end + kLat);
          if (!forward && s > 0) Add(d, s, OpKind::kBackwardSend, i, end, end + kLat);
          free_at[s] = end;
          ++next[s];
          progress = true;
        }
      }
      for (uint32_t s = 0; s < pp_; ++s) last_end[s] = free_at[s];
      // Layernorm and the embedding all-reduce of this replica.
      double emb_start = 0;
      for (uint32_t s = 0; s < pp_; ++s) {
        Add(d, s, OpKind::kLayernormGradsAllReduce, 0, last_end[s], last_end[s] + 40);
        last_end[s] += 40;
        if (s == 0 || s + 1 == pp_) emb_start = std::max(emb_start, last_end[s]);
      }
      for (uint32_t s : {0u, pp_ - 1}) {
        Add(d, s, OpKind::kEmbeddingGradsAllReduce, 0, last_end[s], emb_start + 900);
        last_end[s] = emb_start + 900;
        if (pp_ == 1) break;
      }
      for (uint32_t s = 0; s < pp_; ++s) stage_end_[s * dp_ + d] = last_end[s];
    }
    // Reduce-scatter synced over a stage's data ranks, clip over every worker, optimizer.
    double clip_start = 0;
    for (uint32_t s = 0; s < pp_; ++s) {
      double start = 0;
      for (uint32_t d = 0; d < dp_; ++d) start = std::max(start, stage_end_[s * dp_ + d]);
      for (uint32_t d = 0; d < dp_; ++d) {
        Add(d, s, OpKind::kGradsReduceScatter, 0, stage_end_[s * dp_ + d], start + 3000);
      }
      clip_start = std::max(clip_start, start + 3000);
    }
    for (uint32_t w = 0; w < dp_ * pp_; ++w) {
      Add(w % dp_, w / dp_, OpKind::kOptimizerClipMainGrad, 0, clip_start, clip_start + 300);
      Add(w % dp_, w / dp_, OpKind::kOptimizer, 0, clip_start + 300, clip_start + 900);
    }
    for (auto& ops : out.workers) {
      std::stable_sort(ops.begin(), ops.end(),
                       [](const Op& a, const Op& b) { return a.start_us < b.start_us; });
    }
    out_ = nullptr;
    return out;
  }

  Layout layout() const { return Layout{dp_, pp_, 16, 1}; }

 private:
  void Add(uint32_t d, uint32_t s, OpKind kind, uint32_t mb, double start, double end) {
    (*out_)[size_t{s} * dp_ + d].push_back(
        Op{kind, static_cast<uint16_t>(mb), 0, start, std::max(0.0, end - start)});
  }

  uint32_t dp_, pp_, mb_, slow_;
  std::vector<std::vector<Op>>* out_ = nullptr;  // the step being made
  std::vector<double> stage_end_;                // per worker: end of its last op so far
};

// range(0): the window's steps; range(1): 1 = decompositions re-simulated for every step
// whenever called (recompute_tolerance 0), 0 = the default 1 % tolerance.
void BM_WhatifStep16kRanks(benchmark::State& state) {
  OneFOneBJob job(64, 16, 8, /*slow_worker=*/5 * 64 + 3);
  Options o;
  o.window_steps = static_cast<uint32_t>(state.range(0));
  if (state.range(1) == 1) o.recompute_tolerance = 0;
  Analyzer analyzer(job.layout(), o);
  std::vector<StepOps> steps;
  for (uint64_t s = 0; s < 16; ++s) steps.push_back(job.Make(s));
  uint64_t next = 0;
  for (; next < o.window_steps; ++next) {
    StepOps step = steps[next % steps.size()];
    step.step = next;
    if (!analyzer.AddStep(std::move(step)).ok()) state.SkipWithError("step rejected");
  }
  WindowResult r = analyzer.Window();
  if (r.m_w_workers.empty() || r.m_w_workers[0] != 5 * 64 + 3) {
    state.SkipWithError("the slow worker is not the top worker");
  }
  for (auto _ : state) {
    StepOps step = steps[next % steps.size()];
    step.step = next++;
    if (!analyzer.AddStep(std::move(step)).ok()) state.SkipWithError("step rejected");
    r = analyzer.Window();
    benchmark::DoNotOptimize(r);
  }
  state.counters["S"] = r.slowdown;
  state.counters["M_W"] = r.m_w;
  state.counters["ops_per_step"] = [&] {
    double n = 0;
    for (const auto& w : steps[0].workers) n += static_cast<double>(w.size());
    return n;
  }();
}
BENCHMARK(BM_WhatifStep16kRanks)
    ->Args({64, 0})
    ->Args({64, 1})
    ->Args({8, 1})
    ->Unit(benchmark::kMillisecond);

// The study's jobs: every step into a fresh analyzer (window = the whole trace), then Window().
void BM_WhatifFixture(benchmark::State& state, const std::string& job) {
  auto trace = ReadWhatifChromeTrace(std::string(RANKWATCH_FIXTURES) + "/whatif-stragglers/" + job);
  if (!trace.ok()) {
    state.SkipWithError(std::string(trace.status().message()).c_str());
    return;
  }
  WindowResult r;
  for (auto _ : state) {
    Options o;
    o.window_steps = static_cast<uint32_t>(trace->steps.size());
    Analyzer analyzer(trace->layout, o);
    for (const StepOps& step : trace->steps) {
      if (!analyzer.AddStep(step).ok()) state.SkipWithError("step rejected");
    }
    r = analyzer.Window();
    benchmark::DoNotOptimize(r);
  }
  state.counters["S"] = r.slowdown;
  state.counters["steps"] = r.steps;
}
BENCHMARK_CAPTURE(BM_WhatifFixture, AR, std::string("AR"))->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_WhatifFixture, ST, std::string("ST"))->Unit(benchmark::kMillisecond);

// Reading a trace (gunzip, JSON, sorting into steps), for scale.
void BM_WhatifReadTrace(benchmark::State& state, const std::string& job) {
  for (auto _ : state) {
    auto trace =
        ReadWhatifChromeTrace(std::string(RANKWATCH_FIXTURES) + "/whatif-stragglers/" + job);
    if (!trace.ok()) state.SkipWithError("read failed");
    benchmark::DoNotOptimize(trace);
  }
}
BENCHMARK_CAPTURE(BM_WhatifReadTrace, AR, std::string("AR"))->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace rankwatch::whatif

BENCHMARK_MAIN();
