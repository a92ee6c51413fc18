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
// Message size: no batch is larger than a Kafka message of options.max_message_bytes holds
// (librdkafka's message.max.bytes, default 1,000,000 bytes, a broker's and a topic's default
// too; wire/schema.h's MaxBatchPayloadBytes: the key and Kafka's overhead paid). Batches are
// sealed *before* a record, kernel event or reply would take them over it; a capture's events
// go in as many batches as they need, each tagged with the capture, its DONE reply after the
// last. A step record that alone would not fit (an op-heavy step) goes without its ops
// (counted in ops_oversized and ops_dropped). What still does not fit, or what the producer or
// the broker refuses as too large, is dropped: counted (messages_oversized, its records in
// records_dropped and the next batch's dropped_records) and logged once, never retried, and
// the producer is never recreated for it. The producer is recreated after other errors (a
// fatal idempotent-producer state) at most once a backoff (1 s doubling to 60 s); a batch that
// a fresh producer refuses too is dropped and counted.
//
// Ops (v1::OpRecord: forward compute of a microbatch, a pipeline send, the optimizer, a GC
// pause, ...) are recorded into the open step with AddOp or an OpScope: one push into a fixed
// BoundedRing of StepOps tagged with the step, at most options.max_ops_per_step a step (the
// rest dropped and counted). The sender writes them into the step's record, offsets in
// microseconds from the step's start (collectors/lib/step_ops.h). AddGcPause accounts a
// garbage-collection pause: gc_ns and gc_count of the step, and an OP_GC op when it is long.
// Pauses before the first step's first phase, op or BeginStep (the job's set-up: importing
// torch 2.x and building DDP collect for seconds) belong to no step: counted in
// gc_pauses_before_first_step, they neither start step 0 early nor add to its gc_ns.
//
// Device time (issue #48): on a GPU the host's clock reads around a phase or an op say when the
// host queued the work, not when the device did it. A caller that times the work on the device
// too (events recorded on its streams, read back a step or more later without waiting) calls
// ExpectDeviceTimes during the step; EndStep then holds the step back (a short deque under a
// mutex, not the ring) until SetDeviceTimes hands over its device times, and releases held
// steps into the ring in step order. A step whose device times do not come within
// options.device_hold_ms (the sender's next round after it), or that is the oldest of more than
// options.device_hold_steps held, goes with its host times, marked STEP_CLOCK_DEVICE_MISSING;
// Close sends every held step so. A step never marked goes through the ring as before (one
// relaxed load more on EndStep). Ops of held steps wait in the op ring.
//
// Control channel: with options.control_topic set, a ControlListener (its own thread and
// librdkafka consumer) reads the daemon's requests for this rank; the training loop polls
// control_pending() at step boundaries, takes the requests and acts on them, and the answers
// (ReplyControl, SendCapture) ship in the next batches.
//
// Thread-safety: BeginStep/EndStep, ExpectDeviceTimes, control_pending() and
// TakeControlRequests() from one thread (the training loop), which also closes the collector;
// AddPhase, AddOp, AddGcPause, SetDeviceTimes, RecordMemory, RecordKernels,
// SetTrainingStrategy, SetLayout, ReplyControl, SendCapture, identity(), stats() and Flush()
// from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "collectors/batch_publisher.h"
#include "collectors/lib/bounded_ring.h"
#include "collectors/lib/control_listener.h"
#include "collectors/lib/pending_batches.h"
#include "collectors/lib/step_ops.h"
#include "collectors/lib/timed_step.h"
#include "kafka/kafka_properties.h"
#include "wire/schema.h"

namespace rankwatch {

// Where a rank sits in its job's parallel layout (v1::ParallelLayout): its data-parallel
// replica, pipeline stage, and tensor-, context- and expert-parallel ranks, each below its
// size (1 = that kind of parallelism is not used). Data x pipeline x tensor x context sizes
// multiply to the world size (wire/parallel_layout.h).
struct RankLayout {
  uint32_t data_rank = 0, data_size = 1;
  uint32_t pipeline_rank = 0, pipeline_size = 1;  // the pipeline stage
  uint32_t tensor_rank = 0, tensor_size = 1;
  uint32_t context_rank = 0, context_size = 1;
  uint32_t expert_rank = 0, expert_size = 1;
  uint32_t virtual_stages = 1;  // model chunks per stage (interleaved 1F1B); 1 = not interleaved

  void ToProto(v1::ParallelLayout* out) const;
  bool operator==(const RankLayout&) const = default;
};

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
  // The rank's place in a pipeline / tensor / data parallel layout; none for flat data
  // parallelism. Collector::SetLayout sets it later (Megatron initialises its layout after the
  // collector starts).
  std::optional<RankLayout> layout;
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
  // The largest Kafka message produced (librdkafka's message.max.bytes; a property of that name
  // wins): set it to the brokers' and the topic's limit. At least kMinMaxMessageBytes (16 KiB);
  // batches are sealed below it (see the class comment), and at most at the wire's 4 MiB.
  size_t max_message_bytes = kDefaultMaxMessageBytes;  // default: 1,000,000 bytes
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
  // Ops kept per step (AddOp, OpScope, AddGcPause); later ones are dropped and counted. At most
  // the wire's BatchLimits::max_ops_per_step (4,096).
  size_t max_ops_per_step = 4096;  // default: 4,096
  // Ops waiting for the sender (all steps); the oldest are dropped when it falls behind.
  size_t op_ring_capacity = 65536;  // default: 65,536 ops (40 bytes each; rounded up to 2^n)
  // The caller reports every garbage-collection pause (AddGcPause): each step then carries
  // gc_ns and gc_count, 0 when it had none. Without it only steps with a pause carry them.
  bool watch_gc = false;  // default: false (the Python package sets it)
  // A GC pause at least this long is also an OP_GC op of its step; shorter ones count in
  // gc_ns / gc_count only (CPython collects its youngest generation hundreds of times a step,
  // for tens of microseconds each: an op for each would cost more bytes than it tells).
  uint64_t gc_op_min_ns = 1'000'000;  // default: 1 ms
  KafkaProperties properties;         // passed through to librdkafka
  // A step marked ExpectDeviceTimes waits at most this long (and the sender's next round) for
  // its device times (SetDeviceTimes); then it goes with its host times, marked
  // STEP_CLOCK_DEVICE_MISSING. Positive.
  int device_hold_ms = 10000;  // default: 10 s
  // Steps held for their device times at most (and the host-only steps behind them): EndStep
  // sends the oldest with its host times when more are held. At least 1.
  size_t device_hold_steps = 16;  // default: 16
};

// A step's device times (Collector::SetDeviceTimes): its phases timed on the device, its ops'
// device times by their index within the step (AddOp's result), on the collector's clock.
struct DeviceTimes {
  DevicePhases phases;            // the dataloader is host work: ignored
  std::vector<DeviceOpTime> ops;  // an index the step does not have is ignored
  // The events had not completed in time: the step goes with its host times, marked
  // STEP_CLOCK_DEVICE_MISSING (phases and ops are ignored).
  bool missing = false;
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
  uint64_t ops_recorded = 0;        // ops taken into their step (within max_ops_per_step)
  uint64_t ops_dropped = 0;         // over max_ops_per_step, or lost with their step
  uint64_t gc_pauses = 0;           // AddGcPause calls
  uint64_t gc_pauses_before_first_step = 0;  // of those, in no step (see AddGcPause)
  // Batches dropped because they would not fit a Kafka message of max_message_bytes (sealed
  // too large, a control reply too large alone, refused by the producer or the broker); their
  // records count in records_dropped.
  uint64_t messages_oversized = 0;
  // Ops dropped from step records that alone would not fit a message (also in ops_dropped).
  uint64_t ops_oversized = 0;
  uint64_t producer_restarts = 0;  // Kafka producers recreated after a fatal error
  // Steps marked ExpectDeviceTimes released with their device times; released with host times
  // only (missing, past device_hold_ms or device_hold_steps, or at Close); and SetDeviceTimes
  // calls that found no held step of theirs (already released, or never held).
  uint64_t device_steps = 0;
  uint64_t device_steps_missing = 0;
  uint64_t device_times_late = 0;
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
  // Adds op [begin_ns, end_ns) of `type`, `microbatch` and model `chunk` to the open step (or
  // the next one, whose start it may then be, as with AddPhase). Past max_ops_per_step ops in
  // a step it is dropped and counted. Returns the op's index within its step (what
  // SetDeviceTimes names it by), or -1 when dropped. Any thread; never blocks or allocates.
  int AddOp(v1::OpType type, uint32_t microbatch, uint32_t chunk, uint64_t begin_ns,
            uint64_t end_ns);
  // Accounts a garbage-collection pause [begin_ns, end_ns) to the open (or next) step: its
  // gc_ns and gc_count, and an OP_GC op when it lasts at least options.gc_op_min_ns. Any thread.
  void AddGcPause(uint64_t begin_ns, uint64_t end_ns);

  // The open step's device times will follow (SetDeviceTimes): its EndStep holds it back
  // until they come (or its deadline). Training thread, while the step is open (or before it
  // opens: then it marks the next step to end).
  void ExpectDeviceTimes() { expect_device_ = true; }
  // Hands over the device times of step `step` (its BeginStep number; a step marked
  // ExpectDeviceTimes and ended), and releases the held steps that can go, in step order.
  // False when no held step has that number: already released with its host times (its
  // deadline passed) or never marked; counted in device_times_late. Any thread.
  bool SetDeviceTimes(uint64_t step, const DeviceTimes& times);

  // Ships everything recorded so far and waits until Kafka acknowledged it or `timeout`
  // passed (DeadlineExceeded then; the data stays queued). Steps held for their device times
  // are not waited for: they go when their times come, at their deadline, or at Close.
  absl::Status Flush(std::chrono::milliseconds timeout);
  // Stops recording, ships what is left (a batch marked `final` when `final`, so the daemon
  // knows the rank ended cleanly; held steps with their host times, marked
  // STEP_CLOCK_DEVICE_MISSING) and waits up to `timeout` for delivery. Idempotent.
  absl::Status Close(bool final, std::chrono::milliseconds timeout);

  // Sets the training strategy and sharding that every batch sealed from now on carries in
  // its source identity. Any thread.
  void SetTrainingStrategy(std::string training_strategy, bool sharded);
  // Sets the rank's place in the parallel layout that every batch sealed from now on carries;
  // InvalidArgument (nothing changes) when it does not fit the world size. Any thread.
  absl::Status SetLayout(const RankLayout& layout);

  CollectorStats stats() const;
  // The message.max.bytes in effect (options.max_message_bytes, or the property that overrides
  // it), the serialized bytes a batch may have (its MaxBatchPayloadBytes), and what one control
  // reply may have so that a batch carries it: replies larger
  // than that are dropped (counted in messages_oversized). Any thread.
  size_t max_message_bytes() const { return max_message_bytes_; }
  size_t max_batch_bytes() const { return max_batch_bytes_; }
  size_t max_reply_bytes() const;
  // ring + kernel buffer + one capture's events + pending bytes + librdkafka queue bytes: what
  // the collector may hold.
  uint64_t memory_bound_bytes() const;
  // The identity, with the training strategy, sharding and layout of now.
  CollectorIdentity identity() const;

  // --- the control channel ---------------------------------------------------------------
  // True when accepted control requests wait (one atomic load: call it every step).
  bool control_pending() const { return control_ != nullptr && control_->pending(); }
  // The accepted requests not taken yet, oldest first (each was answered ACCEPTED already).
  std::vector<v1::ControlRequest> TakeControlRequests();
  // Waits up to `timeout` for accepted stacks requests (each answered ACCEPTED already) and
  // takes them; empty after the timeout, or at once once the collector is closing. Without a
  // control channel it waits out the timeout (no request can come). For a thread of the
  // caller's that is not the training thread. Any thread.
  std::vector<v1::ControlRequest> WaitStacksRequests(std::chrono::milliseconds timeout);
  // Makes every WaitStacksRequests caller return now (with nothing). Any thread.
  void WakeStacksWaiters();
  // Queues a reply (DONE, FAILED, REFUSED) for the next batch and wakes the sender. Any thread.
  void ReplyControl(v1::ControlReply reply);
  // Queues the events of capture `request_id` (their own batches, trace.capture_id set, at
  // most options.max_capture_events, as many batches as the message size needs, sealed as the
  // pending bytes have room), followed by `done`, whose `events` it sets. Any thread.
  void SendCapture(const std::string& request_id, std::string source_format,
                   std::vector<KernelEventInput> events, v1::ControlReply done);

 private:
  Collector(CollectorIdentity identity, CollectorOptions options,
            std::unique_ptr<BatchPublisher> publisher);
  void SenderLoop();
  void RequestFlush();  // wakes the sender for a round now
  // A batch the sender is filling: an upper bound of its serialized bytes beyond its envelope
  // (identity, trace labels, counters), the room it has, its string table and its labels.
  struct Filling {
    v1::Batch batch;
    size_t bytes = 0;
    size_t budget = 0;
    std::unordered_map<std::string, uint32_t> interned;
    std::string source_format, capture_id;  // its trace's, when it carries kernel events
    bool empty() const {
      return batch.steps_size() == 0 && batch.kernels_size() == 0 &&
             batch.control_replies_size() == 0;
    }
  };
  // Drains the ring, the kernel buffer, the captures (as far as the pending bytes have room)
  // and the replies into batches in `pending_`; the last batch is final when `final` and no
  // capture is left. Returns whether a capture is left for the next round. Sender thread only.
  bool Drain(bool final);
  // Hands pending batches to librdkafka until its queue is full. Sender thread only.
  void Produce();
  // While batches are pending, waits (blocked, not spinning) for delivery reports and
  // produces after each, until nothing is pending or `deadline`. Sender thread only.
  void DrainBacklog(std::chrono::steady_clock::time_point deadline);
  // The identity every batch carries that does not change (the job, rank, scheduler...), with
  // `pid` (EnvelopeBytes: the largest).
  void FillIdentity(uint32_t pid, v1::SourceIdentity* src) const;
  // The serialized bytes of a batch's envelope with these trace labels, at most.
  size_t EnvelopeBytes(const std::string& source_format, const std::string& capture_id) const;

  // Starts `f` afresh for batches labelled so (its budget: max_batch_bytes_ less the envelope).
  void StartFilling(Filling* f, const std::string& source_format, const std::string& capture_id);
  // Seals `f` into pending_ (or drops it, counted, when it came out too large) and empties it.
  void SealBatch(Filling* f);
  // Adds events[from...] to `f` until it is full; returns the index of the first event left.
  // Adds at least one event to an empty batch.
  size_t FillKernels(Filling* f, const std::deque<KernelEventInput>& events, size_t from);
  // Counts a batch of `records` dropped as too large and warns, once a collector.
  void DropOversized(uint64_t records, size_t bytes, const char* what);
  void UpdateBuffered();
  // Moves the ops of step `generation` from the op ring into `out` (cleared first), dropping
  // (and counting) those of older steps. Sender thread only.
  void TakeOps(uint64_t generation, std::vector<StepOp>* out);
  // AddOp without marking the steps started (AddGcPause's ops).
  int AddStepOp(v1::OpType type, uint32_t microbatch, uint32_t chunk, uint64_t begin_ns,
                uint64_t end_ns);

  // --- device time ---------------------------------------------------------------------
  // A released device-timed step's device times, waiting for the sender (by generation).
  struct DeviceRecord {
    uint64_t generation = 0;
    DevicePhases phases;
    std::vector<DeviceOpTime> ops;
  };
  // A step held back by EndStep: marked ExpectDeviceTimes (`expect`), or a host-only step
  // behind one (complete at once, so that steps reach the ring in order).
  struct HeldStep {
    TimedStep step;
    uint64_t held_at_ns = 0;  // NowNs() at EndStep: its deadline counts from here
    bool expect = false;
    bool complete = false;  // its device times came (or it needs none)
    bool missing = false;   // they came marked missing
    DeviceRecord device;
  };
  // EndStep's path for a step marked ExpectDeviceTimes, or when steps are held.
  void HoldStep(const TimedStep& s, bool expect);
  // Releases held steps from the front while they are complete; with `now_ns` (monotonic, not
  // 0), also incomplete ones held device_hold_ms or longer by then (their host times, marked
  // missing); with `all`, every one. Returns how many it released.
  size_t ReleaseHeldLocked(uint64_t now_ns, bool all) ABSL_EXCLUSIVE_LOCKS_REQUIRED(device_mu_);
  // Pushes the front held step into the ring (its device times to device_released_).
  void ReleaseFrontLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(device_mu_);
  // Releases the held steps past their deadline (all of them with `all`). Sender thread, Close.
  void ReleaseOverdue(bool all);
  // Moves the device times of step `generation` into `*out`, dropping older ones (of steps the
  // ring dropped); false when it has none. Sender thread only.
  bool TakeDeviceRecord(uint64_t generation, DeviceRecord* out);

  const CollectorIdentity identity_;  // its training_strategy, sharded and layout: as created
  const CollectorOptions options_;
  // The parts of the identity that change after creation.
  mutable std::mutex identity_mu_;
  std::string training_strategy_ ABSL_GUARDED_BY(identity_mu_);
  bool sharded_ ABSL_GUARDED_BY(identity_mu_) = false;
  std::optional<RankLayout> layout_ ABSL_GUARDED_BY(identity_mu_);
  std::unique_ptr<BatchPublisher> publisher_;

  // The open step, written by the training thread (and phases by any thread).
  std::atomic<uint64_t> phase_ns_[kStepPhaseCount] = {};
  std::atomic<uint32_t> phase_mask_{0};
  std::atomic<uint64_t> earliest_begin_ns_{UINT64_MAX};
  std::atomic<uint64_t> peak_allocated_{0}, peak_reserved_{0}, capacity_{0};
  std::atomic<uint64_t> collectives_entered_{0};
  std::atomic<uint64_t> gc_ns_{0};
  std::atomic<uint32_t> gc_count_{0};
  std::atomic<uint64_t> gc_pauses_{0};
  std::atomic<uint64_t> gc_pauses_before_first_step_{0};
  // Set by the first BeginStep, AddPhase or AddOp: GC pauses before it are the set-up's.
  std::atomic<bool> steps_started_{false};
  // Ops: the open step's generation (steps ended so far) and its ops so far.
  std::atomic<uint64_t> op_generation_{0};
  std::atomic<uint32_t> ops_in_step_{0};
  BoundedRing<StepOp> op_ring_;
  std::atomic<uint64_t> ops_recorded_{0};
  std::atomic<uint64_t> ops_over_limit_{0};  // past max_ops_per_step
  std::atomic<uint64_t> ops_lost_{0};        // their step dropped, or lost in the op ring
  bool step_open_ = false;
  uint64_t step_ = 0;
  uint64_t step_begin_ns_ = 0;
  bool expect_device_ = false;  // ExpectDeviceTimes for the open step (training thread)

  // Device time: steps held for their device times, oldest first; the device times of
  // released steps, waiting for the sender (at most op_ring_capacity op times in all: past it
  // the oldest steps' op times are dropped, and those ops keep host times only).
  mutable std::mutex device_mu_;
  std::deque<HeldStep> held_ ABSL_GUARDED_BY(device_mu_);
  std::deque<DeviceRecord> device_released_ ABSL_GUARDED_BY(device_mu_);
  size_t device_released_ops_ ABSL_GUARDED_BY(device_mu_) = 0;
  std::atomic<size_t> held_count_{0};  // held_.size(), for EndStep and the sender's look
  std::atomic<uint64_t> device_steps_{0}, device_steps_missing_{0}, device_times_late_{0};
  DeviceRecord sender_device_;  // the device times of the step being written (sender thread)

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
  // WaitStacksRequests callers without a control channel wait here until their timeout, a
  // WakeStacksWaiters (which counts stacks_wakes_ up) or Close.
  std::condition_variable stacks_idle_;
  uint64_t stacks_wakes_ ABSL_GUARDED_BY(control_mu_) = 0;
  std::vector<v1::ControlReply> replies_ ABSL_GUARDED_BY(control_mu_);
  std::deque<CaptureUpload> captures_ ABSL_GUARDED_BY(control_mu_);
  uint64_t control_replies_ ABSL_GUARDED_BY(control_mu_) = 0;
  uint64_t captures_sent_ ABSL_GUARDED_BY(control_mu_) = 0;
  mutable std::mutex kernels_mu_;
  std::deque<KernelEventInput> kernels_ ABSL_GUARDED_BY(kernels_mu_);
  uint64_t kernels_dropped_ ABSL_GUARDED_BY(kernels_mu_) = 0;
  std::atomic<uint64_t> kernels_recorded_{0};

  // Sender thread state.
  std::vector<StepOp> step_ops_;  // the ops of the step being written
  StepOp next_op_;                // popped from the op ring, of a later step
  bool have_next_op_ = false;
  PendingBatches pending_;
  std::deque<size_t> inflight_sizes_;  // bytes of batches in librdkafka, oldest first
  uint64_t inflight_bytes_ = 0;
  uint64_t completed_seen_ = 0;
  uint64_t sequence_ = 0;
  uint64_t reported_dropped_ = 0;  // drops already written into a batch's dropped_records
  // The capture being cut into batches and its next event; set while it has events left.
  std::optional<CaptureUpload> capture_;
  size_t capture_next_ = 0;
  bool capture_left_ = false;  // Drain's result: a capture waits for the next round
  // Consecutive fatal publish errors of the front pending batch, and when the producer may
  // be recreated next (the backoff doubles from 1 s to 60 s; reset once a producer delivers).
  int front_failures_ = 0;
  std::chrono::steady_clock::time_point next_recreate_{};
  std::chrono::milliseconds recreate_backoff_{1000};
  uint64_t base_pub_oversized_ = 0, base_pub_failed_records_ = 0;  // of replaced producers

  std::atomic<uint64_t> produced_{0};
  std::atomic<uint64_t> delivered_{0}, failed_{0};  // over every producer this had
  uint64_t base_delivered_ = 0, base_failed_ = 0;   // of replaced producers
  std::atomic<uint64_t> buffered_bytes_{0}, max_buffered_bytes_{0};
  std::atomic<uint64_t> pending_dropped_records_{0}, pending_dropped_batches_{0};
  std::atomic<uint64_t> idle_generation_{0};  // bumped when all data is shipped and acked
  const size_t max_message_bytes_;            // message.max.bytes in effect
  const size_t max_batch_bytes_;              // MaxBatchPayloadBytes of it
  // Oversized: batches dropped by the sender (sealed too large, a reply too large, refused by
  // produce()), their records; the producers' count (produce() refusals and the broker's) and
  // the records of their failed deliveries, as of the sender's last round.
  std::atomic<uint64_t> sender_oversized_{0}, oversized_records_{0};
  std::atomic<uint64_t> pub_oversized_{0}, failed_records_{0};
  std::atomic<uint64_t> unsendable_batches_{0};  // refused by a fresh producer too: dropped
  std::atomic<uint64_t> ops_oversized_{0};
  std::atomic<uint64_t> producer_restarts_{0};
  std::atomic<bool> warned_oversized_{false}, warned_ops_cut_{false}, warned_unsendable_{false};

  std::mutex mu_;
  std::condition_variable wake_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool final_ ABSL_GUARDED_BY(mu_) = false;
  bool flush_requested_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<bool> closed_{false};
  std::thread sender_;
};

// Times one op of the open step, from construction to destruction (Collector::AddOp):
//   { OpScope op(collector, v1::OP_FORWARD_COMPUTE, microbatch); model.forward(...); }
// Not thread-safe; the collector must outlive it.
class OpScope {
 public:
  OpScope(Collector* collector, v1::OpType type, uint32_t microbatch = 0, uint32_t chunk = 0)
      : collector_(collector),
        type_(type),
        microbatch_(microbatch),
        chunk_(chunk),
        begin_ns_(Collector::NowNs()) {}
  ~OpScope() { collector_->AddOp(type_, microbatch_, chunk_, begin_ns_, Collector::NowNs()); }
  OpScope(const OpScope&) = delete;
  OpScope& operator=(const OpScope&) = delete;

 private:
  Collector* collector_;
  v1::OpType type_;
  uint32_t microbatch_, chunk_;
  uint64_t begin_ns_;
};

}  // namespace rankwatch
