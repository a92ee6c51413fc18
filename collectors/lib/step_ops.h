// StepOp: one op of a training step (forward compute of a microbatch, a pipeline send, a GC
// pause, ...) as the collector recorded it, and the conversion of one step's ops into its
// v1::StepRecord (`ops`, `ops_origin_unix_ns`; proto/rankwatch/v1/telemetry.proto). The
// recording threads hand StepOps to the sender thread through a BoundedRing, each tagged with
// the step it belongs to. A step timed on the device (Collector::SetDeviceTimes) also has
// device times for some of its ops (DeviceOpTime, by the op's index within its step); those ops
// carry the device times and keep their host times beside them.
//
// Plain value type and a pure function; not shared.
#pragma once

#include <cstdint>
#include <vector>

#include "rankwatch/v1/telemetry.pb.h"

namespace rankwatch {

struct StepOp {
  uint64_t generation = 0;  // which step: the collector's count of steps ended before it
  uint64_t begin_ns = 0;    // monotonic (Collector::NowNs)
  uint64_t end_ns = 0;      // >= begin_ns
  uint32_t microbatch = 0;
  uint32_t chunk = 0;
  uint32_t type = 0;   // a v1::OpType value
  uint32_t index = 0;  // its index within its step (Collector::AddOp's result)
};
static_assert(sizeof(StepOp) == 40, "a StepOp is a 40-byte op-ring entry");

// When the device ran op `op_index` of a step, on the collector's monotonic clock
// (Collector::NowNs): the caller converts its device events' times onto it.
struct DeviceOpTime {
  uint32_t op_index = 0;
  uint64_t begin_ns = 0;
  uint64_t end_ns = 0;  // >= begin_ns
};

// Writes `ops` (one step's, any order) into `out`: sorted by start, offsets in microseconds
// from the origin, which is the step's start (`step_begin_ns`, monotonic) or the first op's
// start when that is earlier, as a Unix time derived from the step's end (`step_end_ns`
// monotonic, `step_end_unix_ns` wall clock). Rounds each op's start and end to the nearest
// microsecond, so that ends line up across ops. No-op without ops. Sorts `ops` in place.
//
// With `device` (a device-timed step's op times, any order; sorted in place by op index), an op
// whose index has one (the first, when several do) gets its start and duration from the device
// times and host_start_offset_us / host_duration_us from its own when they differ; the others
// keep their host times. Ops sort by the start they carry; the origin is the earliest of the
// step's start and every op's start, host or device (device work may run after the host's step
// end).
void AppendStepOps(std::vector<StepOp>& ops, uint64_t step_begin_ns, uint64_t step_end_ns,
                   int64_t step_end_unix_ns, v1::StepRecord* out,
                   std::vector<DeviceOpTime>* device = nullptr);

}  // namespace rankwatch
