// ControlListener: a collector's side of the control channel (proto/rankwatch/v1/control.proto).
//
// A librdkafka consumer on a thread of its own reads the control topic. It uses no consumer
// group: every collector sees every request. It starts `lookback_messages` before the end of
// each partition, so that a request sent while the collector was connecting is still seen; of
// those older messages, the requests whose deadline has passed are skipped silently (`stale`),
// the others are acted on. Messages keyed to another job are skipped without being parsed. A
// request of this job that addresses this rank is checked (CheckControlRequest) and then either
// accepted, queued for the training side, and answered CONTROL_ACCEPTED, or answered
// CONTROL_REFUSED with a reason and counted. Stacks and Flight Recorder dump requests, which must
// not wait for a step boundary (the training thread may be stuck: the job is hung), go to a queue
// of their own that a thread of the caller's waits on (WaitStacks). Answers go to the ReplySink,
// which the collector ships in its next batch.
//
// The training side never waits for any of this: pending() is one atomic load, and Take() holds
// a mutex only to move the queue out. A topic that does not exist yet (the daemon creates it)
// is looked up again every `metadata_retry`; a broker that is down only delays requests.
//
// Thread-safety: every public method may be called from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "kafka/handles.h"
#include "kafka/kafka_properties.h"
#include "rankwatch/v1/control.pb.h"

namespace rankwatch {

// Why a request was refused; the names are the replies' `reason` and the counters' labels.
enum class ControlRefusal : int {
  kMalformed = 0,  // not a ControlRequest, or its job differs from the message key
  kOversized,      // over ControlLimits::max_bytes
  kExpired,        // its deadline has passed (or is more than max_deadline_ahead away)
  kBadRequest,     // no id, an id too long, too many ranks, steps out of range
  kUnsupported,    // an action this collector does not know or cannot take
  kBusy,           // max_queued accepted requests are still waiting for the training side
};
constexpr int kControlRefusalCount = 6;
const char* ControlRefusalName(ControlRefusal r);

struct ControlLimits {
  size_t max_bytes = 64 << 10;  // serialized request
  size_t max_id_bytes = 128;
  size_t max_ranks = 1024;           // ranks listed
  uint32_t max_capture_steps = 100;  // 0: this collector takes no captures ("unsupported")
  uint32_t max_stack_frames = 256;   // 0: this collector takes no stacks ("unsupported")
  int64_t max_deadline_ahead_ns = 3'600'000'000'000;  // 1 h
};

// What to do with one message of the control topic.
struct ControlCheck {
  enum class Kind { kAccept, kIgnore, kRefuse } kind = Kind::kIgnore;
  ControlRefusal refusal = ControlRefusal::kMalformed;  // kRefuse
  std::string detail;                                   // kRefuse: for the log and the reply
};

// A listener's rank that every request of its job addresses: a node agent, which speaks for
// the ranks on its node and filters them itself.
constexpr uint32_t kEveryRank = UINT32_MAX;

// Checks one message (`key`, `payload`) for the collector of (`job`, `rank`) at wall time
// `now_unix_ns`. kIgnore: another job's, or this job's for other ranks. kAccept fills `out`.
// A refusal fills `out` as far as it could be parsed (its id, when there is one).
ControlCheck CheckControlRequest(std::string_view key, std::string_view payload,
                                 const std::string& job, uint32_t rank, int64_t now_unix_ns,
                                 const ControlLimits& limits, v1::ControlRequest* out);

struct ControlListenerOptions {
  std::string brokers;                      // required
  std::string topic = "rankwatch.control";  // default: rankwatch.control
  std::string training_job;                 // required
  uint32_t rank = 0;                        // kEveryRank: every request of the job
  size_t max_queued = 8;  // accepted requests not yet taken; beyond: refused "busy"
  ControlLimits limits;
  int64_t lookback_messages = 1000;  // default: start 1,000 messages before each partition's end
  std::chrono::milliseconds metadata_retry{2'000};  // default: look for the topic every 2 s
  KafkaProperties properties;                       // passed through to librdkafka
};

struct ControlListenerStats {
  uint64_t messages = 0;     // read from the topic
  uint64_t other_jobs = 0;   // keyed to another job: skipped, not parsed
  uint64_t other_ranks = 0;  // this job's, for other ranks
  uint64_t duplicates = 0;   // a request id seen before
  uint64_t stale = 0;        // expired, and sent before this listener started: not answered
  uint64_t accepted = 0;
  uint64_t refused[kControlRefusalCount] = {};
  bool reading = false;  // the topic's partitions are assigned
};

class ControlListener {
 public:
  using ReplySink = std::function<void(v1::ControlReply)>;

  // Validates the options, creates the consumer and starts its thread; does not wait for the
  // broker. `reply` is called on the listener's thread; without one, nothing is answered (the
  // caller answers for the ranks it speaks for) and refusals are only counted and logged.
  static absl::StatusOr<std::unique_ptr<ControlListener>> Start(ControlListenerOptions options,
                                                                ReplySink reply);
  ~ControlListener();  // stops the thread, closes the consumer
  ControlListener(const ControlListener&) = delete;
  ControlListener& operator=(const ControlListener&) = delete;

  // True when accepted requests wait to be taken. One atomic load: for the training loop.
  bool pending() const { return pending_.load(std::memory_order_acquire); }
  // The accepted requests not yet taken, oldest first.
  std::vector<v1::ControlRequest> Take();
  // Waits up to `timeout` for accepted stacks and Flight Recorder requests and takes them (oldest
  // first); empty when none came or the listener is stopping. For a thread that is not the training
  // thread.
  std::vector<v1::ControlRequest> WaitStacks(std::chrono::milliseconds timeout);
  // Wakes every WaitStacks caller now, with nothing (for a caller that is shutting down).
  void WakeStacks();
  ControlListenerStats stats() const;

 private:
  ControlListener(ControlListenerOptions options, ReplySink reply, KafkaClient rk);
  void Run();
  bool AssignPartitions();  // metadata, then every partition from its look-back offset
  void Handle(std::string_view key, std::string_view payload);
  void Refuse(const v1::ControlRequest& request, ControlRefusal why, const std::string& detail);

  const ControlListenerOptions options_;
  const ReplySink reply_;
  const KafkaClient rk_;
  const int64_t started_unix_ns_;

  std::atomic<bool> stop_{false};
  std::atomic<bool> pending_{false};
  mutable std::mutex mu_;
  std::deque<v1::ControlRequest> queue_;            // guarded by mu_
  std::deque<v1::ControlRequest> stacks_queue_;     // guarded by mu_
  std::condition_variable stacks_ready_;            // with mu_
  uint64_t stacks_wakeups_ = 0;                     // guarded by mu_ (WakeStacks calls)
  ControlListenerStats stats_;                      // guarded by mu_
  std::deque<std::string> recent_ids_;              // listener thread only: duplicate detection
  bool logged_refusal_[kControlRefusalCount] = {};  // listener thread only
  std::thread thread_;
};

}  // namespace rankwatch
