// FleetModel's data x pipeline x tensor parallel steps (FleetOptions::parallel): op costs with
// the faults and the noise, one pipeline step simulated per worker (pipeline_schedule.h), and
// each rank's record built from its worker's ops.
#include <algorithm>
#include <cmath>

#include "collectors/simulator/fleet_model.h"

namespace rankwatch {
namespace {

uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Salts of the random draws, so that no two draws share their keys.
enum Salt : uint64_t {
  kComputeNoise = 1,
  kTransferNoise,
  kTensorRankNoise,
  kSequenceLength,
  kGcMicrobatch,
  kGcOffset,
  kClockSkew,
};

uint64_t OpKey(const ProgramOp& op) {
  return (static_cast<uint64_t>(op.type) << 32) | (uint64_t{op.chunk} << 20) | op.microbatch;
}

bool HasMicrobatch(v1::OpType t) {
  return t == v1::OP_FORWARD_COMPUTE || t == v1::OP_BACKWARD_COMPUTE ||
         t == v1::OP_BACKWARD_WEIGHT_COMPUTE || t == v1::OP_FORWARD_SEND ||
         t == v1::OP_FORWARD_RECV || t == v1::OP_BACKWARD_SEND || t == v1::OP_BACKWARD_RECV;
}

bool IsCommunication(v1::OpType t) {
  return t != v1::OP_FORWARD_COMPUTE && t != v1::OP_BACKWARD_COMPUTE &&
         t != v1::OP_BACKWARD_WEIGHT_COMPUTE && t != v1::OP_OPTIMIZER && t != v1::OP_GC;
}

bool Active(const FaultSpec& f, uint64_t step) {
  return step >= f.from_step && step < f.until_step;
}

int64_t Ns(double us) { return std::llround(us * 1e3); }

}  // namespace

FleetOptions::PipelineCosts NominalPipelineCosts(const FleetOptions& o) {
  if (o.pipeline_costs.has_value()) return *o.pipeline_costs;
  const PipelineSpec& p = *o.parallel;
  const double step_us = o.step_ms * 1e3;
  FleetOptions::PipelineCosts c;
  c.forward = PipelineShares::kCompute * step_us / (3.0 * (p.microbatches + p.pp - 1));
  c.backward = 2 * c.forward;
  c.backward_input = c.forward;
  c.weight = c.forward;
  c.p2p = PipelineShares::kP2pOfForward * c.forward;
  c.params_all_gather = PipelineShares::kParamsAllGather * step_us;
  c.grads_reduce_scatter = PipelineShares::kGradsReduceScatter * step_us;
  c.embedding = PipelineShares::kEmbedding * step_us;
  c.clip = PipelineShares::kClip * step_us;
  c.optimizer = PipelineShares::kOptimizer * step_us;
  return c;
}

double FleetModel::Uniform(uint64_t a, uint64_t b, uint64_t c) const {
  const uint64_t h = Mix(options_.seed ^ Mix(a ^ Mix(b ^ Mix(c))));
  return static_cast<double>(h >> 11) * 0x1.0p-53;
}

double FleetModel::Normal(uint64_t a, uint64_t b, uint64_t c) const {
  // Box-Muller from two independent uniforms (the second keyed apart by a high bit).
  const double u1 = std::max(Uniform(a, b, c), 0x1.0p-53);
  const double u2 = Uniform(a | (uint64_t{1} << 63), b, c);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

v1::ParallelLayout FleetModel::LayoutOf(uint32_t rank) const {
  const PipelineSpec& p = *options_.parallel;
  v1::ParallelLayout l;
  l.set_data_rank(p.DataRankOf(rank));
  l.set_data_size(p.dp);
  l.set_pipeline_rank(p.StageOf(rank));
  l.set_pipeline_size(p.pp);
  l.set_tensor_rank(p.TensorRankOf(rank));
  l.set_tensor_size(p.tp);
  if (p.vpp > 1) l.set_virtual_stages(p.vpp);
  return l;
}

void FleetModel::PipelineStep(uint64_t step, std::vector<v1::StepRecord>* records,
                              std::vector<bool>* reported) {
  const PipelineSpec& p = *options_.parallel;
  const uint32_t n = p.world_size(), workers = p.workers();
  records->resize(n);
  reported->assign(n, false);
  // A hung rank stops the whole job: the pipeline and the collectives wait for it.
  if (Hangs(0, step)) {
    job_elapsed_ns_ += static_cast<int64_t>(options_.step_ms * 1e6);
    return;
  }

  // Compute factors per worker, and the GC pauses of this step.
  std::vector<double> factor(workers, 1.0), slow_compute(workers, 1.0);
  struct Pause {
    uint32_t rank, worker, microbatch;
    double us, offset;  // offset: where in the compute op it starts, as a share of the rest
  };
  std::vector<Pause> pauses;
  for (size_t fi = 0; fi < options_.faults.size(); ++fi) {
    const FaultSpec& f = options_.faults[fi];
    if (!Active(f, step)) continue;
    switch (f.kind) {
      case FaultKind::kSlowWorker: factor[f.stage * p.dp + f.dp] *= f.magnitude; break;
      case FaultKind::kStageImbalance:
        for (uint32_t d = 0; d < p.dp; ++d) factor[f.stage * p.dp + d] *= f.magnitude;
        break;
      case FaultKind::kSequenceImbalance:
        for (uint32_t d = 0; d < p.dp; ++d) {
          const double v = 2 * Uniform(kSequenceLength, (uint64_t{fi} << 32) | d, step) - 1;
          for (uint32_t s = 0; s < p.pp; ++s) factor[s * p.dp + d] *= 1 + f.magnitude * v;
        }
        break;
      case FaultKind::kSlowCompute:
        // Any slowed tensor rank slows its whole worker (lockstep), once.
        for (uint32_t r = 0; r < n; ++r) {
          if (Targets(f, r, step)) {
            double& w = slow_compute[p.WorkerOf(r)];
            w = std::max(w, 1 + f.magnitude);
          }
        }
        break;
      case FaultKind::kGc:
        if ((step - f.from_step) % f.every == 0) {
          const uint32_t r = f.target.index;
          const auto mb = static_cast<uint32_t>(Uniform(kGcMicrobatch, fi, step) * p.microbatches);
          pauses.push_back({r, p.WorkerOf(r), std::min(mb, p.microbatches - 1), f.magnitude * 1e3,
                            Uniform(kGcOffset, fi, step)});
        }
        break;
      default: break;
    }
  }
  for (uint32_t w = 0; w < workers; ++w) factor[w] *= slow_compute[w];

  const FleetOptions::PipelineCosts c = NominalPipelineCosts(options_);
  const double sigma = options_.op_noise;
  StepCosts costs;
  const double per_chunk = 1.0 / p.vpp;
  costs.compute = [&](uint32_t w, const ProgramOp& op) {
    const double noise =
        std::exp(sigma * Normal(kComputeNoise, (uint64_t{w} << 32) ^ step, OpKey(op)));
    const double f = noise * factor[w] * per_chunk;
    switch (op.type) {
      case v1::OP_OPTIMIZER: return c.optimizer * noise;
      case v1::OP_BACKWARD_COMPUTE: return (op.input_only ? c.backward_input : c.backward) * f;
      case v1::OP_BACKWARD_WEIGHT_COMPUTE: return c.weight * f;
      default: break;
    }
    double d = c.forward * f;
    for (const Pause& pause : pauses) {
      if (pause.worker == w && pause.microbatch == op.microbatch && op.chunk == 0) d += pause.us;
    }
    return d;
  };
  costs.transfer = [&](uint32_t w, const ProgramOp& op) {
    double base = 0;
    switch (op.type) {
      case v1::OP_FORWARD_SEND:
      case v1::OP_BACKWARD_SEND: base = c.p2p; break;
      case v1::OP_PARAMS_ALL_GATHER: base = c.params_all_gather; break;
      case v1::OP_GRADS_REDUCE_SCATTER: base = c.grads_reduce_scatter; break;
      case v1::OP_EMBEDDING_GRADS_ALL_REDUCE: base = c.embedding; break;
      case v1::OP_OPTIMIZER_CLIP_MAIN_GRAD: base = c.clip; break;
      default: break;
    }
    return base * std::exp(sigma * Normal(kTransferNoise, (uint64_t{w} << 32) ^ step, OpKey(op)));
  };
  const SimulatedStep sim = SimulatePipelineStep(p, costs);

  const int64_t origin = job_start_unix_ns_ + job_elapsed_ns_;
  const int64_t step_ns = Ns(sim.end_us);
  const double tp_sigma = sigma / 4;
  for (uint32_t r = 0; r < n; ++r) {
    const uint32_t w = p.WorkerOf(r);
    const int64_t skew = options_.clock_skew_us > 0
                             ? Ns(options_.clock_skew_us * Normal(kClockSkew, NodeOf(r), 0))
                             : 0;
    v1::StepRecord& rec = (*records)[r];
    rec.Clear();
    rec.set_step(step);
    rec.set_ops_origin_unix_ns(origin + skew);
    double forward = 0, backward = 0, optimizer = 0, collective = 0, gc = 0;
    uint32_t gc_count = 0;
    const std::vector<TimedOp>& ops = sim.workers[w];
    for (size_t i = 0; i < ops.size(); ++i) {
      const TimedOp& op = ops[i];
      double duration = op.duration_us;
      // Tensor ranks of a worker start together and end within a fraction of a percent.
      if (p.tp > 1 && !IsCommunication(op.type)) {
        duration *= 1 - std::min(0.5, std::abs(tp_sigma * Normal(kTensorRankNoise,
                                                                 (uint64_t{r} << 32) ^ step, i)));
      }
      v1::OpRecord* out = rec.add_ops();
      out->set_type(op.type);
      if (HasMicrobatch(op.type)) out->set_microbatch(op.microbatch);
      if (op.chunk != 0) out->set_model_chunk(op.chunk);
      out->set_start_offset_us(static_cast<uint64_t>(std::llround(op.start_us)));
      out->set_duration_us(static_cast<uint64_t>(std::llround(duration)));
      switch (op.type) {
        case v1::OP_FORWARD_COMPUTE: forward += duration; break;
        case v1::OP_BACKWARD_COMPUTE:
        case v1::OP_BACKWARD_WEIGHT_COMPUTE: backward += duration; break;
        case v1::OP_OPTIMIZER: optimizer += duration; break;
        default: collective += duration; break;
      }
      if (op.type != v1::OP_FORWARD_COMPUTE || op.chunk != 0) continue;
      for (const Pause& pause : pauses) {
        if (pause.rank != r || pause.microbatch != op.microbatch) continue;
        v1::OpRecord* g = rec.add_ops();
        g->set_type(v1::OP_GC);
        g->set_start_offset_us(static_cast<uint64_t>(
            std::llround(op.start_us + pause.offset * std::max(0.0, duration - pause.us))));
        g->set_duration_us(static_cast<uint64_t>(std::llround(pause.us)));
        gc += pause.us;
        ++gc_count;
      }
    }
    // The simulated job's input is prefetched: no data-loading op, a known zero.
    rec.set_dataloader_ns(0);
    rec.set_forward_ns(static_cast<uint64_t>(Ns(forward)));
    rec.set_backward_ns(static_cast<uint64_t>(Ns(backward)));
    rec.set_optimizer_ns(static_cast<uint64_t>(Ns(optimizer)));
    if (options_.report_collective) rec.set_collective_ns(static_cast<uint64_t>(Ns(collective)));
    rec.set_step_time_ns(static_cast<uint64_t>(step_ns));
    rec.set_gc_ns(static_cast<uint64_t>(Ns(gc)));
    rec.set_gc_count(gc_count);
    FillMemory(r, step, &rec);
    rank_elapsed_ns_[r] += step_ns;
    rec.set_end_unix_ns(origin + step_ns + skew);
    (*reported)[r] = true;
  }
  job_elapsed_ns_ += step_ns;
}

}  // namespace rankwatch
