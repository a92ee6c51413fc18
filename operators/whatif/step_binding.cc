#include "operators/whatif/step_binding.h"

#include <algorithm>
#include <limits>
#include <string>

namespace rankwatch::whatif::internal {
namespace {

size_t K(OpKind k) { return static_cast<size_t>(k); }

}  // namespace

absl::Status BindStep(std::shared_ptr<const StepModel> model, const StepOps& step,
                      const std::vector<WorkerIndex>& index, BindScratch* scratch, BoundStep* out) {
  const StepModel& m = *model;
  const Layout& layout = m.layout;
  const size_t dp = layout.dp;
  BoundStep b;
  b.step = step.step;
  b.measured.assign(size_t{m.nodes} * dp, 0.0);
  b.stage_compute_us.assign(layout.pp, 0.0);
  scratch->start.assign(size_t{m.nodes} * dp, 0.0);
  scratch->end.assign(size_t{m.nodes} * dp, 0.0);
  double first = std::numeric_limits<double>::infinity();
  double last = -std::numeric_limits<double>::infinity();

  for (uint32_t s = 0; s < layout.pp; ++s) {
    const StageModel& st = m.stages[s];
    for (uint32_t d = 0; d < dp; ++d) {
      const uint32_t w = s * layout.dp + d;
      const std::vector<Op>& ops = step.workers[w];
      const WorkerIndex& wi = index[w];
      for (const Op& op : ops) {
        first = std::min(first, op.start_us);
        last = std::max(last, op.start_us + op.duration_us);
        ++b.ops[K(op.kind)];
      }
      for (int k = 0; k < kOpKindCount; ++k) {
        const auto kind = static_cast<OpKind>(k);
        if (!IsModelled(kind) || kind == OpKind::kGc) continue;
        if (wi.Count(kind) != st.kind_count[k]) {
          return absl::InvalidArgumentError(
              "step " + std::to_string(step.step) + ": data rank " + std::to_string(d) +
              " of stage " + std::to_string(s) + " has " + std::to_string(wi.Count(kind)) + " " +
              std::string(OpKindName(kind)) + " ops, data rank 0 has " +
              std::to_string(st.kind_count[k]));
        }
        const auto list = wi.Kind(kind);
        for (uint32_t i = 0; i < list.size(); ++i) {
          const Op& op = ops[list[i]];
          const size_t at = size_t{st.first + st.kind_first[k] + i} * dp + d;
          scratch->start[at] = op.start_us;
          scratch->end[at] = op.start_us + op.duration_us;
          b.measured[at] = op.duration_us;
        }
      }
      // GC: each pause adds to the slot at its chain position and is carved out of the chain
      // ops it overlaps.
      const auto gcs = wi.Kind(OpKind::kGc);
      for (size_t j = 0; j < gcs.size(); ++j) {
        const Op& gc = ops[gcs[j]];
        const uint32_t pos = wi.gc_pos[j];
        const int32_t slot = st.gc_slot[pos];
        if (slot < 0) {
          return absl::InternalError("whatif: a GC op without a slot in its step's model");
        }
        b.measured[size_t{st.first + static_cast<uint32_t>(slot)} * dp + d] += gc.duration_us;
        const double gs = gc.start_us, ge = gc.start_us + gc.duration_us;
        for (size_t c = pos == 0 ? 0 : pos - 1; c < wi.chain.size(); ++c) {
          const Op& op = ops[wi.chain[c]];
          if (op.start_us >= ge) break;
          const double overlap =
              std::min(ge, op.start_us + op.duration_us) - std::max(gs, op.start_us);
          if (overlap <= 0) continue;
          const uint32_t node = st.first + st.kind_first[K(op.kind)] + wi.seq[wi.chain[c]];
          double& value = b.measured[size_t{node} * dp + d];
          value = std::max(0.0, value - overlap);
        }
        b.mean_sum[K(OpKind::kGc)] += gc.duration_us;
      }
      b.mean_count[K(OpKind::kGc)] += 1;
    }
  }

  // Transfer times of the communication groups.
  std::vector<double>& gstart = scratch->group_start;
  gstart.resize(dp);
  for (uint32_t g = 0; g < m.groups(); ++g) {
    const uint32_t gb = m.group_begin[g], ge = m.group_begin[g + 1];
    std::fill(gstart.begin(), gstart.end(), -std::numeric_limits<double>::infinity());
    for (uint32_t i = gb; i < ge; ++i) {
      const double* s = scratch->start.data() + size_t{m.group_members[i]} * dp;
      for (size_t d = 0; d < dp; ++d) gstart[d] = std::max(gstart[d], s[d]);
    }
    if (m.group_synced[g]) {
      std::fill(gstart.begin(), gstart.end(), *std::max_element(gstart.begin(), gstart.end()));
    }
    for (uint32_t i = gb; i < ge; ++i) {
      const size_t at = size_t{m.group_members[i]} * dp;
      for (size_t d = 0; d < dp; ++d) {
        const double transfer = scratch->end[at + d] - gstart[d];
        b.measured[at + d] = transfer <= kNegativeTransferFloorUs ? 0.0 : transfer;
      }
    }
  }

  for (uint32_t v = 0; v < m.nodes; ++v) {
    const OpKind kind = m.kind[v];
    if (IsCommunication(kind)) {
      const double* x = b.measured.data() + size_t{v} * dp;
      b.sorted[K(kind)].insert(b.sorted[K(kind)].end(), x, x + dp);
      continue;
    }
    if (kind == OpKind::kGc) continue;
    const double* x = b.measured.data() + size_t{v} * dp;
    double sum = 0;
    for (size_t d = 0; d < dp; ++d) sum += x[d];
    b.mean_sum[m.typical[v]] += sum;
    b.mean_count[m.typical[v]] += dp;
    if (kind == OpKind::kForwardCompute || kind == OpKind::kBackwardCompute ||
        kind == OpKind::kBackwardWeightCompute) {
      b.stage_compute_us[m.stage[v]] += sum;
    }
  }
  for (auto& values : b.sorted) std::sort(values.begin(), values.end());
  b.measured_us = last > first ? last - first : 0.0;
  b.model = std::move(model);
  *out = std::move(b);
  return absl::OkStatus();
}

}  // namespace rankwatch::whatif::internal
