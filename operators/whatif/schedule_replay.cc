#include "operators/whatif/schedule_replay.h"

#include <algorithm>

namespace rankwatch::whatif::internal {

double ScheduleReplay::Run(const StepModel& model, const double* dur) {
  const size_t dp = model.layout.dp;
  start_.resize(size_t{model.nodes} * dp);
  end_.resize(size_t{model.nodes} * dp);
  tmp_.resize(dp);
  double* const start = start_.data();
  double* const end = end_.data();
  double* const tmp = tmp_.data();
  const uint32_t* const deps = model.deps.data();
  for (const StepModel::Instr& instr : model.schedule) {
    if (!instr.finish_group) {
      const uint32_t v = instr.id;
      double* const s = start + v * dp;
      const uint32_t b = model.dep_begin[v], e = model.dep_begin[v + 1];
      if (b == e) {
        std::fill(s, s + dp, 0.0);
      } else {
        const double* u = end + deps[b] * dp;
        std::copy(u, u + dp, s);
        for (uint32_t i = b + 1; i < e; ++i) {
          u = end + deps[i] * dp;
          for (size_t d = 0; d < dp; ++d) s[d] = std::max(s[d], u[d]);
        }
      }
      if (model.group[v] < 0) {
        double* const out = end + v * dp;
        const double* const dv = dur + v * dp;
        for (size_t d = 0; d < dp; ++d) out[d] = s[d] + dv[d];
      }
      continue;
    }
    const uint32_t g = instr.id;
    const uint32_t b = model.group_begin[g], e = model.group_begin[g + 1];
    const uint32_t* const members = model.group_members.data();
    {
      const double* s = start + members[b] * dp;
      std::copy(s, s + dp, tmp);
      for (uint32_t i = b + 1; i < e; ++i) {
        s = start + members[i] * dp;
        for (size_t d = 0; d < dp; ++d) tmp[d] = std::max(tmp[d], s[d]);
      }
    }
    if (model.group_synced[g]) std::fill(tmp, tmp + dp, *std::max_element(tmp, tmp + dp));
    for (uint32_t i = b; i < e; ++i) {
      const size_t m = members[i];
      double* const out = end + m * dp;
      const double* const dm = dur + m * dp;
      for (size_t d = 0; d < dp; ++d) out[d] = tmp[d] + dm[d];
    }
  }
  double step = 0;
  for (uint32_t v : model.end_nodes) {
    const double* const e = end + v * dp;
    step = std::max(step, *std::max_element(e, e + dp));
  }
  return step;
}

}  // namespace rankwatch::whatif::internal
