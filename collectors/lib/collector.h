// Collector: the in-process telemetry recorder of one training rank. The training thread
// opens and closes steps and times phases; a background sender thread turns the recorded
// steps and kernel events into v1::Batch messages and produces them, lz4-compressed, with
// librdkafka's idempotent producer (collectors/batch_publisher.h), keyed by training job.
//
// Recording never blocks and never allocates on the step path: phase times are atomic adds
// into the open step, and closing a step is one push into a fixed BoundedRing (drop-oldest
// when the sender falls behind). When Kafka is slow or down, serialized batches wait in a
// byte-bounded PendingBatches (drop-oldest); librdkafka holds only a few batches at a time
// (kafka_queue_max_messages), so that its threads stay idle while the broker is away.
// Everything dropped is counted and reported in the next batch's `dropped_records`. The
// producer reconnects by itself when the broker returns, and a backlog then drains at the
// broker's pace. memory_bound_bytes() states the total bound.
//
// Control channel: with options.control_topic set, a ControlListener (its own thread and
// librdkafka consumer) reads the daemon's requests for this rank; the training loop polls
// control_pending() at step boundaries, takes the requests and acts on them, and the answers
// (ReplyControl, SendCapture) ship in the next batches.
//
// Thread-safety: BeginStep/EndStep, control_pending() and TakeControlRequests() from one thread
// (the training loop), which also closes the collector; AddPhase, RecordMemory, RecordKernels,
// SetTrainingStrategy, ReplyControl, SendCapture, identity(), stats() and Flush() from any
// thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "collectors/batch_publisher.h"
#include "collectors/lib/bounded_ring.h"
#include "collectors/lib/control_listener.h"
#include "collectors/lib/pending_batches.h"
#include "collectors/lib/timed_step.h"
#include "kafka/kafka_properties.h"

namespace rankwatch {

// Who is recording (spec section 1, "source identity").
struct CollectorIdentity {
  std::string training_job;  // required
  uint32_t rank = 0;         // < world_size
  uint32_t world_size = 1;   // >= 1
  std::string node;          // host name
  uint32_t local_rank = 0;
  uint32_t pid = 0;  // 0 = this process
  std::string device = "cpu";
  // How the job trains: "ddp", "fsdp", ... ("" = not said); Collector::SetTrainingStrategy
  // changes it later (a Python script says so when it wraps its model).
  std::string training_strategy;
  bool sharded = false;  // parameters sharded across ranks (FSDP, ZeRO-3): forward waits too
  // The scheduler's names (SchedulerIdentity in telemetry.proto; "" = not said): "kubernetes",
  // "slurm" or "torchrun", its job id, the Kubernetes namespace, owner and pod of this rank.
  std::string scheduler;
  std::string scheduler_job;
  std::string k8s_namespace;
  std::string owner;
  std::string pod;
};

struct CollectorOptions {
  std::string brokers;                        // Kafka bootstrap servers (required)
  std::string topic = "rankwatch.telemetry";  // default: rankwatch.telemetry
  std::string compression = "lz4";            // default: lz4
  // Default: 1 s between batches (each costs the sender and librdkafka ~0.2 ms of CPU), or
  // sooner when the kernel-event buffer is half full.
  int flush_interval_ms = 1000;
  size_t step_ring_capacity = 4096;     // default: 4,096 steps (rounded up to 2^n)
  size_t max_kernel_events = 65536;     // default: 65,536 kernel events buffered
  size_t max_pending_bytes = 4u << 20;  // default: 4 MiB of batches waiting for Kafka
  // Batches handed to librdkafka and not yet acknowledged; 1 to kIdempotentInflightWindow
  // (5), because more makes librdkafka spin while a hung broker holds its in-flight window
  // (kafka/kafka_producer.h). The backlog waits in the pending bytes instead.
  int kafka_queue_max_messages = 4;   // default: 4 batches in librdkafka's queue
  int kafka_queue_max_kbytes = 4096;  // default: 4 MiB in librdkafka's queue
  int message_timeout_ms = 300000;    // default: 5 min; older undelivered batches fail
  // The control channel's topic (control.proto; collectors/lib/control_listener.h); empty: no
  // control channel. A listener that cannot start is logged and the collector goes on without.
  std::string control_topic = "rankwatch.control";  // default: rankwatch.control
  // Whether the caller acts on capture requests (takes them at step boundaries and answers
  // with SendCapture or ReplyControl). Without it they are refused "unsupported" at once.
  bool take_captures = true;  // default: true
  // Whether the caller answers stacks requests (a thread of its own waits in WaitStacksRequests
  // and answers with ReplyControl; the Python package does). Without it they are refused
  // "unsupported" at once, which still tells the daemon that the process is alive.
  bool take_stacks = false;  // default: false
  // Events one capture may send (SendCapture); more are cut and the reply says so.
  size_t max_capture_events = 50000;  // default: 50,000
  KafkaProperties properties;         // passed through to librdkafka
};

// One kernel (or CPU op) event, as the caller has it; strings are interned by the sender.
struct KernelEventInput {
  std::string name, category;
  int64_t ts_ns = 0, dur_ns = 0;
  int64_t stream = -1, correlation = -1;
  int64_t step = -1;
  uint64_t tid = 0;  // OS thread of a CPU event (0: not said)
};

// Counters since creation; a consistent-enough snapshot for metrics and tests.
struct CollectorStats {
  uint64_t steps_recorded = 0;
  uint64_t kernels_recorded = 0;
  uint64_t records_dropped = 0;     // steps + kernel events discarded (ring, buffer, pending)
  uint64_t batches_dropped = 0;     // serialized batches discarded while Kafka was away
  uint64_t batches_produced = 0;    // handed to librdkafka
  uint64_t batches_delivered = 0;   // acknowledged by the broker
  uint64_t batches_failed = 0;      // failed in librdkafka (e.g. message timeout)
  uint64_t buffered_bytes = 0;      // pending + in librdkafka, now
  uint64_t max_buffered_bytes = 0;  // the largest buffered_bytes seen
  uint64_t memory_bound_bytes = 0;  // memory_bound_bytes()
  ControlListenerStats control;     // the control channel's (zero without one)
  uint64_t control_replies = 0;     // replies queued for shipping
  uint64_t captures_sent = 0;       // captures handed to the sender
};

class Collector {
 public:
  // Validates the identity and options and starts the sender thread. Does not wait for the
  // broker: an unreachable broker is normal and only delays delivery.
  static absl::StatusOr<std::unique_ptr<Collector>> Create(CollectorIdentity identity,
                                                           CollectorOptions options);
  // Close(false, 2 s) if not closed yet.
  ~Collector();
  Collector(const Collector&) = delete;
  Collector& operator=(const Collector&) = delete;

  static uint64_t NowNs();  // CLOCK_MONOTONIC, the clock of every *_ns argument below

  // Opens step `step` at `now_ns`. Phases recorded since the previous EndStep belong to it
  // and its wall time starts at the earliest of them (a dataloader fetch before the step).
  void BeginStep(uint64_t step, uint64_t now_ns);
  // Closes the open step at `now_ns` and queues it; no-op when no step is open.
  void EndStep(uint64_t now_ns);
  // Adds [begin_ns, end_ns) to `phase` of the open step (or of the next one). Any thread.
  void AddPhase(StepPhase phase, uint64_t begin_ns, uint64_t end_ns);
  // Raises the open step's memory peaks to at least these values (0 = unknown). Any thread.
  void RecordMemory(uint64_t peak_allocated, uint64_t peak_reserved, uint64_t capacity);
  // The collectives this rank has issued so far on its default process group (cumulative):
  // each step that ends carries the latest value. Any thread.
  void RecordCollectives(uint64_t entered);
  // Copies `events` into the bounded kernel buffer (oldest dropped when full). Any thread.
  void RecordKernels(const std::vector<KernelEventInput>& events);

  // Ships everything recorded so far and waits until Kafka acknowledged it or `timeout`
  // passed (DeadlineExceeded then; the data stays queued).
  absl::Status Flush(std::chrono::milliseconds timeout);
  // Stops recording, ships what is left (a batch marked `final` when `final`, so the daemon
  // knows the rank ended cleanly) and waits up to `timeout` for delivery. Idempotent.
  absl::Status Close(bool final, std::chrono::milliseconds timeout);

  // Sets the training strategy and sharding that every batch sealed from now on carries in
  // its source identity. Any thread.
  void SetTrainingStrategy(std::string training_strategy, bool sharded);

  CollectorStats stats() const;
  // ring + kernel buffer + one capture's events + pending bytes + librdkafka queue bytes: what
  // the collector may hold.
  uint64_t memory_bound_bytes() const;
  // The identity, with the training strategy and sharding of now.
  CollectorIdentity identity() const;

  // --- the control channel ---------------------------------------------------------------
  // True when accepted control requests wait (one atomic load: call it every step).
  bool control_pending() const { return control_ != nullptr && control_->pending(); }
  // The accepted requests not taken yet, oldest first (each was answered ACCEPTED already).
  std::vector<v1::ControlRequest> TakeControlRequests();
  // Waits up to `timeout` for accepted stacks requests (each answered ACCEPTED already) and
  // takes them; empty after the timeout, or at once once the collector is closing. For a thread
  // of the caller's that is not the training thread. Any thread.
  std::vector<v1::ControlRequest> WaitStacksRequests(std::chrono::milliseconds timeout);
  // Makes every WaitStacksRequests caller return now (with nothing). Any thread.
  void WakeStacksWaiters();
  // Queues a reply (DONE, FAILED, REFUSED) for the next batch and wakes the sender. Any thread.
  void ReplyControl(v1::ControlReply reply);
  // Queues the events of capture `request_id` (their own batches, trace.capture_id set, at
  // most options.max_capture_events), followed by `done`, whose `events` it sets. Any thread.
  void SendCapture(const std::string& request_id, std::string source_format,
                   std::vector<KernelEventInput> events, v1::ControlReply done);

 private:
  Collector(CollectorIdentity identity, CollectorOptions options,
            std::unique_ptr<BatchPublisher> publisher);
  void SenderLoop();
  void RequestFlush();  // wakes the sender for a round now
  // Drains the ring and the kernel buffer into batches in `pending_`. Sender thread only.
  void Drain(bool final);
  // Hands pending batches to librdkafka until its queue is full. Sender thread only.
  void Produce();
  // While batches are pending, waits (blocked, not spinning) for delivery reports and
  // produces after each, until nothing is pending or `deadline`. Sender thread only.
  void DrainBacklog(std::chrono::steady_clock::time_point deadline);
  void SealBatch(v1::Batch* batch, uint64_t records);
  // Adds `events` to `batch` (its string table), sealing full batches on the way.
  void AppendKernels(v1::Batch* batch, const std::deque<KernelEventInput>& events,
                     const std::string& source_format, const std::string& capture_id);
  void UpdateBuffered();

  const CollectorIdentity identity_;  // its training_strategy and sharded: as created
  const CollectorOptions options_;
  mutable std::mutex strategy_mu_;
  std::string training_strategy_ ABSL_GUARDED_BY(strategy_mu_);
  bool sharded_ ABSL_GUARDED_BY(strategy_mu_) = false;
  std::unique_ptr<BatchPublisher> publisher_;

  // The open step, written by the training thread (and phases by any thread).
  std::atomic<uint64_t> phase_ns_[kStepPhaseCount] = {};
  std::atomic<uint32_t> phase_mask_{0};
  std::atomic<uint64_t> earliest_begin_ns_{UINT64_MAX};
  std::atomic<uint64_t> peak_allocated_{0}, peak_reserved_{0}, capacity_{0};
  std::atomic<uint64_t> collectives_entered_{0};
  bool step_open_ = false;
  uint64_t step_ = 0;
  uint64_t step_begin_ns_ = 0;

  BoundedRing<TimedStep> ring_;
  std::atomic<uint64_t> steps_recorded_{0};

  struct CaptureUpload {
    std::string request_id, source_format;
    std::deque<KernelEventInput> events;
    v1::ControlReply done;
  };
  mutable std::mutex control_mu_;
  // Set by Create, moved out (under control_mu_) by Close; a WaitStacksRequests caller holds
  // its own reference while it waits.
  std::shared_ptr<ControlListener> control_;
  std::vector<v1::ControlReply> replies_ ABSL_GUARDED_BY(control_mu_);
  std::deque<CaptureUpload> captures_ ABSL_GUARDED_BY(control_mu_);
  uint64_t control_replies_ ABSL_GUARDED_BY(control_mu_) = 0;
  uint64_t captures_sent_ ABSL_GUARDED_BY(control_mu_) = 0;
  mutable std::mutex kernels_mu_;
  std::deque<KernelEventInput> kernels_ ABSL_GUARDED_BY(kernels_mu_);
  uint64_t kernels_dropped_ ABSL_GUARDED_BY(kernels_mu_) = 0;
  std::atomic<uint64_t> kernels_recorded_{0};

  // Sender thread state.
  PendingBatches pending_;
  std::deque<size_t> inflight_sizes_;  // bytes of batches in librdkafka, oldest first
  uint64_t inflight_bytes_ = 0;
  uint64_t completed_seen_ = 0;
  uint64_t sequence_ = 0;
  uint64_t reported_dropped_ = 0;  // drops already written into a batch's dropped_records

  std::atomic<uint64_t> produced_{0};
  std::atomic<uint64_t> delivered_{0}, failed_{0};  // over every producer this had
  uint64_t base_delivered_ = 0, base_failed_ = 0;   // of replaced producers
  std::atomic<uint64_t> buffered_bytes_{0}, max_buffered_bytes_{0};
  std::atomic<uint64_t> pending_dropped_records_{0}, pending_dropped_batches_{0};
  std::atomic<uint64_t> idle_generation_{0};  // bumped when all data is shipped and acked

  std::mutex mu_;
  std::condition_variable wake_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool final_ ABSL_GUARDED_BY(mu_) = false;
  bool flush_requested_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<bool> closed_{false};
  std::thread sender_;
};

}  // namespace rankwatch
