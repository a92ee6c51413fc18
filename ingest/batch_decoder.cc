#include "ingest/batch_decoder.h"

#include <cmath>
#include <utility>

#include <fmt/format.h>

#include "wire/parallel_layout.h"

namespace rankwatch {
namespace {

RejectReason Reject(RejectReason reason, std::string* detail, std::string message) {
  if (detail != nullptr) *detail = std::move(message);
  return reason;
}

}  // namespace

std::string_view RejectReasonName(RejectReason reason) {
  switch (reason) {
    case RejectReason::kNone: return "none";
    case RejectReason::kOversized: return "oversized";
    case RejectReason::kMalformed: return "malformed";
    case RejectReason::kSchemaVersion: return "schema_version";
    case RejectReason::kMissingSource: return "missing_source";
    case RejectReason::kBadRank: return "bad_rank";
    case RejectReason::kTooManyRecords: return "too_many_records";
    case RejectReason::kBadValue: return "bad_value";
    case RejectReason::kBadString: return "bad_string";
    case RejectReason::kFutureTimestamp: return "future_timestamp";
  }
  return "unknown";
}

RejectReason BatchDecoder::Decode(std::string_view bytes, v1::Batch* batch, std::string* detail,
                                  int64_t wall_now_unix_ns, DecodeNotes* notes) const {
  if (bytes.size() > limits_.max_bytes) {
    return Reject(RejectReason::kOversized, detail,
                  fmt::format("message of {} bytes exceeds the limit of {}", bytes.size(),
                              limits_.max_bytes));
  }
  batch->Clear();
  if (!batch->ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return Reject(RejectReason::kMalformed, detail,
                  fmt::format("{} bytes are not a protobuf rankwatch.v1.Batch", bytes.size()));
  }
  return Validate(*batch, detail, wall_now_unix_ns, notes);
}

RejectReason BatchDecoder::Validate(const v1::Batch& batch, std::string* detail,
                                    int64_t wall_now_unix_ns, DecodeNotes* notes) const {
  DecodeNotes scratch;
  if (notes == nullptr) notes = &scratch;
  *notes = DecodeNotes{};
  if (batch.schema_version() == 0 || batch.schema_version() > kSchemaVersion) {
    return Reject(RejectReason::kSchemaVersion, detail,
                  fmt::format("schema_version {} (this daemon reads 1..{})", batch.schema_version(),
                              kSchemaVersion));
  }
  if (RejectReason r = ValidateSource(batch, detail); r != RejectReason::kNone) return r;
  if (static_cast<size_t>(batch.steps_size()) > limits_.max_steps ||
      static_cast<size_t>(batch.kernels_size()) > limits_.max_kernels ||
      static_cast<size_t>(batch.samples_size()) > limits_.max_samples ||
      static_cast<size_t>(batch.strings_size()) > limits_.max_strings) {
    return Reject(RejectReason::kTooManyRecords, detail,
                  fmt::format("{} steps, {} kernels, {} samples, {} strings", batch.steps_size(),
                              batch.kernels_size(), batch.samples_size(), batch.strings_size()));
  }
  if (RejectReason r =
          CheckTime(batch.created_unix_ns(), wall_now_unix_ns, "created_unix_ns", detail);
      r != RejectReason::kNone) {
    return r;
  }
  if (RejectReason r = ValidateSteps(batch, detail, wall_now_unix_ns, notes);
      r != RejectReason::kNone) {
    return r;
  }
  if (RejectReason r = ValidateSamples(batch, detail, wall_now_unix_ns); r != RejectReason::kNone) {
    return r;
  }
  if (RejectReason r = ValidateKernels(batch, detail); r != RejectReason::kNone) return r;
  return ValidateFlightRecorder(batch, detail);
}

RejectReason BatchDecoder::ValidateSource(const v1::Batch& batch, std::string* detail) const {
  const v1::SourceIdentity& src = batch.source();
  if (!batch.has_source() || src.training_job().empty()) {
    return Reject(RejectReason::kMissingSource, detail, "source.training_job is missing");
  }
  if (src.training_job().size() > limits_.max_job_id_bytes) {
    return Reject(RejectReason::kBadString, detail,
                  fmt::format("source.training_job of {} bytes (limit {})",
                              src.training_job().size(), limits_.max_job_id_bytes));
  }
  const std::pair<const char*, const std::string*> strings[] = {
      {"source.node", &src.node()},
      {"source.device", &src.device()},
      {"source.collector", &src.collector()},
      {"source.training_strategy", &src.training_strategy()},
      {"source.scheduler.scheduler", &src.scheduler().scheduler()},
      {"source.scheduler.job", &src.scheduler().job()},
      {"source.scheduler.namespace", &src.scheduler().namespace_()},
      {"source.scheduler.owner", &src.scheduler().owner()},
      {"source.scheduler.pod", &src.scheduler().pod()},
      {"trace.source_format", &batch.trace().source_format()},
      {"trace.device_type", &batch.trace().device_type()},
      {"trace.file", &batch.trace().file()}};
  for (const auto& [field, value] : strings) {
    if (value->size() > limits_.max_string_bytes) {
      return Reject(
          RejectReason::kBadString, detail,
          fmt::format("{} of {} bytes (limit {})", field, value->size(), limits_.max_string_bytes));
    }
  }
  if (src.world_size() == 0 || src.world_size() > limits_.max_world_size ||
      src.rank() >= src.world_size()) {
    return Reject(RejectReason::kBadRank, detail,
                  fmt::format("rank {} of world size {}", src.rank(), src.world_size()));
  }
  if (src.has_layout()) {
    if (std::string e = ParallelLayoutError(src.layout(), src.world_size()); !e.empty()) {
      return Reject(RejectReason::kBadRank, detail,
                    fmt::format("rank {} of world size {}: {}", src.rank(), src.world_size(), e));
    }
  }
  return RejectReason::kNone;
}

RejectReason BatchDecoder::CheckTime(int64_t unix_ns, int64_t wall_now_unix_ns, const char* what,
                                     std::string* detail) const {
  if (unix_ns < 0) {
    return Reject(RejectReason::kBadValue, detail, fmt::format("negative {}: {}", what, unix_ns));
  }
  if (wall_now_unix_ns > 0 && unix_ns > wall_now_unix_ns &&
      unix_ns - wall_now_unix_ns > limits_.max_clock_ahead_ns) {
    return Reject(RejectReason::kFutureTimestamp, detail,
                  fmt::format("{} is {:.0f} s ahead of this daemon's clock (limit {:.0f} s): "
                              "the producer's clock is wrong",
                              what, static_cast<double>(unix_ns - wall_now_unix_ns) * 1e-9,
                              static_cast<double>(limits_.max_clock_ahead_ns) * 1e-9));
  }
  return RejectReason::kNone;
}

RejectReason BatchDecoder::ValidateSteps(const v1::Batch& batch, std::string* detail,
                                         int64_t wall_now_unix_ns, DecodeNotes* notes) const {
  const uint64_t max = limits_.max_duration_ns;
  const uint32_t chunks =
      batch.source().has_layout() ? LayoutSize(batch.source().layout().virtual_stages()) : 0;
  for (const v1::StepRecord& s : batch.steps()) {
    // Durations are unsigned on the wire: a negative one written as an integer arrives as a
    // value near 2^64, far over the limit.
    const bool bad_duration = s.step_time_ns() > max || s.dataloader_ns() > max ||
                              s.forward_ns() > max || s.backward_ns() > max ||
                              s.optimizer_ns() > max || s.forward_backward_ns() > max ||
                              s.collective_ns() > max || s.gc_ns() > max;
    if (bad_duration || s.step() > limits_.max_step) {
      return Reject(
          RejectReason::kBadValue, detail,
          fmt::format("step {}: a duration exceeds one day or the step is too large", s.step()));
    }
    if (RejectReason r = CheckTime(s.end_unix_ns(), wall_now_unix_ns, "step end_unix_ns", detail);
        r != RejectReason::kNone) {
      return r;
    }
    if (s.ops_size() == 0 && s.ops_origin_unix_ns() == 0) continue;
    if (RejectReason r =
            CheckTime(s.ops_origin_unix_ns(), wall_now_unix_ns, "step ops_origin_unix_ns", detail);
        r != RejectReason::kNone) {
      return r;
    }
    if (RejectReason r = ValidateOps(s, chunks, detail, notes); r != RejectReason::kNone) return r;
  }
  return RejectReason::kNone;
}

RejectReason BatchDecoder::ValidateOps(const v1::StepRecord& s, uint32_t chunks,
                                       std::string* detail, DecodeNotes* notes) const {
  if (static_cast<size_t>(s.ops_size()) > limits_.max_ops_per_step) {
    return Reject(RejectReason::kTooManyRecords, detail,
                  fmt::format("step {}: {} ops (limit {})", s.step(), s.ops_size(),
                              limits_.max_ops_per_step));
  }
  const uint64_t max_us = limits_.max_duration_ns / 1000;
  for (const v1::OpRecord& op : s.ops()) {
    if (op.duration_us() > max_us || op.start_offset_us() > max_us) {
      return Reject(RejectReason::kBadValue, detail,
                    fmt::format("step {}: an op starts or lasts more than one day", s.step()));
    }
    if (op.microbatch() >= limits_.max_op_index || op.model_chunk() >= limits_.max_op_index ||
        (chunks > 0 && op.model_chunk() >= chunks)) {
      return Reject(
          RejectReason::kBadValue, detail,
          fmt::format("step {}: an op of microbatch {} and model chunk {} (limit {}; "
                      "the layout's model chunks: {})",
                      s.step(), op.microbatch(), op.model_chunk(), limits_.max_op_index, chunks));
    }
    if (op.type() == v1::OP_UNSPECIFIED || !v1::OpType_IsValid(op.type())) {
      ++notes->unknown_op_types;
    }
  }
  notes->ops += static_cast<uint64_t>(s.ops_size());
  return RejectReason::kNone;
}

RejectReason BatchDecoder::ValidateSamples(const v1::Batch& batch, std::string* detail,
                                           int64_t wall_now_unix_ns) const {
  // Utilisations, temperatures and powers are finite and not negative.
  auto bad = [](double v) { return !std::isfinite(v) || v < 0; };
  for (const v1::SystemSample& s : batch.samples()) {
    if (RejectReason r = CheckTime(s.unix_ns(), wall_now_unix_ns, "sample unix_ns", detail);
        r != RejectReason::kNone) {
      return r;
    }
    bool bad_value = bad(s.cpu_utilization());
    for (const v1::ProcessSample& p : s.processes()) bad_value |= bad(p.cpu_utilization());
    for (const v1::DeviceSample& d : s.devices()) {
      bad_value |= bad(d.utilization()) || bad(d.temperature_celsius()) || bad(d.power_watts());
    }
    if (bad_value) {
      return Reject(RejectReason::kBadValue, detail,
                    "a sample's utilisation, temperature or power is negative, NaN or infinite");
    }
  }
  return RejectReason::kNone;
}

RejectReason BatchDecoder::ValidateKernels(const v1::Batch& batch, std::string* detail) const {
  for (const std::string& s : batch.strings()) {
    if (s.size() > limits_.max_string_bytes) {
      return Reject(RejectReason::kBadString, detail,
                    fmt::format("interned string of {} bytes", s.size()));
    }
  }
  const auto n = static_cast<uint32_t>(batch.strings_size());
  const auto max = static_cast<int64_t>(limits_.max_duration_ns);
  for (const v1::KernelEvent& k : batch.kernels()) {
    // Index 0 is the empty string and is valid even with an empty table.
    auto bad = [n](uint32_t index) { return index != 0 && index >= n; };
    if (bad(k.name()) || bad(k.category()) || bad(k.collective_name()) || bad(k.dtype())) {
      return Reject(RejectReason::kBadString, detail,
                    fmt::format("kernel event references a string outside the table of {}", n));
    }
    // Durations may be negative in replays of quirky traces, never longer than the limit.
    if (k.dur_ns() > max || k.dur_ns() < -max || !std::isfinite(k.memory_bw_gbps())) {
      return Reject(
          RejectReason::kBadValue, detail,
          fmt::format("kernel event of {} ns or a bandwidth that is not finite", k.dur_ns()));
    }
  }
  return RejectReason::kNone;
}

RejectReason BatchDecoder::ValidateFlightRecorder(const v1::Batch& batch,
                                                  std::string* detail) const {
  if (static_cast<size_t>(batch.flight_recorder_dumps_size()) > limits_.max_fr_dumps) {
    return Reject(RejectReason::kTooManyRecords, detail,
                  fmt::format("{} Flight Recorder dumps (limit {})",
                              batch.flight_recorder_dumps_size(), limits_.max_fr_dumps));
  }
  const auto too_long = [this](const std::string& s) {
    return s.size() > limits_.max_string_bytes;
  };
  for (const v1::FlightRecorderDump& d : batch.flight_recorder_dumps()) {
    if (d.rank() != batch.source().rank()) {
      return Reject(RejectReason::kBadRank, detail,
                    fmt::format("a Flight Recorder dump of rank {} in a batch of rank {}", d.rank(),
                                batch.source().rank()));
    }
    if (d.state() != v1::FR_DUMP_READ && d.state() != v1::FR_DUMP_EMPTY &&
        d.state() != v1::FR_DUMP_UNREADABLE) {
      return Reject(RejectReason::kBadValue, detail,
                    fmt::format("Flight Recorder dump state {}", static_cast<int>(d.state())));
    }
    if (d.file_mtime_unix_ns() < 0) {
      return Reject(RejectReason::kBadValue, detail, "negative Flight Recorder file_mtime_unix_ns");
    }
    if (static_cast<size_t>(d.entries_size()) > limits_.max_fr_entries ||
        static_cast<size_t>(d.groups_size()) > limits_.max_fr_groups ||
        static_cast<size_t>(d.status_size()) > limits_.max_fr_groups) {
      return Reject(RejectReason::kTooManyRecords, detail,
                    fmt::format("a Flight Recorder dump of {} entries, {} groups, {} statuses "
                                "(limits {}, {})",
                                d.entries_size(), d.groups_size(), d.status_size(),
                                limits_.max_fr_entries, limits_.max_fr_groups));
    }
    bool long_string = too_long(d.source()) || too_long(d.node()) || too_long(d.error()) ||
                       too_long(d.version()) || too_long(d.nccl_version()) ||
                       too_long(d.request_id());
    for (const v1::FlightRecorderGroup& g : d.groups()) {
      long_string |= too_long(g.name()) || too_long(g.desc());
      if (static_cast<size_t>(g.ranks_size()) > limits_.max_world_size) {
        return Reject(RejectReason::kTooManyRecords, detail,
                      fmt::format("a Flight Recorder group of {} ranks", g.ranks_size()));
      }
      for (uint32_t r : g.ranks()) {
        if (r >= limits_.max_world_size) {
          return Reject(RejectReason::kBadRank, detail,
                        fmt::format("rank {} in a Flight Recorder group", r));
        }
      }
    }
    for (const v1::FlightRecorderGroupStatus& st : d.status()) long_string |= too_long(st.uid());
    if (long_string) {
      return Reject(RejectReason::kBadString, detail,
                    fmt::format("a string of the Flight Recorder dump of rank {} over {} bytes",
                                d.rank(), limits_.max_string_bytes));
    }
    for (const v1::FlightRecorderEntry& e : d.entries()) {
      if (RejectReason r = ValidateFrEntry(e, detail); r != RejectReason::kNone) return r;
    }
  }
  return RejectReason::kNone;
}

RejectReason BatchDecoder::ValidateFrEntry(const v1::FlightRecorderEntry& e,
                                           std::string* detail) const {
  const size_t tensors = limits_.max_fr_tensors;
  if (static_cast<size_t>(e.frames_size()) > limits_.max_fr_frames ||
      static_cast<size_t>(e.input_sizes_size()) > tensors ||
      static_cast<size_t>(e.output_sizes_size()) > tensors ||
      static_cast<size_t>(e.input_dtypes_size()) > tensors ||
      static_cast<size_t>(e.output_dtypes_size()) > tensors) {
    return Reject(
        RejectReason::kTooManyRecords, detail,
        fmt::format("Flight Recorder entry {}: {} frames, {}/{} shapes, {}/{} dtypes "
                    "(limits {}, {})",
                    e.record_id(), e.frames_size(), e.input_sizes_size(), e.output_sizes_size(),
                    e.input_dtypes_size(), e.output_dtypes_size(), limits_.max_fr_frames, tensors));
  }
  for (const auto* shapes : {&e.input_sizes(), &e.output_sizes()}) {
    for (const v1::FlightRecorderShape& shape : *shapes) {
      if (static_cast<size_t>(shape.dims_size()) > limits_.max_fr_dims) {
        return Reject(RejectReason::kTooManyRecords, detail,
                      fmt::format("Flight Recorder entry {}: a shape of {} dimensions (limit {})",
                                  e.record_id(), shape.dims_size(), limits_.max_fr_dims));
      }
    }
  }
  const auto too_long = [this](const std::string& s) {
    return s.size() > limits_.max_string_bytes;
  };
  bool long_string = too_long(e.pg_name()) || too_long(e.pg_desc()) || too_long(e.profiling_name());
  for (const auto* dtypes : {&e.input_dtypes(), &e.output_dtypes()}) {
    for (const std::string& t : *dtypes) long_string |= too_long(t);
  }
  for (const v1::FlightRecorderFrame& f : e.frames()) {
    long_string |= too_long(f.name()) || too_long(f.filename());
  }
  if (long_string) {
    return Reject(RejectReason::kBadString, detail,
                  fmt::format("Flight Recorder entry {}: a string over {} bytes", e.record_id(),
                              limits_.max_string_bytes));
  }
  return RejectReason::kNone;
}

}  // namespace rankwatch
