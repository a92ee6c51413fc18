// Encoding of aligned steps for the durable state store (proto/rankwatch/state/v1): column-wise,
// with durations delta-coded across consecutive ranks.
#pragma once

#include "absl/status/status.h"
#include "operators/step_aligner.h"
#include "rankwatch/state/v1/job_state.pb.h"

namespace rankwatch {

state::v1::StoredStep EncodeStep(const AlignedStep& step);

// Decodes `stored` into `out`. Arrays of inconsistent lengths or ranks outside the world size
// are DataLoss errors (a damaged store), never a crash.
absl::Status DecodeStep(const state::v1::StoredStep& stored, AlignedStep* out);

}  // namespace rankwatch
