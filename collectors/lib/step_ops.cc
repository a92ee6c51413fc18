#include "collectors/lib/step_ops.h"

#include <algorithm>

namespace rankwatch {

void AppendStepOps(std::vector<StepOp>& ops, uint64_t step_begin_ns, uint64_t step_end_ns,
                   int64_t step_end_unix_ns, v1::StepRecord* out) {
  if (ops.empty()) return;
  std::stable_sort(ops.begin(), ops.end(),
                   [](const StepOp& a, const StepOp& b) { return a.begin_ns < b.begin_ns; });
  const uint64_t origin = std::min(step_begin_ns, ops.front().begin_ns);
  const int64_t before_end = static_cast<int64_t>(step_end_ns >= origin ? step_end_ns - origin : 0);
  out->set_ops_origin_unix_ns(std::max<int64_t>(0, step_end_unix_ns - before_end));
  auto us = [origin](uint64_t t) { return (t - origin + 500) / 1000; };
  out->mutable_ops()->Reserve(out->ops_size() + static_cast<int>(ops.size()));
  for (const StepOp& op : ops) {
    v1::OpRecord* r = out->add_ops();
    r->set_type(static_cast<v1::OpType>(op.type));
    r->set_microbatch(op.microbatch);
    r->set_model_chunk(op.chunk);
    const uint64_t start = us(op.begin_ns);
    r->set_start_offset_us(start);
    r->set_duration_us(us(op.end_ns) - start);
  }
}

}  // namespace rankwatch
