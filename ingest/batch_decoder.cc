#include "ingest/batch_decoder.h"

#include <fmt/format.h>

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
  }
  return "unknown";
}

RejectReason BatchDecoder::Decode(std::string_view bytes, v1::Batch* batch,
                                  std::string* detail) const {
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
  return Validate(*batch, detail);
}

RejectReason BatchDecoder::Validate(const v1::Batch& batch, std::string* detail) const {
  if (batch.schema_version() == 0 || batch.schema_version() > kSchemaVersion) {
    return Reject(RejectReason::kSchemaVersion, detail,
                  fmt::format("schema_version {} (this daemon reads 1..{})", batch.schema_version(),
                              kSchemaVersion));
  }
  const v1::SourceIdentity& src = batch.source();
  if (!batch.has_source() || src.training_job().empty() ||
      src.training_job().size() > limits_.max_job_id_bytes) {
    return Reject(RejectReason::kMissingSource, detail,
                  "source.training_job is missing or longer than the limit");
  }
  if (src.world_size() == 0 || src.world_size() > limits_.max_world_size ||
      src.rank() >= src.world_size()) {
    return Reject(RejectReason::kBadRank, detail,
                  fmt::format("rank {} of world size {}", src.rank(), src.world_size()));
  }
  if (static_cast<size_t>(batch.steps_size()) > limits_.max_steps ||
      static_cast<size_t>(batch.kernels_size()) > limits_.max_kernels ||
      static_cast<size_t>(batch.samples_size()) > limits_.max_samples ||
      static_cast<size_t>(batch.strings_size()) > limits_.max_strings) {
    return Reject(RejectReason::kTooManyRecords, detail,
                  fmt::format("{} steps, {} kernels, {} samples, {} strings", batch.steps_size(),
                              batch.kernels_size(), batch.samples_size(), batch.strings_size()));
  }
  if (RejectReason r = ValidateSteps(batch, detail); r != RejectReason::kNone) return r;
  return ValidateKernels(batch, detail);
}

RejectReason BatchDecoder::ValidateSteps(const v1::Batch& batch, std::string* detail) const {
  const uint64_t max = limits_.max_duration_ns;
  for (const v1::StepRecord& s : batch.steps()) {
    const bool bad_duration = s.step_time_ns() > max || s.dataloader_ns() > max ||
                              s.forward_ns() > max || s.backward_ns() > max ||
                              s.optimizer_ns() > max || s.forward_backward_ns() > max ||
                              s.collective_ns() > max;
    if (bad_duration || s.step() > limits_.max_step) {
      return Reject(
          RejectReason::kBadValue, detail,
          fmt::format("step {}: a duration exceeds one day or the step is too large", s.step()));
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
  for (const v1::KernelEvent& k : batch.kernels()) {
    // Index 0 is the empty string and is valid even with an empty table.
    auto bad = [n](uint32_t index) { return index != 0 && index >= n; };
    if (bad(k.name()) || bad(k.category()) || bad(k.collective_name()) || bad(k.dtype())) {
      return Reject(RejectReason::kBadString, detail,
                    fmt::format("kernel event references a string outside the table of {}", n));
    }
  }
  return RejectReason::kNone;
}

}  // namespace rankwatch
