// CaptureStore: captures, the evidence behind a straggler (proto/rankwatch/v1/control.proto).
//
// A capture asks some ranks of a job for a profiler trace of their next few steps. The store
// sends a ControlRequest through `send` (the daemon's producer on the control topic), follows
// each rank's answers (the ControlReplies in the job's telemetry batches; the request's id,
// deadline and per-rank states are a ControlRequestTracker's), keeps the events each rank sends
// (batches whose trace.capture_id names the capture), and once the culprit rank and the
// reference rank are both done compares them operator by operator
// (operators/capture_compare.h). A capture whose ranks have not all answered by the request's
// deadline, or finished some time after (three times the steps asked at the rank's step time,
// at least a minute), is EXPIRED, naming the ranks.
//
// As a tick hook (parts/tick_hook.h), after each tick: the job's newest comparison goes into the
// evidence of its alerts; a straggler alert that fires triggers an automatic capture of its
// culprit rank and a typical rank (evidence/capture_ranks.h), at most one per job per
// `auto_interval`; captures past their time expire.
//
// Thread-safe: batches and ticks arrive on the ingest thread, requests and queries on gRPC
// threads. `send` is called under no lock of the store's.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "evidence/control_request_tracker.h"
#include "operators/job_pipeline.h"
#include "parts/tick_hook.h"
#include "rankwatch/v1/service.pb.h"

namespace rankwatch {

// Operators of a capture's comparison a diagnosis and its alerts carry.
inline constexpr int kEvidenceCaptureRows = 10;

struct CaptureStoreOptions {
  uint32_t default_steps = 5;  // default: 5 steps a rank
  uint32_t max_steps = 100;    // the collectors' limit
  // The collectors must start before this (the request's deadline). Default: 60 s.
  std::chrono::seconds answer_deadline{60};
  bool auto_capture = true;                 // default: on
  std::chrono::seconds auto_interval{600};  // default: one automatic capture a job per 10 min
  size_t max_captures = 64;                 // kept; the oldest finished go first
  size_t max_events_per_rank = 50000;       // as the collectors send at most
  size_t comparison_rows = 25;
};

class CaptureStore : public TickHook {
 public:
  // Sends one control request (key: the training job). Unavailable when it cannot.
  using Sender = std::function<absl::Status(const std::string& key, const std::string& payload)>;

  CaptureStore(CaptureStoreOptions options, Sender send);

  // Asks `ranks` of `job` for `steps` steps (0: the default). `culprit` and `reference` (each -1
  // for none; both among `ranks`) are compared when both are done. `snapshot`, when there is
  // one, gives each rank's node and step time. InvalidArgument for bad ranks or steps,
  // ResourceExhausted when max_captures are all still running, Unavailable when the request
  // could not be sent.
  absl::StatusOr<v1::Capture> Request(const std::string& job, std::vector<uint32_t> ranks,
                                      int32_t culprit, int32_t reference, uint32_t steps,
                                      const std::string& requested_by, const std::string& alert_id,
                                      const JobSnapshot* snapshot, int64_t now_unix_ns);

  // A telemetry batch: its control replies and, when it is a capture's, its events.
  void OnBatch(const v1::Batch& batch) override;
  // After each tick: the newest comparison into the alerts' evidence, automatic captures for
  // firing straggler alerts (OnAlert), expiry (Expire).
  void OnTick(const TickView& tick, std::vector<v1::Alert>* alerts) override;
  // An alert was published: a straggler alert that fires may trigger an automatic capture.
  void OnAlert(const v1::Alert& alert, const JobSnapshot* snapshot, int64_t now_unix_ns);
  // Captures past their deadline expire.
  void Expire(int64_t now_unix_ns);
  // The ranks of `job` that serve a running capture: they accepted it and have not given their
  // last word (DONE, REFUSED or FAILED), for at most three times the steps asked at the rank's
  // step time plus 30 s (the trace's export and upload) from the first tick that saw them
  // accept, and never past the capture's expiry. Profiling and uploading, their steps and
  // telemetry may lag. A rank that has not answered serves nothing yet.
  std::vector<uint32_t> BusyRanks(const std::string& job, int64_t now_unix_ns) const override;

  // A capture; with `traces`, each rank's events too.
  std::optional<v1::Capture> Get(const std::string& id,
                                 std::vector<v1::CaptureTrace>* traces = nullptr) const;
  // Captures of `job` (every job when empty), newest first.
  std::vector<v1::Capture> List(const std::string& job) const;
  // The newest done capture of `job` that compared a culprit with a reference, its comparison
  // cut to its first `rows` operators (the evidence a diagnosis and its alerts carry).
  std::optional<v1::Capture> LatestComparison(const std::string& job, int rows) const;

  const CaptureStoreOptions& options() const { return options_; }

 private:
  struct Entry {
    v1::Capture capture;
    int64_t finish_by_unix_ns = 0;  // expires after this unless done
    int64_t busy_for_ns = 0;        // how long a rank may serve it once it accepted (BusyRanks)
    std::map<uint32_t, int64_t> accepted_seen_unix_ns;  // the first tick that saw it ACCEPTED
    std::map<uint32_t, v1::CaptureTrace> traces;        // by rank
    std::map<uint32_t, size_t> index_of_rank;           // into capture.ranks
  };
  // Updates the capture's state from its ranks; compares when culprit and reference are done.
  void Settle(Entry& e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops the oldest finished captures beyond max_captures.
  void MakeRoom() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const CaptureStoreOptions options_;
  const Sender send_;
  mutable std::mutex mu_;
  // Every capture kept has its request open here: late answers still update its ranks.
  ControlRequestTracker requests_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Entry> captures_ ABSL_GUARDED_BY(mu_);             // by id
  std::deque<std::string> order_ ABSL_GUARDED_BY(mu_);                     // ids, oldest first
  std::map<std::string, int64_t> last_auto_unix_ns_ ABSL_GUARDED_BY(mu_);  // by job
};

}  // namespace rankwatch
