// TickHook: what the runtime calls, on the ingest thread, for a part that hooks the tick — each
// kind of evidence (captures, hang stacks, Flight Recorder dumps: a kind asks the ranks over the
// control channel, reads their answers from the job's telemetry, and adds what it learnt to the
// job's alerts), the fleet view of nodes (what the jobs' straggler alerts charged their nodes).
// The runtime calls every registered hook the same way and knows none of them: a part hooks the
// tick through its PartContext (parts/daemon_part.h); a new hook is a new implementation, not a
// change to the runtime.
//
// Thread-safety: hooks are called on the ingest thread; implementations that queries also read
// are thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "operators/alert_tracker.h"
#include "operators/job_pipeline.h"
#include "rankwatch/v1/service.pb.h"

namespace rankwatch {

// The latest snapshot of every job, by job (the read model's map).
using JobSnapshotMap = std::map<std::string, std::shared_ptr<const JobSnapshot>>;

// What one tick of the runtime produced, as a hook sees it: after the tick's snapshots were
// published and its alerts evaluated, before the alerts are stored and published.
struct TickView {
  int64_t now_unix_ns = 0;  // wall clock
  // The jobs evaluated this tick (never null).
  const std::vector<std::shared_ptr<const JobSnapshot>>* evaluated = nullptr;
  // Jobs removed from memory since the last tick (never null).
  const std::vector<std::string>* removed = nullptr;
  // Every job's latest snapshot, this tick's included (never null).
  std::shared_ptr<const JobSnapshotMap> latest;
  // What the tick's straggler alerts charged their nodes (never null; often empty).
  const std::vector<NodeCharge>* node_charges = nullptr;
};

class TickHook {
 public:
  virtual ~TickHook() = default;

  // A validated telemetry batch, before its records reach the job: its control replies, and
  // its events when they answer a request (batches with `trace.capture_id`). Default: nothing.
  virtual void OnBatch(const v1::Batch& batch) { (void)batch; }

  // After each tick. May ask ranks (new requests), settle or expire requests, fill the evidence
  // of `alerts` (the tick's alerts, in order) and append alerts to publish again with evidence
  // that arrived after them (same id and state). Hooks are called in the order they were
  // registered; each sees the alerts the ones before it appended.
  virtual void OnTick(const TickView& tick, std::vector<v1::Alert>* alerts) = 0;

  // The ranks of `job` that serve a request of this hook in a way that may delay their steps or
  // their telemetry (a capture: profiling, then uploading its trace), ascending. The hang
  // diagnosis does not count their silence while they do (the runtime asks before each
  // evaluation of the job). Bounded in time by the request's own expiry. Default: none.
  virtual std::vector<uint32_t> BusyRanks(const std::string& job, int64_t now_unix_ns) const {
    (void)job;
    (void)now_unix_ns;
    return {};
  }
};

}  // namespace rankwatch
