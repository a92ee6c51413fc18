#include "operators/step_codec.h"

#include <algorithm>
#include <string>

namespace rankwatch {

state::v1::StoredStep EncodeStep(const AlignedStep& step) {
  state::v1::StoredStep out;
  out.set_step(step.step);
  out.set_timed_out(step.timed_out);
  out.set_world_size(step.world_size);
  const size_t n = step.samples.size();
  out.mutable_ranks()->Reserve(static_cast<int>(n));
  out.mutable_present()->Reserve(static_cast<int>(n));
  out.mutable_phase_ns_delta()->Reserve(static_cast<int>(n * kPhaseCount));
  out.mutable_peak_allocated_delta()->Reserve(static_cast<int>(n));
  out.mutable_peak_reserved_delta()->Reserve(static_cast<int>(n));
  out.mutable_capacity_delta()->Reserve(static_cast<int>(n));
  out.mutable_end_unix_ns_delta()->Reserve(static_cast<int>(n));
  std::array<int64_t, kPhaseCount> prev{};
  int64_t prev_alloc = 0, prev_reserved = 0, prev_capacity = 0, prev_end = 0;
  for (const StepSample& s : step.samples) {
    out.add_ranks(s.rank);
    out.add_present(s.present);
    for (int p = 0; p < kPhaseCount; ++p) {
      out.add_phase_ns_delta(s.ns[p] - prev[p]);
      prev[p] = s.ns[p];
    }
    const auto alloc = static_cast<int64_t>(s.peak_allocated_bytes);
    const auto reserved = static_cast<int64_t>(s.peak_reserved_bytes);
    const auto capacity = static_cast<int64_t>(s.device_capacity_bytes);
    out.add_peak_allocated_delta(alloc - prev_alloc);
    out.add_peak_reserved_delta(reserved - prev_reserved);
    out.add_capacity_delta(capacity - prev_capacity);
    out.add_end_unix_ns_delta(s.end_unix_ns - prev_end);
    prev_alloc = alloc;
    prev_reserved = reserved;
    prev_capacity = capacity;
    prev_end = s.end_unix_ns;
  }
  // GC columns only where some rank reported GC: steps of jobs without it cost nothing more.
  const bool any_gc = std::any_of(step.samples.begin(), step.samples.end(),
                                  [](const StepSample& s) { return s.HasGc(); });
  if (any_gc) {
    out.mutable_gc_ns_delta()->Reserve(static_cast<int>(n));
    out.mutable_gc_count()->Reserve(static_cast<int>(n));
    int64_t prev_gc = 0;
    for (const StepSample& s : step.samples) {
      out.add_gc_ns_delta(s.gc_ns - prev_gc);
      out.add_gc_count(s.gc_count);
      prev_gc = s.gc_ns;
    }
  }
  return out;
}

absl::Status DecodeStep(const state::v1::StoredStep& in, AlignedStep* out) {
  const int n = in.ranks_size();
  if (in.present_size() != n || in.phase_ns_delta_size() != n * kPhaseCount ||
      in.peak_allocated_delta_size() != n || in.peak_reserved_delta_size() != n ||
      in.capacity_delta_size() != n || in.end_unix_ns_delta_size() != n || in.world_size() == 0 ||
      in.gc_ns_delta_size() != in.gc_count_size() ||
      (in.gc_ns_delta_size() != 0 && in.gc_ns_delta_size() != n)) {
    return absl::DataLossError("stored step " + std::to_string(in.step()) +
                               " has inconsistent columns");
  }
  const bool has_gc_columns = in.gc_ns_delta_size() == n && n > 0;
  out->step = in.step();
  out->timed_out = in.timed_out();
  out->world_size = in.world_size();
  out->samples.resize(n);
  std::array<int64_t, kPhaseCount> prev{};
  int64_t alloc = 0, reserved = 0, capacity = 0, end = 0, gc = 0;
  for (int i = 0; i < n; ++i) {
    StepSample& s = out->samples[i];
    s.step = in.step();
    s.rank = in.ranks(i);
    if (s.rank >= in.world_size()) {
      return absl::DataLossError("stored step " + std::to_string(in.step()) + " has rank " +
                                 std::to_string(s.rank) + " of " + std::to_string(in.world_size()));
    }
    s.present = in.present(i);
    if ((s.present & kGcBit) && !has_gc_columns) {
      return absl::DataLossError("stored step " + std::to_string(in.step()) + " marks GC on rank " +
                                 std::to_string(s.rank) + " without its GC columns");
    }
    for (int p = 0; p < kPhaseCount; ++p) {
      prev[p] += in.phase_ns_delta(i * kPhaseCount + p);
      s.ns[p] = prev[p];
    }
    alloc += in.peak_allocated_delta(i);
    reserved += in.peak_reserved_delta(i);
    capacity += in.capacity_delta(i);
    end += in.end_unix_ns_delta(i);
    s.peak_allocated_bytes = static_cast<uint64_t>(alloc);
    s.peak_reserved_bytes = static_cast<uint64_t>(reserved);
    s.device_capacity_bytes = static_cast<uint64_t>(capacity);
    s.end_unix_ns = end;
    s.gc_ns = 0;
    s.gc_count = 0;
    if (has_gc_columns) {
      gc += in.gc_ns_delta(i);
      if (s.present & kGcBit) {
        s.gc_ns = gc;
        s.gc_count = in.gc_count(i);
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace rankwatch
