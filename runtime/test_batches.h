// Helpers for runtime tests: a telemetry batch of one step record, serialised as a Kafka
// message carries it.
#pragma once

#include <cstdint>
#include <string>

#include "rankwatch/v1/telemetry.pb.h"
#include "wire/schema.h"

namespace rankwatch::testing {

// `rank` of a `world`-rank job reports `step`: forward 30 ms of a 100-ms step.
inline std::string EncodedStep(const std::string& job, uint64_t step, uint32_t rank = 0,
                               uint32_t world = 1) {
  v1::Batch b;
  b.set_schema_version(kSchemaVersion);
  b.mutable_source()->set_training_job(job);
  b.mutable_source()->set_rank(rank);
  b.mutable_source()->set_world_size(world);
  v1::StepRecord* r = b.add_steps();
  r->set_step(step);
  r->set_forward_ns(30'000'000);
  r->set_step_time_ns(100'000'000);
  return b.SerializeAsString();
}

}  // namespace rankwatch::testing
