// Conversion of operator results (JobSnapshot, StepDiagnosis) to the wire messages of
// proto/rankwatch/v1/service.proto.
#pragma once

#include "operators/alert_tracker.h"
#include "operators/job_pipeline.h"
#include "rankwatch/v1/service.pb.h"

namespace rankwatch {

v1::StepDiagnosisLabel ToProto(StepLabel label);
v1::MemoryDiagnosisLabel ToProto(MemoryLabel label);
v1::Severity ToProto(Severity severity);
v1::Phase ToProto(Phase phase);

// Fills `out` with the job's step-time and memory diagnoses and their evidence.
void ToProto(const JobSnapshot& snapshot, int64_t evaluated_unix_ns, v1::Diagnosis* out);

// Fills `out` with what stragglers and hangs cost the job.
void ToProto(const JobSnapshot& snapshot, v1::LostTime* out);
// A pipeline job's what-if analysis and verdict.
void ToProto(const whatif::WhatIfSnapshot& whatif, v1::WhatIf* out);

// The job's scheduler names (no pod).
void ToProto(const JobScheduler& scheduler, v1::SchedulerIdentity* out);

// Fills `out` with an alert event and the diagnosis that raised it (sequence not set).
void ToProto(const AlertEvent& event, v1::Alert* out);

}  // namespace rankwatch
