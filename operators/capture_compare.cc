#include "operators/capture_compare.h"

#include <algorithm>
#include <set>
#include <string_view>

namespace rankwatch {
namespace {

bool StartsWith(std::string_view s, std::string_view prefix) {
  return s.substr(0, prefix.size()) == prefix;
}

bool Contains(std::string_view s, std::string_view part) {
  return s.find(part) != std::string_view::npos;
}

// An event while its thread's events are nested.
struct Open {
  size_t index;  // into the sorted events
  int64_t end_ns;
  CapturePhase phase;
};

}  // namespace

const char* CapturePhaseName(CapturePhase phase) {
  switch (phase) {
    case CapturePhase::kOther: return "other";
    case CapturePhase::kDataloader: return "dataloader";
    case CapturePhase::kForward: return "forward";
    case CapturePhase::kBackward: return "backward";
    case CapturePhase::kOptimizer: return "optimizer";
    case CapturePhase::kCollective: return "collective";
  }
  return "other";
}

CapturePhase PhaseOfRangeName(const std::string& name) {
  const std::string_view n = name;
  // Collectives first: a gloo/NCCL call inside backward (DDP's bucket allreduce) is collective.
  if (StartsWith(n, "c10d::") || StartsWith(n, "gloo:") || StartsWith(n, "nccl:") ||
      Contains(n, "ncclDevKernel") || Contains(n, "ncclKernel") || Contains(n, "allreduce") ||
      Contains(n, "all_reduce") || Contains(n, "allgather") || Contains(n, "all_gather") ||
      Contains(n, "reduce_scatter") || Contains(n, "broadcast_") || n == "barrier") {
    return CapturePhase::kCollective;
  }
  if (StartsWith(n, "enumerate(DataLoader)")) return CapturePhase::kDataloader;
  if (StartsWith(n, "autograd::engine::evaluate_function") || Contains(n, "Backward0") ||
      Contains(n, "Backward1") || StartsWith(n, "torch::autograd::AccumulateGrad")) {
    return CapturePhase::kBackward;
  }
  if (StartsWith(n, "Optimizer.step#") || StartsWith(n, "Optimizer.zero_grad#")) {
    return CapturePhase::kOptimizer;
  }
  if (StartsWith(n, "DistributedDataParallel.forward") ||
      StartsWith(n, "FullyShardedDataParallel.forward") || StartsWith(n, "nn.Module:")) {
    return CapturePhase::kForward;
  }
  return CapturePhase::kOther;
}

CaptureProfile BuildCaptureProfile(std::vector<CapturedEvent> events) {
  CaptureProfile p;
  events.erase(std::remove_if(events.begin(), events.end(),
                              [](const CapturedEvent& e) { return e.step < 0 || e.dur_ns < 0; }),
               events.end());
  // Per thread by start; a longer event first at equal starts, so that it is the parent.
  std::sort(events.begin(), events.end(), [](const CapturedEvent& a, const CapturedEvent& b) {
    if (a.tid != b.tid) return a.tid < b.tid;
    if (a.ts_ns != b.ts_ns) return a.ts_ns < b.ts_ns;
    return a.dur_ns > b.dur_ns;
  });
  std::vector<double> self(events.size());
  std::vector<CapturePhase> phase(events.size(), CapturePhase::kOther);
  std::vector<Open> stack;
  std::set<int64_t> steps;
  for (size_t i = 0; i < events.size(); ++i) {
    const CapturedEvent& e = events[i];
    if (i > 0 && events[i - 1].tid != e.tid) stack.clear();
    const int64_t end = e.ts_ns + e.dur_ns;
    // Ends before this one starts, or does not hold it whole: not its parent.
    while (!stack.empty() && (stack.back().end_ns <= e.ts_ns || stack.back().end_ns < end)) {
      stack.pop_back();
    }
    self[i] = static_cast<double>(e.dur_ns);
    CapturePhase own = PhaseOfRangeName(e.name);
    if (!stack.empty()) {
      self[stack.back().index] -= static_cast<double>(e.dur_ns);
      // A collective keeps its own phase; anything else takes its parent's when it has one.
      if (own != CapturePhase::kCollective && stack.back().phase != CapturePhase::kOther) {
        own = stack.back().phase;
      }
    }
    phase[i] = own;
    stack.push_back({i, end, own});
    steps.insert(e.step);
  }
  for (size_t i = 0; i < events.size(); ++i) {
    OpTotals& t = p.ops[{events[i].name, phase[i]}];
    const double s = std::max(0.0, self[i]);
    t.self_ns += s;
    t.total_ns += static_cast<double>(events[i].dur_ns);
    ++t.calls;
    p.self_ns += s;
  }
  p.steps = static_cast<uint32_t>(steps.size());
  p.events = events.size();
  return p;
}

std::vector<OpComparison> CompareCaptures(const CaptureProfile& culprit,
                                          const CaptureProfile& reference, size_t limit) {
  std::vector<OpComparison> rows;
  if (culprit.steps == 0 || reference.steps == 0) return rows;
  auto add = [&](const OpKey& key, const OpTotals* c, const OpTotals* r) {
    OpComparison row;
    row.name = key.first;
    row.phase = key.second;
    if (c != nullptr) {
      row.culprit_seconds_per_step = c->self_ns * 1e-9 / culprit.steps;
      row.culprit_calls_per_step = static_cast<double>(c->calls) / culprit.steps;
    }
    if (r != nullptr) {
      row.reference_seconds_per_step = r->self_ns * 1e-9 / reference.steps;
      row.reference_calls_per_step = static_cast<double>(r->calls) / reference.steps;
    }
    row.excess_seconds_per_step = row.culprit_seconds_per_step - row.reference_seconds_per_step;
    rows.push_back(std::move(row));
  };
  for (const auto& [key, c] : culprit.ops) {
    auto it = reference.ops.find(key);
    add(key, &c, it == reference.ops.end() ? nullptr : &it->second);
  }
  for (const auto& [key, r] : reference.ops) {
    if (culprit.ops.count(key) == 0) add(key, nullptr, &r);
  }
  std::sort(rows.begin(), rows.end(), [](const OpComparison& a, const OpComparison& b) {
    // A collective's self time is mostly waiting for the peers: after the rank's own work.
    const bool ca = a.phase == CapturePhase::kCollective, cb = b.phase == CapturePhase::kCollective;
    if (ca != cb) return cb;
    if (a.excess_seconds_per_step != b.excess_seconds_per_step) {
      return a.excess_seconds_per_step > b.excess_seconds_per_step;
    }
    return a.name != b.name ? a.name < b.name : a.phase < b.phase;
  });
  if (rows.size() > limit) rows.resize(limit);
  return rows;
}

}  // namespace rankwatch
