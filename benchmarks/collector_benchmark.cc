// Cost on the training thread of recording one step with all its phases (issue #7: p99 <= 1 us),
// and of recording one op (issue #34).
// BeginStep, five AddPhase calls (dataloader, forward, backward, collective, optimizer), a
// memory peak and EndStep, into a real Collector whose sender thread drains the ring and
// produces to an unreachable broker (so nothing is delivered, as when Kafka is down: the
// worst case for the buffers). Each iteration is timed alone with the monotonic clock and the
// p50 / p99 / p99.9 of those times are reported as counters (ns), next to Google Benchmark's
// mean.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <vector>

#include "collectors/lib/collector.h"

namespace rankwatch {
namespace {

void BM_RecordStepWithAllPhases(benchmark::State& state) {
  CollectorIdentity id;
  id.training_job = "bench";
  id.world_size = 1;
  CollectorOptions o;
  o.brokers = "127.0.0.1:1";  // nothing listens: the producer keeps retrying, as in an outage
  o.properties = {{"log_level", "0"}};
  auto c = Collector::Create(id, o);
  if (!c.ok()) {
    state.SkipWithError(std::string(c.status().message()).c_str());
    return;
  }
  Collector& collector = **c;
  std::vector<uint64_t> ns;
  ns.reserve(1 << 22);
  uint64_t step = 0;
  for (auto _ : state) {
    const uint64_t t0 = Collector::NowNs();
    collector.BeginStep(step++, t0);
    collector.AddPhase(StepPhase::kDataloader, t0 - 2000, t0 - 1000);
    collector.AddPhase(StepPhase::kForward, t0, t0 + 3000);
    collector.AddPhase(StepPhase::kBackward, t0 + 3000, t0 + 9000);
    collector.AddPhase(StepPhase::kCollective, t0 + 7000, t0 + 9000);
    collector.AddPhase(StepPhase::kOptimizer, t0 + 9000, t0 + 10000);
    collector.RecordMemory(1 << 30, 2u << 30, 80ull << 30);
    collector.EndStep(t0 + 11000);
    const uint64_t t1 = Collector::NowNs();
    if (ns.size() < ns.capacity()) ns.push_back(t1 - t0);
  }
  std::sort(ns.begin(), ns.end());
  auto pct = [&ns](double p) {
    return ns.empty() ? 0.0 : static_cast<double>(ns[static_cast<size_t>(p * (ns.size() - 1))]);
  };
  state.counters["p50_ns"] = pct(0.50);
  state.counters["p99_ns"] = pct(0.99);
  state.counters["p999_ns"] = pct(0.999);
  state.counters["max_ns"] = ns.empty() ? 0 : static_cast<double>(ns.back());
  state.counters["dropped"] = static_cast<double>(collector.stats().records_dropped);
  (void)collector.Close(false, std::chrono::milliseconds(100));
}
BENCHMARK(BM_RecordStepWithAllPhases)->Iterations(1'000'000)->Unit(benchmark::kNanosecond);

// Cost on the recording thread of one op (Collector::AddOp: a per-step counter and a push into
// the op ring), in steps of 54 ops (a 1F1B step of 8 microbatches) whose records the sender
// writes, ops included; broker unreachable as above. Each AddOp is timed alone.
void BM_RecordOp(benchmark::State& state) {
  CollectorIdentity id;
  id.training_job = "bench";
  id.world_size = 1;
  CollectorOptions o;
  o.brokers = "127.0.0.1:1";
  o.properties = {{"log_level", "0"}};
  auto c = Collector::Create(id, o);
  if (!c.ok()) {
    state.SkipWithError(std::string(c.status().message()).c_str());
    return;
  }
  Collector& collector = **c;
  std::vector<uint64_t> ns;
  ns.reserve(1 << 22);
  uint64_t step = 0, ops = 0;
  collector.BeginStep(step++, Collector::NowNs());
  for (auto _ : state) {
    const uint64_t t0 = Collector::NowNs();
    collector.AddOp(v1::OP_FORWARD_COMPUTE, static_cast<uint32_t>(ops % 8), 0, t0 - 5000, t0);
    const uint64_t t1 = Collector::NowNs();
    if (ns.size() < ns.capacity()) ns.push_back(t1 - t0);
    if (++ops % 54 == 0) {
      collector.EndStep(t1);
      collector.BeginStep(step++, t1);
    }
  }
  std::sort(ns.begin(), ns.end());
  auto pct = [&ns](double p) {
    return ns.empty() ? 0.0 : static_cast<double>(ns[static_cast<size_t>(p * (ns.size() - 1))]);
  };
  state.counters["p50_ns"] = pct(0.50);
  state.counters["p99_ns"] = pct(0.99);
  state.counters["p999_ns"] = pct(0.999);
  state.counters["ops_dropped"] = static_cast<double>(collector.stats().ops_dropped);
  (void)collector.Close(false, std::chrono::milliseconds(100));
}
BENCHMARK(BM_RecordOp)->Iterations(2'000'000)->Unit(benchmark::kNanosecond);

// The clock reads alone (two per step above), as the baseline.
void BM_ClockPair(benchmark::State& state) {
  for (auto _ : state) {
    const uint64_t t0 = Collector::NowNs();
    benchmark::DoNotOptimize(Collector::NowNs() - t0);
  }
}
BENCHMARK(BM_ClockPair);

}  // namespace
}  // namespace rankwatch

BENCHMARK_MAIN();
