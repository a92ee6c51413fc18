#include "collectors/lib/step_ops.h"

#include <algorithm>

namespace rankwatch {
namespace {

// Sets the record's origin (`origin`, monotonic) as a Unix time from the step's end.
void SetOrigin(uint64_t origin, uint64_t step_end_ns, int64_t step_end_unix_ns,
               v1::StepRecord* out) {
  const int64_t before_end = static_cast<int64_t>(step_end_ns >= origin ? step_end_ns - origin : 0);
  out->set_ops_origin_unix_ns(std::max<int64_t>(0, step_end_unix_ns - before_end));
}

// AppendStepOps for a step with device times of its ops.
void AppendDeviceTimedOps(const std::vector<StepOp>& ops, uint64_t step_begin_ns,
                          uint64_t step_end_ns, int64_t step_end_unix_ns,
                          std::vector<DeviceOpTime>& device, v1::StepRecord* out) {
  std::stable_sort(device.begin(), device.end(), [](const DeviceOpTime& a, const DeviceOpTime& b) {
    return a.op_index < b.op_index;
  });
  struct Row {
    const StepOp* op;
    bool on_device;
    uint64_t begin_ns, end_ns;  // what the record carries
  };
  std::vector<Row> rows;
  rows.reserve(ops.size());
  uint64_t origin = step_begin_ns;
  for (const StepOp& op : ops) {
    auto it =
        std::lower_bound(device.begin(), device.end(), op.index,
                         [](const DeviceOpTime& d, uint32_t index) { return d.op_index < index; });
    Row r{&op, false, op.begin_ns, op.end_ns};
    if (it != device.end() && it->op_index == op.index) {
      r.on_device = true;
      r.begin_ns = it->begin_ns;
      r.end_ns = std::max(it->begin_ns, it->end_ns);
    }
    origin = std::min({origin, op.begin_ns, r.begin_ns});
    rows.push_back(r);
  }
  std::stable_sort(rows.begin(), rows.end(),
                   [](const Row& a, const Row& b) { return a.begin_ns < b.begin_ns; });
  SetOrigin(origin, step_end_ns, step_end_unix_ns, out);
  auto us = [origin](uint64_t t) { return (t - origin + 500) / 1000; };
  out->mutable_ops()->Reserve(out->ops_size() + static_cast<int>(rows.size()));
  for (const Row& row : rows) {
    const StepOp& op = *row.op;
    v1::OpRecord* r = out->add_ops();
    r->set_type(static_cast<v1::OpType>(op.type));
    r->set_microbatch(op.microbatch);
    r->set_model_chunk(op.chunk);
    const uint64_t start = us(row.begin_ns), duration = us(row.end_ns) - start;
    r->set_start_offset_us(start);
    r->set_duration_us(duration);
    if (!row.on_device) continue;
    const uint64_t host_start = us(op.begin_ns), host_duration = us(op.end_ns) - host_start;
    if (host_start != start || host_duration != duration) {
      r->set_host_start_offset_us(host_start);
      r->set_host_duration_us(host_duration);
    }
  }
}

}  // namespace

void AppendStepOps(std::vector<StepOp>& ops, uint64_t step_begin_ns, uint64_t step_end_ns,
                   int64_t step_end_unix_ns, v1::StepRecord* out,
                   std::vector<DeviceOpTime>* device) {
  if (ops.empty()) return;
  if (device != nullptr && !device->empty()) {
    AppendDeviceTimedOps(ops, step_begin_ns, step_end_ns, step_end_unix_ns, *device, out);
    return;
  }
  std::stable_sort(ops.begin(), ops.end(),
                   [](const StepOp& a, const StepOp& b) { return a.begin_ns < b.begin_ns; });
  const uint64_t origin = std::min(step_begin_ns, ops.front().begin_ns);
  SetOrigin(origin, step_end_ns, step_end_unix_ns, out);
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
