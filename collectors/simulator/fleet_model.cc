#include "collectors/simulator/fleet_model.h"

#include <algorithm>
#include <cmath>

namespace rankwatch {
namespace {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

constexpr double kMiB = 1024.0 * 1024.0;

}  // namespace

absl::Status CheckFleetOptions(const FleetOptions& o) {
  auto bad = [](const FaultSpec& f, const std::string& why) {
    return absl::InvalidArgumentError("fault " + std::string(FaultKindName(f.kind)) + ": " + why);
  };
  if (o.parallel.has_value()) {
    const PipelineSpec& p = *o.parallel;
    if (o.ranks != p.world_size()) {
      return absl::InvalidArgumentError("--ranks " + std::to_string(o.ranks) +
                                        " is not the layout's world size " +
                                        std::to_string(p.world_size()) + " (dp x pp x tp)");
    }
    if (o.sync != FleetOptions::Sync::kDdp) {
      return absl::InvalidArgumentError("--parallel needs --sync ddp");
    }
  }
  for (const FaultSpec& f : o.faults) {
    if (f.target.kind == FaultTarget::Kind::kRank && f.target.index >= o.ranks) {
      return bad(f, "targets rank " + std::to_string(f.target.index) + " of " +
                        std::to_string(o.ranks) + " ranks");
    }
    switch (f.kind) {
      case FaultKind::kSlowInput:
      case FaultKind::kInputBound:
      case FaultKind::kWait:
      case FaultKind::kSlowHost:
        if (o.parallel.has_value()) return bad(f, "is not modelled with --parallel");
        break;
      case FaultKind::kSlowWorker:
      case FaultKind::kStageImbalance:
      case FaultKind::kSequenceImbalance:
        if (!o.parallel.has_value()) return bad(f, "needs --parallel");
        if (f.kind != FaultKind::kSequenceImbalance && f.stage >= o.parallel->pp) {
          return bad(f, "stage " + std::to_string(f.stage) + " of " +
                            std::to_string(o.parallel->pp) + " stages");
        }
        if (f.kind == FaultKind::kSlowWorker && f.dp >= o.parallel->dp) {
          return bad(f, "data-parallel rank " + std::to_string(f.dp) + " of " +
                            std::to_string(o.parallel->dp));
        }
        break;
      default: break;
    }
  }
  return absl::OkStatus();
}

FleetModel::FleetModel(FleetOptions options)
    : options_(std::move(options)), rank_elapsed_ns_(options_.ranks, 0) {}

std::string FleetModel::NodeName(uint32_t rank) const {
  return "node-" + std::to_string(NodeOf(rank));
}

double FleetModel::Jitter(uint32_t rank, uint64_t step, uint32_t salt) const {
  uint64_t h = SplitMix64(options_.seed ^ SplitMix64((uint64_t{rank} << 32) ^ salt) ^
                          SplitMix64(step * 0x2545f4914f6cdd1dull));
  const double u = static_cast<double>(h >> 11) * 0x1.0p-53 * 2.0 - 1.0;  // [-1, 1)
  return 1.0 + options_.jitter * u;
}

bool FleetModel::Targets(const FaultSpec& f, uint32_t rank, uint64_t step) const {
  if (step < f.from_step || step >= f.until_step) return false;
  switch (f.target.kind) {
    case FaultTarget::Kind::kAll: return true;
    case FaultTarget::Kind::kRank: return f.target.index == rank;
    case FaultTarget::Kind::kNode: return f.target.index == NodeOf(rank);
  }
  return false;
}

bool FleetModel::Hangs(uint32_t rank, uint64_t step) const {
  for (const FaultSpec& f : options_.faults) {
    if (f.kind != FaultKind::kHang) continue;
    if (options_.sync == FleetOptions::Sync::kDdp) {
      // A hung rank blocks every other rank at that step's collective.
      for (uint32_t r = 0; r < options_.ranks; ++r) {
        if (Targets(f, r, step)) return true;
      }
    } else if (Targets(f, rank, step)) {
      return true;
    }
  }
  return false;
}

FleetModel::Local FleetModel::LocalPhases(uint32_t rank, uint64_t step) const {
  const double s = options_.step_ms * 1e6;  // ns
  Local l{s * PhaseShares::kDataloader * Jitter(rank, step, 1),
          s * PhaseShares::kForward * Jitter(rank, step, 2),
          s * PhaseShares::kBackward * Jitter(rank, step, 3),
          s * PhaseShares::kOptimizer * Jitter(rank, step, 4),
          s * PhaseShares::kWait * Jitter(rank, step, 5),
          0.0};
  for (const FaultSpec& f : options_.faults) {
    if (!Targets(f, rank, step)) continue;
    switch (f.kind) {
      case FaultKind::kSlowCompute:
        l.forward *= 1 + f.magnitude;
        l.backward *= 1 + f.magnitude;
        break;
      case FaultKind::kSlowInput: l.dataloader *= 1 + f.magnitude; break;
      case FaultKind::kInputBound:
        l.dataloader = f.magnitude * (l.forward + l.backward + l.optimizer);
        break;
      case FaultKind::kWait: l.wait += f.magnitude * s; break;
      // Host code between phases: in the rank's step time and in none of its phases. Under DDP
      // it delays the rank's allreduce, so the other ranks absorb it in backward (Step).
      case FaultKind::kSlowHost: l.outside += f.magnitude * s; break;
      // A GC pause in Python code: forward, where the autograd graph is built, holds it.
      case FaultKind::kGc:
        if ((step - f.from_step) % f.every == 0) l.forward += f.magnitude * 1e6;
        break;
      default: break;
    }
  }
  return l;
}

void FleetModel::FillMemory(uint32_t rank, uint64_t step, v1::StepRecord* r) const {
  const double capacity = static_cast<double>(options_.device_capacity_bytes);
  // Memory varies far less than time: +-1% around the base peak.
  double allocated =
      static_cast<double>(options_.base_peak_bytes) * (1.0 + (Jitter(rank, step, 6) - 1.0) * 0.2);
  for (const FaultSpec& f : options_.faults) {
    if (!Targets(f, rank, step)) continue;
    switch (f.kind) {
      case FaultKind::kMemoryLeak:
        allocated += f.magnitude * kMiB * static_cast<double>(step - f.from_step + 1);
        break;
      case FaultKind::kMemoryImbalance: allocated *= 1 + f.magnitude; break;
      case FaultKind::kMemoryPressure: allocated = f.magnitude * capacity; break;
      default: break;
    }
  }
  allocated = std::min(allocated, capacity);
  const double reserved = std::min(capacity, allocated * 1.04);
  r->set_peak_allocated_bytes(static_cast<uint64_t>(allocated));
  r->set_peak_reserved_bytes(static_cast<uint64_t>(reserved));
  r->set_device_capacity_bytes(options_.device_capacity_bytes);
}

void FleetModel::GcPauses(uint32_t rank, uint64_t step, double* ns, uint32_t* count) const {
  *ns = 0;
  *count = 0;
  for (const FaultSpec& f : options_.faults) {
    if (f.kind != FaultKind::kGc || !Targets(f, rank, step)) continue;
    if ((step - f.from_step) % f.every != 0) continue;
    *ns += f.magnitude * 1e6;
    ++*count;
  }
}

void FleetModel::Step(uint64_t step, std::vector<v1::StepRecord>* records,
                      std::vector<bool>* reported) {
  if (options_.parallel.has_value()) {
    PipelineStep(step, records, reported);
    return;
  }
  const uint32_t n = options_.ranks;
  const bool watches_gc = std::any_of(options_.faults.begin(), options_.faults.end(),
                                      [](const FaultSpec& f) { return f.kind == FaultKind::kGc; });
  records->resize(n);
  reported->assign(n, false);
  scratch_.resize(n);
  double slowest = 0;
  for (uint32_t r = 0; r < n; ++r) {
    if (Hangs(r, step)) continue;
    scratch_[r] = LocalPhases(r, step);
    slowest = std::max(slowest, scratch_[r].total());
  }
  const bool ddp = options_.sync == FleetOptions::Sync::kDdp;
  const double allreduce = options_.step_ms * 1e6 * PhaseShares::kAllreduce;
  int64_t job_step_ns = 0;
  for (uint32_t r = 0; r < n; ++r) {
    if (Hangs(r, step)) continue;
    (*reported)[r] = true;
    const Local& l = scratch_[r];
    // Under DDP every rank leaves the step with the slowest one; the difference is time
    // blocked in backward's allreduce. The slowest rank's own excess (slow compute, or
    // slow-host time outside every phase) stays where it is: only its step time holds the
    // latter.
    const double absorbed = ddp ? slowest - l.total() : 0.0;
    const double step_time = l.total() + absorbed;
    v1::StepRecord& rec = (*records)[r];
    rec.Clear();
    rec.set_step(step);
    rec.set_dataloader_ns(static_cast<uint64_t>(l.dataloader));
    rec.set_forward_ns(static_cast<uint64_t>(l.forward));
    rec.set_backward_ns(static_cast<uint64_t>(l.backward + absorbed));
    rec.set_optimizer_ns(static_cast<uint64_t>(l.optimizer));
    rec.set_step_time_ns(static_cast<uint64_t>(std::llround(step_time)));
    if (options_.report_collective) {
      rec.set_collective_ns(static_cast<uint64_t>(ddp ? allreduce + absorbed : 0.0));
    }
    if (watches_gc) {
      double gc_ns = 0;
      uint32_t gc_count = 0;
      GcPauses(r, step, &gc_ns, &gc_count);
      rec.set_gc_ns(static_cast<uint64_t>(gc_ns));
      rec.set_gc_count(gc_count);
    }
    FillMemory(r, step, &rec);
    rank_elapsed_ns_[r] += static_cast<int64_t>(step_time);
    rec.set_end_unix_ns(job_start_unix_ns_ + rank_elapsed_ns_[r]);
    job_step_ns = std::max<int64_t>(job_step_ns, static_cast<int64_t>(step_time));
  }
  // A step nobody finished (a hang) still takes wall time in a real-time simulation.
  if (job_step_ns == 0) job_step_ns = static_cast<int64_t>(options_.step_ms * 1e6);
  job_elapsed_ns_ += job_step_ns;
}

}  // namespace rankwatch
