// FlightRecorderInspector: the PyTorch Flight Recorder evidence behind a hang. It gathers the
// dumps of a job's ranks that node agents publish (Batch.flight_recorder_dumps, one rank's
// dump a batch: collectors/agent/node_agent.h), analyzes them across ranks
// (flight_recorder/fr_analysis.h) and keeps the verdict: the ranks that hold the job, with their
// process group and operation. Sibling of HangInspector (evidence/hang_inspector.h), which asks
// the same hung job for its stacks.
//
//  - Dumps (OnBatch): the newest per (job, rank) is kept (a rewritten dump replaces the older
//    one), within bounds: `max_jobs` jobs, `max_bytes` of dumps in all (the jobs whose newest
//    dump is oldest go first; a dump that still does not fit is dropped and counted).
//  - Request: when a job's step diagnosis becomes `hang`, one FlightRecorderAction goes to every
//    rank of the job through `send` (one per hang: asked again only after the job made progress
//    and hung again), so that node agents with the ranks' dump pipes make PyTorch write them.
//    Without `send` (no control topic) dumps are still gathered (PyTorch writes them on its own
//    watchdog timeout).
//  - Analysis (OnTick): a job's dumps are analyzed with the job's world size once every rank's
//    dump came, or `settle` after the newest new dump, and again each time more come. Analysis
//    runs on the calling (ingest) thread, outside the lock.
//  - The verdict (Get) stays while the job makes no progress; once the job completes a step
//    after the newest dump, that hang is over: its dumps and verdict go.
//  - Alerts: a hang alert carries the job's verdict (Diagnosis.flight_recorder), and one raised
//    before the verdict (or before a newer one) is published again with it (same id and state).
//
// Thread-safe: batches and ticks arrive on the ingest thread, queries on gRPC threads. `send` is
// called under no lock of the inspector's.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "evidence/control_request_tracker.h"
#include "evidence/hang_alert_republisher.h"
#include "flight_recorder/fr_analysis.h"
#include "flight_recorder/fr_reader.h"
#include "parts/tick_hook.h"
#include "rankwatch/v1/service.pb.h"

namespace rankwatch {

struct FlightRecorderInspectorOptions {
  // Analyze this long after the newest new dump, when not every rank's came. Default: 2 s.
  std::chrono::milliseconds settle{2000};
  // The dump request's deadline (how long agents wait for PyTorch to write). Default: 60 s.
  std::chrono::seconds answer_deadline{60};
  size_t max_jobs = 64;  // jobs whose dumps are kept; default 64
  // Dumps kept in all: their wire size, the groups' rank lists left out (a job's dumps share
  // them: a few lists per rank position, kilobytes to megabytes a job). Default 512 MiB.
  size_t max_bytes = size_t{512} << 20;
};

struct FlightRecorderInspectorCounters {
  uint64_t dumps = 0;          // dumps kept (a rank's rewritten dump counts again)
  uint64_t dumps_dropped = 0;  // over max_bytes, or of a job over max_jobs
  uint64_t requests = 0;       // dump requests sent
  uint64_t send_failures = 0;  // could not be sent
  uint64_t analyses = 0;
};

class FlightRecorderInspector : public TickHook {
 public:
  // Sends one control request (key: the training job). Unavailable when it cannot. May be
  // empty: no requests are sent.
  using Sender = std::function<absl::Status(const std::string& key, const std::string& payload)>;

  FlightRecorderInspector(FlightRecorderInspectorOptions options, Sender send);

  // A telemetry batch: its Flight Recorder dumps.
  void OnBatch(const v1::Batch& batch) override;
  // After each tick: requests for newly hung jobs, analyses due, removed and recovered jobs
  // forgotten; the verdict into the job's hang alerts, and a hang alert raised before it
  // appended again with it.
  void OnTick(const TickView& tick, std::vector<v1::Alert>* alerts) override;

  // The job's newest verdict (analyzed_unix_ns and last_dump_unix_ns set).
  std::optional<v1::FlightRecorderVerdict> Get(const std::string& job) const;

  FlightRecorderInspectorCounters counters() const;

  // What keeping one dump costs against max_bytes: its wire size less its groups' rank lists,
  // which a job's dumps share (a 16,384-rank job's dumps each list the world in several groups).
  static size_t KeptBytes(const v1::FlightRecorderDump& d);

 private:
  struct Kept {
    fr::RankDump dump;
    std::string node;
    size_t bytes = 0;
  };
  struct Job {
    std::map<uint32_t, Kept> dumps;              // by rank
    std::unique_ptr<fr::FrRanksInterner> lists;  // the rank lists its dumps share
    uint32_t batch_world_size = 0;               // the world size the dumps' batches gave
    size_t bytes = 0;
    int64_t last_dump_unix_ns = 0;  // the newest dump's arrival
    bool pending = false;           // dumps came since the last analysis
    uint64_t complete_steps = 0;    // the job's complete steps when the newest dump came
    bool steps_known = false;       // complete_steps was set from a snapshot
    std::optional<v1::FlightRecorderVerdict> verdict;
    bool republish = false;  // a new verdict its hang alert has not carried
    // The hang that was asked: the job's complete steps then (asked again after progress).
    std::optional<uint64_t> asked_at_steps;
  };
  void Request(const std::vector<std::shared_ptr<const JobSnapshot>>& snapshots,
               int64_t now_unix_ns);
  void Analyze(const TickView& tick);
  // Frees room for `bytes` more by dropping other jobs' dumps (oldest newest-dump first).
  bool MakeRoom(const std::string& job, size_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Drop(std::map<std::string, Job>::iterator it) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const FlightRecorderInspectorOptions options_;
  const Sender send_;
  mutable std::mutex mu_;
  ControlRequestTracker requests_ ABSL_GUARDED_BY(mu_);  // ids and deadlines
  std::map<std::string, Job> jobs_ ABSL_GUARDED_BY(mu_);
  size_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  FlightRecorderInspectorCounters counters_ ABSL_GUARDED_BY(mu_);
  // The newest hang alert of each job (pending or firing), to publish again with a verdict.
  HangAlertRepublisher hang_alerts_ ABSL_GUARDED_BY(mu_);
};

}  // namespace rankwatch
