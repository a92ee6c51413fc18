// Evidence: the one interface through which the runtime drives each kind of evidence rankwatchd
// fetches from the ranks of a running job (captures, hang stacks). A kind asks the ranks over
// the control channel, reads their answers from the job's telemetry, and adds what it learnt to
// the job's alerts. The runtime calls every registered kind the same way and knows none of them
// (the runtime offers hooks; each kind registers in rankwatchd's wiring): a new kind of evidence
// is a new implementation here, not a change to the runtime.
//
// Thread-safety: implementations are called on the ingest thread (both hooks) and read by query
// threads, so they are thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "operators/job_pipeline.h"
#include "rankwatch/v1/service.pb.h"

namespace rankwatch {

// The latest snapshot of every job, by job (the read model's map).
using JobSnapshotMap = std::map<std::string, std::shared_ptr<const JobSnapshot>>;

// What one tick of the runtime produced, as evidence sees it: after the tick's snapshots were
// published and its alerts evaluated, before the alerts are stored and published.
struct EvidenceTick {
  int64_t now_unix_ns = 0;  // wall clock
  // The jobs evaluated this tick (never null).
  const std::vector<std::shared_ptr<const JobSnapshot>>* evaluated = nullptr;
  // Jobs removed from memory since the last tick (never null).
  const std::vector<std::string>* removed = nullptr;
  // Every job's latest snapshot, this tick's included (never null).
  std::shared_ptr<const JobSnapshotMap> latest;
};

class Evidence {
 public:
  virtual ~Evidence() = default;

  // A validated telemetry batch, before its records reach the job: its control replies, and
  // its events when they answer a request (batches with `trace.capture_id`).
  virtual void OnBatch(const v1::Batch& batch) = 0;

  // After each tick. May ask ranks (new requests), settle or expire requests, fill the evidence
  // of `alerts` (the tick's alerts, in order) and append alerts to publish again with evidence
  // that arrived after them (same id and state). Kinds are called in the order they were
  // registered; each sees the alerts the ones before it appended.
  virtual void OnTick(const EvidenceTick& tick, std::vector<v1::Alert>* alerts) = 0;

  // The ranks of `job` that serve a request of this kind at `now_unix_ns` in a way that may
  // delay their steps or their telemetry (a capture: profiling, then uploading its trace),
  // ascending. The hang diagnosis does not count their silence while they do (the runtime asks
  // before each evaluation of the job). Bounded in time by the request's own expiry. Default:
  // none (a kind whose answers never hold up the training thread).
  virtual std::vector<uint32_t> BusyRanks(const std::string& job, int64_t now_unix_ns) const {
    (void)job;
    (void)now_unix_ns;
    return {};
  }
};

}  // namespace rankwatch
