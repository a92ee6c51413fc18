// HangInspector: hang stacks, the evidence behind a hang. It asks the ranks of a hung job where
// they are, while their processes are alive.
//
// When a job's step diagnosis becomes `hang`, the inspector sends one stacks request
// (control.proto, StacksAction) to every rank of the job through `send` (the daemon's producer on
// the control topic; the request's id, deadline and per-rank states are a
// ControlRequestTracker's). Each rank's collector answers ACCEPTED from its listener thread (the
// process is alive) and then DONE with every thread's stack and its collective counters, from a
// thread of its own (the training thread is stuck). The answers arrive in the job's telemetry
// batches (OnBatch). The inquiry settles when every rank has given its last word, or at the
// request's deadline:
//  - ranks are grouped by their training thread's stack, smallest group first;
//  - per process group, the ranks that entered fewer collectives than the others never reached
//    the collective the others wait in: they are the culprits;
//  - ranks that did not answer at all are gone (not running, or cut off from Kafka); ranks that
//    said they were alive but sent no stacks are silent;
//  - when every rank that answered stands in the same place, it says so and names no culprit.
//
// One inquiry per hang: a job is asked again only after it made progress (a step every rank
// completed; steps aligned at their timeout with ranks missing are not progress) and hung again.
// The inquiry stays while the job makes no progress, hung or not (a diagnosis may leave `hang`
// for a while as the last partial steps time out). Results are kept while the job stays hung (Get),
// and a settled one is handed out once (TakeSettled). At most `max_inquiries` jobs are followed;
// the oldest settled ones go first.
//
// As a tick hook (parts/tick_hook.h), after each tick (OnTick): the evaluated jobs are inspected
// (OnSnapshots), removed jobs forgotten; a hang alert carries the job's settled stacks, and one
// raised before its stacks came is published again with them (same id and state).
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
#include "operators/job_pipeline.h"
#include "parts/tick_hook.h"
#include "rankwatch/v1/service.pb.h"

namespace rankwatch {

struct HangInspectorOptions {
  // How long the ranks have to answer (the request's deadline). Default: 10 s.
  std::chrono::seconds answer_deadline{10};
  uint32_t max_frames = 64;    // frames a thread the collectors send; default 64
  size_t max_inquiries = 256;  // jobs followed at once; default 256
  size_t max_groups = 32;      // distinct stacks kept an inquiry; more are counted as "other"
};

struct HangInspectorCounters {
  uint64_t requests = 0;         // stacks requests sent
  uint64_t send_failures = 0;    // could not be sent
  uint64_t settled_all = 0;      // settled with stacks from every rank
  uint64_t settled_partial = 0;  // settled at the deadline with some ranks missing
};

class HangInspector : public TickHook {
 public:
  // Sends one control request (key: the training job). Unavailable when it cannot.
  using Sender = std::function<absl::Status(const std::string& key, const std::string& payload)>;

  HangInspector(HangInspectorOptions options, Sender send);

  // After each evaluation: a job newly diagnosed `hang` is asked; a job that is no longer hung
  // is forgotten; inquiries whose ranks have all answered, or whose deadline passed, settle.
  void OnSnapshots(const std::vector<std::shared_ptr<const JobSnapshot>>& snapshots,
                   int64_t now_unix_ns);
  // A job was removed: its inquiry goes, and its hang alert.
  void Forget(const std::string& job);
  // A telemetry batch: its control replies to stacks requests.
  void OnBatch(const v1::Batch& batch) override;
  // After each tick: OnSnapshots and Forget; the settled stacks into the job's hang alerts, and
  // a hang alert raised before them appended again with them (a new `at`).
  void OnTick(const TickView& tick, std::vector<v1::Alert>* alerts) override;

  // The job's inquiry for its current hang (settled or still awaiting answers).
  std::optional<v1::HangStacks> Get(const std::string& job) const;
  // Jobs whose inquiry settled since the last call (each once).
  std::vector<std::string> TakeSettled();

  HangInspectorCounters counters() const;

  // One rank's answer as kept: its training thread's stack (an index into the inquiry's
  // distinct stacks; kNoStack when it sent none, kOtherStack beyond max_groups) and its
  // collective counters.
  static constexpr int32_t kNoStack = -1;
  static constexpr int32_t kOtherStack = -2;
  struct RankAnswer {
    int32_t stack = kNoStack;
    std::vector<v1::CollectiveCounter> collectives;
  };
  // What a rank said: nothing yet, alive (ACCEPTED), or its last word (DONE, FAILED, REFUSED).
  enum class Heard : uint8_t { kNothing, kAlive, kFinal };

  // Builds the result of one inquiry from its answers (pure; exposed for tests): `answers` by
  // rank (the DONE replies), `stacks` the distinct training-thread stacks they point to,
  // `heard` by rank (its size is the ranks asked). Fills groups, culprits, gone and silent
  // ranks, collectives, same_place, ranks_asked, ranks_answered and summary.
  static v1::HangStacks Summarize(const std::map<uint32_t, RankAnswer>& answers,
                                  const std::vector<v1::ThreadStack>& stacks,
                                  const std::vector<Heard>& heard);

 private:
  struct Inquiry {
    v1::HangStacks result;  // request id, times, aligned steps; the rest once settled
    std::map<uint32_t, RankAnswer> answers;      // DONE replies by rank
    std::vector<v1::ThreadStack> stacks;         // distinct training-thread stacks
    std::map<std::string, int32_t> stack_index;  // frames key -> index into stacks
    uint64_t complete_steps = 0;  // the job's steps aligned with every rank, when asked
    bool settled = false;         // its request is closed then
  };
  static Heard HeardOf(v1::ControlState state);
  // Summarize over what the ranks of `q`'s open request said so far.
  v1::HangStacks SummarizeOpen(const Inquiry& q) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Settle(Inquiry& q, int64_t now_unix_ns) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::optional<v1::HangStacks> GetLocked(const std::string& job) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops the job's inquiry and closes its request.
  void Erase(std::map<std::string, Inquiry>::iterator it) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const HangInspectorOptions options_;
  const Sender send_;
  mutable std::mutex mu_;
  ControlRequestTracker requests_ ABSL_GUARDED_BY(mu_);            // of unsettled inquiries
  std::map<std::string, Inquiry> inquiries_ ABSL_GUARDED_BY(mu_);  // by job
  std::vector<std::string> settled_ ABSL_GUARDED_BY(mu_);          // not taken yet
  HangInspectorCounters counters_ ABSL_GUARDED_BY(mu_);
  // The newest hang alert of each hung job (pending or firing), to publish again when its
  // stacks arrive.
  HangAlertRepublisher hang_alerts_ ABSL_GUARDED_BY(mu_);
};

}  // namespace rankwatch
