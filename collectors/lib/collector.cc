#include "collectors/lib/collector.h"

#include <pthread.h>
#include <spdlog/spdlog.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <unordered_map>

#include "common/wall_clock.h"
#include "wire/parallel_layout.h"
#include "wire/schema.h"

#ifndef RANKWATCH_VERSION
#define RANKWATCH_VERSION "0"
#endif

namespace rankwatch {
namespace {

constexpr size_t kMaxBatchSteps = 4096;
constexpr size_t kMaxBatchKernels = 50000;
constexpr size_t kMaxKernelString = 256;  // longer kernel names are truncated
constexpr size_t kMaxSourceFormat = 64;   // a capture's source format is cut to this
// Each cap is within the wire's limit of the same kind, so that no batch is rejected for it;
// bytes are bounded by max_message_bytes (MaxBatchPayloadBytes, at most the wire's 4 MiB).
static_assert(kMaxBatchSteps <= BatchLimits{}.max_steps);
static_assert(kMaxBatchKernels <= BatchLimits{}.max_kernels);
static_assert(kMaxKernelString <= BatchLimits{}.max_string_bytes);
static_assert(kMinMaxMessageBytes > 4 * kKafkaMessageOverheadBytes);
// librdkafka's upper bound of message.max.bytes.
constexpr size_t kMaxMaxMessageBytes = 1'000'000'000;
// The producer is recreated after a fatal error at most once in this (doubling from the first).
constexpr std::chrono::milliseconds kFirstRecreateBackoff{1000};
constexpr std::chrono::milliseconds kMaxRecreateBackoff{60'000};
// A batch that fails this many times in a row, a fresh producer in between, is dropped.
constexpr int kMaxFatalFailuresPerBatch = 2;

void AtomicMax(std::atomic<uint64_t>& a, uint64_t v) {
  uint64_t cur = a.load(std::memory_order_relaxed);
  while (v > cur && !a.compare_exchange_weak(cur, v, std::memory_order_relaxed)) {
  }
}

void AtomicMin(std::atomic<uint64_t>& a, uint64_t v) {
  uint64_t cur = a.load(std::memory_order_relaxed);
  while (v < cur && !a.compare_exchange_weak(cur, v, std::memory_order_relaxed)) {
  }
}

PublisherOptions ToPublisherOptions(const CollectorOptions& o) {
  PublisherOptions po;
  po.brokers = o.brokers;
  po.topic = o.topic;
  po.compression = o.compression;
  po.queue_max_messages = o.kafka_queue_max_messages;
  po.when_full = PublisherOptions::WhenFull::kDropNewest;
  po.client_id = "rankwatch-collector";
  po.max_message_bytes = static_cast<int>(o.max_message_bytes);
  po.properties = {{"queue.buffering.max.kbytes", std::to_string(o.kafka_queue_max_kbytes)},
                   {"message.timeout.ms", std::to_string(o.message_timeout_ms)}};
  for (const auto& [k, v] : o.properties) po.properties[k] = v;
  return po;
}

std::string LayoutError(const RankLayout& layout, uint32_t world_size) {
  v1::ParallelLayout wire;
  layout.ToProto(&wire);
  return ParallelLayoutError(wire, world_size);
}

}  // namespace

void RankLayout::ToProto(v1::ParallelLayout* out) const {
  out->set_data_rank(data_rank);
  out->set_data_size(data_size);
  out->set_pipeline_rank(pipeline_rank);
  out->set_pipeline_size(pipeline_size);
  out->set_tensor_rank(tensor_rank);
  out->set_tensor_size(tensor_size);
  out->set_context_rank(context_rank);
  out->set_context_size(context_size);
  out->set_expert_rank(expert_rank);
  out->set_expert_size(expert_size);
  out->set_virtual_stages(virtual_stages);
}

uint64_t Collector::NowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1'000'000'000 + uint64_t(ts.tv_nsec);
}

absl::StatusOr<std::unique_ptr<Collector>> Collector::Create(CollectorIdentity identity,
                                                             CollectorOptions options) {
  if (identity.training_job.empty()) return absl::InvalidArgumentError("training job is required");
  if (identity.world_size == 0 || identity.rank >= identity.world_size) {
    return absl::InvalidArgumentError("rank " + std::to_string(identity.rank) +
                                      " is not below world size " +
                                      std::to_string(identity.world_size));
  }
  if (options.flush_interval_ms <= 0 || options.step_ring_capacity == 0 ||
      options.max_pending_bytes == 0 || options.kafka_queue_max_messages <= 0 ||
      options.kafka_queue_max_kbytes <= 0) {
    return absl::InvalidArgumentError("collector buffer sizes and intervals must be positive");
  }
  if (identity.layout) {
    if (std::string e = LayoutError(*identity.layout, identity.world_size); !e.empty()) {
      return absl::InvalidArgumentError(e);
    }
  }
  if (options.max_ops_per_step > BatchLimits{}.max_ops_per_step || options.op_ring_capacity == 0) {
    return absl::InvalidArgumentError("max_ops_per_step must be at most " +
                                      std::to_string(BatchLimits{}.max_ops_per_step) +
                                      " (the wire's limit) and op_ring_capacity positive");
  }
  if (options.max_message_bytes < kMinMaxMessageBytes ||
      options.max_message_bytes > kMaxMaxMessageBytes) {
    return absl::InvalidArgumentError(
        "max_message_bytes must be between " + std::to_string(kMinMaxMessageBytes) + " and " +
        std::to_string(kMaxMaxMessageBytes) + ", not " + std::to_string(options.max_message_bytes));
  }
  if (options.device_hold_ms <= 0 || options.device_hold_steps == 0) {
    return absl::InvalidArgumentError("device_hold_ms and device_hold_steps must be positive");
  }
  if (options.kafka_queue_max_messages > kIdempotentInflightWindow) {
    return absl::InvalidArgumentError("kafka_queue_max_messages must be at most " +
                                      std::to_string(kIdempotentInflightWindow) +
                                      " (librdkafka spins while more wait behind a hung broker)");
  }
  if (identity.pid == 0) identity.pid = static_cast<uint32_t>(getpid());
  auto publisher = BatchPublisher::Create(ToPublisherOptions(options));
  if (!publisher.ok()) return publisher.status();
  if ((*publisher)->max_message_bytes() < kMinMaxMessageBytes) {
    return absl::InvalidArgumentError("message.max.bytes must be at least " +
                                      std::to_string(kMinMaxMessageBytes));
  }
  std::unique_ptr<Collector> c(
      new Collector(std::move(identity), std::move(options), std::move(*publisher)));
  if (!c->options_.control_topic.empty()) {
    ControlListenerOptions lo;
    lo.brokers = c->options_.brokers;
    lo.topic = c->options_.control_topic;
    lo.training_job = c->identity_.training_job;
    lo.rank = c->identity_.rank;
    lo.properties = c->options_.properties;
    if (!c->options_.take_captures) lo.limits.max_capture_steps = 0;
    if (!c->options_.take_stacks) lo.limits.max_stack_frames = 0;
    Collector* raw = c.get();
    auto listener = ControlListener::Start(
        std::move(lo), [raw](v1::ControlReply r) { raw->ReplyControl(std::move(r)); });
    if (listener.ok()) {
      c->control_ = std::move(*listener);
    } else {
      spdlog::warn("rankwatch collector: no control channel: {}",
                   std::string(listener.status().message()));
    }
  }
  return c;
}

Collector::Collector(CollectorIdentity identity, CollectorOptions options,
                     std::unique_ptr<BatchPublisher> publisher)
    : identity_(std::move(identity)),
      options_(std::move(options)),
      training_strategy_(identity_.training_strategy),
      sharded_(identity_.sharded),
      layout_(identity_.layout),
      publisher_(std::move(publisher)),
      op_ring_(options_.op_ring_capacity),
      ring_(options_.step_ring_capacity),
      pending_(options_.max_pending_bytes),
      max_message_bytes_(publisher_->max_message_bytes()),
      max_batch_bytes_(publisher_->max_batch_bytes()) {
  sender_ = std::thread([this] { SenderLoop(); });
}

void Collector::SetTrainingStrategy(std::string training_strategy, bool sharded) {
  std::lock_guard<std::mutex> lock(identity_mu_);
  training_strategy_ = std::move(training_strategy);
  sharded_ = sharded;
}

absl::Status Collector::SetLayout(const RankLayout& layout) {
  if (std::string e = LayoutError(layout, identity_.world_size); !e.empty()) {
    return absl::InvalidArgumentError(e);
  }
  std::lock_guard<std::mutex> lock(identity_mu_);
  layout_ = layout;
  return absl::OkStatus();
}

CollectorIdentity Collector::identity() const {
  CollectorIdentity id = identity_;
  std::lock_guard<std::mutex> lock(identity_mu_);
  id.training_strategy = training_strategy_;
  id.sharded = sharded_;
  id.layout = layout_;
  return id;
}

Collector::~Collector() { (void)Close(false, std::chrono::seconds(2)); }

void Collector::BeginStep(uint64_t step, uint64_t now_ns) {
  steps_started_.store(true, std::memory_order_relaxed);
  step_ = step;
  step_begin_ns_ =
      std::min(now_ns, earliest_begin_ns_.exchange(UINT64_MAX, std::memory_order_relaxed));
  step_open_ = true;
}

void Collector::EndStep(uint64_t now_ns) {
  if (!step_open_) return;
  step_open_ = false;
  TimedStep s;
  s.step = step_;
  s.step_time_ns = now_ns > step_begin_ns_ ? now_ns - step_begin_ns_ : 0;
  s.end_unix_ns = WallNowUnixNs();
  for (int i = 0; i < kStepPhaseCount; ++i) {
    s.phase_ns[i] = phase_ns_[i].exchange(0, std::memory_order_relaxed);
  }
  s.phase_mask = phase_mask_.exchange(0, std::memory_order_relaxed);
  s.peak_allocated_bytes = peak_allocated_.exchange(0, std::memory_order_relaxed);
  s.peak_reserved_bytes = peak_reserved_.exchange(0, std::memory_order_relaxed);
  s.device_capacity_bytes = capacity_.exchange(0, std::memory_order_relaxed);
  s.collectives_entered = collectives_entered_.load(std::memory_order_relaxed);
  s.begin_ns = step_begin_ns_;
  s.end_ns = now_ns;
  s.gc_ns = gc_ns_.exchange(0, std::memory_order_relaxed);
  s.gc_count = gc_count_.exchange(0, std::memory_order_relaxed);
  s.gc_watched = options_.watch_gc;
  // Ops recorded from here on belong to the next step.
  s.ops = std::min<uint32_t>(ops_in_step_.exchange(0, std::memory_order_relaxed),
                             static_cast<uint32_t>(options_.max_ops_per_step));
  s.generation = op_generation_.fetch_add(1, std::memory_order_relaxed);
  earliest_begin_ns_.store(UINT64_MAX, std::memory_order_relaxed);
  // Held: its device times follow, or steps held before it must reach the ring first. With
  // none held, none is released concurrently either (only EndStep holds steps): straight in.
  if (expect_device_ || held_count_.load(std::memory_order_acquire) != 0) {
    HoldStep(s, expect_device_);
    expect_device_ = false;
  } else {
    ring_.PushDropOldest(s);
  }
  steps_recorded_.fetch_add(1, std::memory_order_relaxed);
}

void Collector::HoldStep(const TimedStep& s, bool expect) {
  HeldStep h;
  h.step = s;
  h.held_at_ns = NowNs();
  h.expect = expect;
  h.complete = !expect;
  h.device.generation = s.generation;
  std::lock_guard<std::mutex> lock(device_mu_);
  held_.push_back(std::move(h));
  // Too many held: the oldest goes with its host times, then whatever is complete behind it.
  while (held_.size() > options_.device_hold_steps) {
    ReleaseFrontLocked();
    ReleaseHeldLocked(0, false);
  }
  ReleaseHeldLocked(0, false);  // a host-only step with nothing held before it any more
  held_count_.store(held_.size(), std::memory_order_release);
}

void Collector::ReleaseFrontLocked() {
  HeldStep& h = held_.front();
  if (h.expect) {
    if (h.complete && !h.missing) {
      h.step.clock = v1::STEP_CLOCK_DEVICE;
      device_released_ops_ += h.device.ops.size();
      device_released_.push_back(std::move(h.device));
      // Records beyond the ring's capacity are of steps the ring dropped (the oldest).
      while (device_released_.size() > ring_.capacity()) {
        device_released_ops_ -= device_released_.front().ops.size();
        device_released_.pop_front();
      }
      // Past op_ring_capacity op times the oldest steps' ops keep their host times only.
      for (auto it = device_released_.begin();
           device_released_ops_ > options_.op_ring_capacity && it != device_released_.end(); ++it) {
        device_released_ops_ -= it->ops.size();
        std::vector<DeviceOpTime>().swap(it->ops);
      }
      device_steps_.fetch_add(1, std::memory_order_relaxed);
    } else {
      h.step.clock = v1::STEP_CLOCK_DEVICE_MISSING;
      device_steps_missing_.fetch_add(1, std::memory_order_relaxed);
    }
  }
  ring_.PushDropOldest(h.step);
  held_.pop_front();
}

size_t Collector::ReleaseHeldLocked(uint64_t now_ns, bool all) {
  const uint64_t hold_ns = uint64_t(options_.device_hold_ms) * 1'000'000;
  size_t released = 0;
  while (!held_.empty()) {
    const HeldStep& h = held_.front();
    const bool overdue = now_ns != 0 && now_ns - h.held_at_ns >= hold_ns;
    if (!all && !h.complete && !overdue) break;
    ReleaseFrontLocked();
    ++released;
  }
  return released;
}

void Collector::ReleaseOverdue(bool all) {
  if (!all && held_count_.load(std::memory_order_acquire) == 0) return;
  const uint64_t now = NowNs();
  std::lock_guard<std::mutex> lock(device_mu_);
  ReleaseHeldLocked(now, all);
  held_count_.store(held_.size(), std::memory_order_release);
}

bool Collector::SetDeviceTimes(uint64_t step, const DeviceTimes& times) {
  std::vector<DeviceOpTime> ops;
  if (!times.missing) ops = times.ops;  // copied outside the lock
  std::lock_guard<std::mutex> lock(device_mu_);
  auto it = std::find_if(held_.begin(), held_.end(), [step](const HeldStep& h) {
    return h.expect && !h.complete && h.step.step == step;
  });
  if (it == held_.end()) {
    device_times_late_.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  it->complete = true;
  it->missing = times.missing;
  if (!times.missing) {
    it->device.phases = times.phases;
    // The dataloader is host work; bits past the phases mean nothing.
    it->device.phases.phase_mask &=
        ((1u << kStepPhaseCount) - 1) & ~(1u << static_cast<int>(StepPhase::kDataloader));
    // The ops the step kept: indexes below its count, at most one time each.
    const uint32_t kept = it->step.ops;
    ops.erase(std::remove_if(ops.begin(), ops.end(),
                             [kept](const DeviceOpTime& d) { return d.op_index >= kept; }),
              ops.end());
    if (ops.size() > kept) ops.resize(kept);
    it->device.ops = std::move(ops);
  }
  ReleaseHeldLocked(0, false);
  held_count_.store(held_.size(), std::memory_order_release);
  return true;
}

bool Collector::TakeDeviceRecord(uint64_t generation, DeviceRecord* out) {
  std::lock_guard<std::mutex> lock(device_mu_);
  while (!device_released_.empty() && device_released_.front().generation < generation) {
    device_released_ops_ -= device_released_.front().ops.size();  // its step was dropped
    device_released_.pop_front();
  }
  if (device_released_.empty() || device_released_.front().generation != generation) return false;
  device_released_ops_ -= device_released_.front().ops.size();
  *out = std::move(device_released_.front());
  device_released_.pop_front();
  return true;
}

void Collector::AddPhase(StepPhase phase, uint64_t begin_ns, uint64_t end_ns) {
  const int i = static_cast<int>(phase);
  phase_ns_[i].fetch_add(end_ns > begin_ns ? end_ns - begin_ns : 0, std::memory_order_relaxed);
  phase_mask_.fetch_or(1u << i, std::memory_order_relaxed);
  steps_started_.store(true, std::memory_order_relaxed);
  AtomicMin(earliest_begin_ns_, begin_ns);
}

int Collector::AddOp(v1::OpType type, uint32_t microbatch, uint32_t chunk, uint64_t begin_ns,
                     uint64_t end_ns) {
  steps_started_.store(true, std::memory_order_relaxed);
  return AddStepOp(type, microbatch, chunk, begin_ns, end_ns);
}

int Collector::AddStepOp(v1::OpType type, uint32_t microbatch, uint32_t chunk, uint64_t begin_ns,
                         uint64_t end_ns) {
  const uint32_t index = ops_in_step_.fetch_add(1, std::memory_order_relaxed);
  if (index >= options_.max_ops_per_step) {
    ops_over_limit_.fetch_add(1, std::memory_order_relaxed);
    return -1;
  }
  StepOp op;
  op.index = index;
  op.generation = op_generation_.load(std::memory_order_relaxed);
  op.begin_ns = begin_ns;
  op.end_ns = std::max(begin_ns, end_ns);
  op.microbatch = microbatch;
  op.chunk = chunk;
  op.type = static_cast<uint32_t>(type);
  op_ring_.PushDropOldest(op);
  ops_recorded_.fetch_add(1, std::memory_order_relaxed);
  AtomicMin(earliest_begin_ns_, begin_ns);
  return static_cast<int>(index);
}

void Collector::AddGcPause(uint64_t begin_ns, uint64_t end_ns) {
  gc_pauses_.fetch_add(1, std::memory_order_relaxed);
  if (!steps_started_.load(std::memory_order_relaxed)) {
    // The set-up's collections (before anything of step 0): no step's time.
    gc_pauses_before_first_step_.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  const uint64_t ns = end_ns > begin_ns ? end_ns - begin_ns : 0;
  gc_ns_.fetch_add(ns, std::memory_order_relaxed);
  gc_count_.fetch_add(1, std::memory_order_relaxed);
  if (ns >= options_.gc_op_min_ns) AddStepOp(v1::OP_GC, 0, 0, begin_ns, end_ns);
}

void Collector::RecordCollectives(uint64_t entered) {
  collectives_entered_.store(entered, std::memory_order_relaxed);
}

void Collector::RecordMemory(uint64_t peak_allocated, uint64_t peak_reserved, uint64_t capacity) {
  AtomicMax(peak_allocated_, peak_allocated);
  AtomicMax(peak_reserved_, peak_reserved);
  AtomicMax(capacity_, capacity);
}

void Collector::RecordKernels(const std::vector<KernelEventInput>& events) {
  const size_t half = options_.max_kernel_events / 2;
  bool crossed_half;
  {
    std::lock_guard<std::mutex> lock(kernels_mu_);
    const size_t before = kernels_.size();
    for (const KernelEventInput& e : events) {
      if (kernels_.size() >= options_.max_kernel_events) {
        kernels_.pop_front();
        ++kernels_dropped_;
      }
      kernels_.push_back(e);
      KernelEventInput& k = kernels_.back();
      if (k.name.size() > kMaxKernelString) k.name.resize(kMaxKernelString);
      if (k.category.size() > kMaxKernelString) k.category.resize(kMaxKernelString);
    }
    crossed_half = before < half && kernels_.size() >= half;
  }
  kernels_recorded_.fetch_add(events.size(), std::memory_order_relaxed);
  // Half full: ship now rather than at the next interval, which may be too late for the rest.
  if (crossed_half) RequestFlush();
}

std::vector<v1::ControlRequest> Collector::TakeControlRequests() {
  if (control_ == nullptr) return {};
  return control_->Take();
}

std::vector<v1::ControlRequest> Collector::WaitStacksRequests(std::chrono::milliseconds timeout) {
  std::shared_ptr<ControlListener> listener;
  {
    std::unique_lock<std::mutex> lock(control_mu_);
    listener = control_;
    if (listener == nullptr) {
      // No control channel (none configured, or it did not start): no request can come. The
      // caller's loop waits out its timeout here rather than spin on an empty answer.
      const uint64_t wakes = stacks_wakes_;
      stacks_idle_.wait_for(lock, timeout, [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
        return closed_.load(std::memory_order_relaxed) || stacks_wakes_ != wakes;
      });
      return {};
    }
  }
  return listener->WaitStacks(timeout);
}

void Collector::WakeStacksWaiters() {
  std::shared_ptr<ControlListener> listener;
  {
    std::lock_guard<std::mutex> lock(control_mu_);
    listener = control_;
    ++stacks_wakes_;
  }
  stacks_idle_.notify_all();
  if (listener != nullptr) listener->WakeStacks();
}

void Collector::ReplyControl(v1::ControlReply reply) {
  {
    std::lock_guard<std::mutex> lock(control_mu_);
    replies_.push_back(std::move(reply));
    ++control_replies_;
  }
  RequestFlush();
}

void Collector::SendCapture(const std::string& request_id, std::string source_format,
                            std::vector<KernelEventInput> events, v1::ControlReply done) {
  CaptureUpload up;
  up.request_id = request_id;
  up.source_format = std::move(source_format);
  if (up.source_format.size() > kMaxSourceFormat) up.source_format.resize(kMaxSourceFormat);
  const size_t keep = std::min(events.size(), options_.max_capture_events);
  for (size_t i = 0; i < keep; ++i) {
    KernelEventInput& e = events[i];
    if (e.name.size() > kMaxKernelString) e.name.resize(kMaxKernelString);
    if (e.category.size() > kMaxKernelString) e.category.resize(kMaxKernelString);
    up.events.push_back(std::move(e));
  }
  done.set_events(keep);
  if (keep < events.size()) {
    std::string cut = std::to_string(events.size() - keep) + " of " +
                      std::to_string(events.size()) + " events cut (max_capture_events)";
    done.set_reason(done.reason().empty() ? cut : done.reason() + "; " + cut);
  }
  up.done = std::move(done);
  {
    std::lock_guard<std::mutex> lock(control_mu_);
    captures_.push_back(std::move(up));
    ++captures_sent_;
  }
  RequestFlush();
}

void Collector::RequestFlush() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    flush_requested_ = true;
  }
  wake_.notify_one();
}

void Collector::FillIdentity(uint32_t pid, v1::SourceIdentity* src) const {
  src->set_training_job(identity_.training_job);
  src->set_rank(identity_.rank);
  src->set_world_size(identity_.world_size);
  src->set_node(identity_.node);
  if (!identity_.scheduler.empty() || !identity_.pod.empty()) {
    v1::SchedulerIdentity* sched = src->mutable_scheduler();
    sched->set_scheduler(identity_.scheduler);
    sched->set_job(identity_.scheduler_job);
    sched->set_namespace_(identity_.k8s_namespace);
    sched->set_owner(identity_.owner);
    sched->set_pod(identity_.pod);
  }
  src->set_local_rank(identity_.local_rank);
  src->set_pid(pid);
  src->set_device(identity_.device);
  src->set_collector("rankwatch-collector/" RANKWATCH_VERSION);
}

size_t Collector::EnvelopeBytes(const std::string& source_format,
                                const std::string& capture_id) const {
  v1::Batch b;
  b.set_schema_version(kSchemaVersion);
  b.set_sequence(UINT64_MAX);
  b.set_created_unix_ns(INT64_MAX);
  b.set_dropped_records(UINT64_MAX);
  b.set_final(true);
  v1::SourceIdentity* src = b.mutable_source();
  FillIdentity(UINT32_MAX, src);
  {
    std::lock_guard<std::mutex> lock(identity_mu_);
    src->set_training_strategy(training_strategy_);
    src->set_sharded(true);
    // The largest layout: every field set to its largest value.
    v1::ParallelLayout* l = src->mutable_layout();
    l->set_data_rank(UINT32_MAX);
    l->set_data_size(UINT32_MAX);
    l->set_pipeline_rank(UINT32_MAX);
    l->set_pipeline_size(UINT32_MAX);
    l->set_tensor_rank(UINT32_MAX);
    l->set_tensor_size(UINT32_MAX);
    l->set_context_rank(UINT32_MAX);
    l->set_context_size(UINT32_MAX);
    l->set_expert_rank(UINT32_MAX);
    l->set_expert_size(UINT32_MAX);
    l->set_virtual_stages(UINT32_MAX);
  }
  b.mutable_trace()->set_source_format(source_format);
  b.mutable_trace()->set_capture_id(capture_id);
  // Strings are interned from index 1: "" is the table's first entry.
  return b.ByteSizeLong() + EncodedFieldBytes(0);
}

size_t Collector::max_reply_bytes() const {
  const size_t envelope = EnvelopeBytes("collector", "");
  return max_batch_bytes_ > envelope ? max_batch_bytes_ - envelope : 0;
}

void Collector::StartFilling(Filling* f, const std::string& source_format,
                             const std::string& capture_id) {
  f->batch.Clear();
  f->bytes = 0;
  f->interned.clear();
  f->source_format = source_format;
  f->capture_id = capture_id;
  const size_t envelope = EnvelopeBytes(source_format, capture_id);
  f->budget = max_batch_bytes_ > envelope ? max_batch_bytes_ - envelope : 0;
}

void Collector::DropOversized(uint64_t records, size_t bytes, const char* what) {
  sender_oversized_.fetch_add(1, std::memory_order_relaxed);
  oversized_records_.fetch_add(records, std::memory_order_relaxed);
  if (!warned_oversized_.exchange(true)) {
    spdlog::warn(
        "rankwatch collector: {} of {} bytes does not fit a Kafka message of max_message_bytes "
        "{}: dropped ({} records) and counted in messages_oversized; further ones are only "
        "counted",
        what, bytes, max_message_bytes_, records);
  }
}

void Collector::SealBatch(Filling* f) {
  v1::Batch* b = &f->batch;
  const uint64_t records = b->steps_size() + b->kernels_size();
  const bool capture = !f->capture_id.empty();
  if (b->kernels_size() > 0) {
    b->mutable_trace()->set_source_format(f->source_format);
    if (capture) b->mutable_trace()->set_capture_id(f->capture_id);
  }
  b->set_schema_version(kSchemaVersion);
  b->set_sequence(sequence_++);
  b->set_created_unix_ns(WallNowUnixNs());
  // Drops are reported in the job's own batches: the daemon reads a capture's as evidence only.
  if (!capture) {
    uint64_t dropped_total = ring_.dropped() + pending_.dropped_records() +
                             oversized_records_.load(std::memory_order_relaxed) +
                             base_pub_failed_records_ + publisher_->failed_records();
    {
      std::lock_guard<std::mutex> lock(kernels_mu_);
      dropped_total += kernels_dropped_;
    }
    b->set_dropped_records(dropped_total - reported_dropped_);
    reported_dropped_ = dropped_total;
  }
  v1::SourceIdentity* src = b->mutable_source();
  FillIdentity(identity_.pid, src);
  {
    std::lock_guard<std::mutex> lock(identity_mu_);
    src->set_training_strategy(training_strategy_);
    src->set_sharded(sharded_);
    if (layout_) layout_->ToProto(src->mutable_layout());
  }
  PendingBatch pb;
  b->SerializeToString(&pb.payload);
  pb.records = records;
  if (pb.payload.size() > max_batch_bytes_) {
    // Sealing keeps batches within the budget; only an envelope larger than the budget (an
    // identity of kilobytes of names) or one outsized event gets here.
    DropOversized(records, pb.payload.size(), "a batch");
  } else {
    pending_.Push(std::move(pb));
  }
  StartFilling(f, f->source_format, f->capture_id);
}

void Collector::TakeOps(uint64_t generation, std::vector<StepOp>* out) {
  out->clear();
  while (true) {
    if (!have_next_op_) {
      if (!op_ring_.TryPop(&next_op_)) return;
      have_next_op_ = true;
    }
    if (next_op_.generation > generation) return;  // the next step's
    if (next_op_.generation == generation) {
      out->push_back(next_op_);
    } else {
      ops_lost_.fetch_add(1, std::memory_order_relaxed);  // its step was dropped
    }
    have_next_op_ = false;
  }
}

bool Collector::Drain(bool final) {
  Filling f;
  StartFilling(&f, "collector", "");
  TimedStep s;
  v1::StepRecord record;
  while (ring_.TryPop(&s)) {
    bool on_device = false;
    if (s.clock == v1::STEP_CLOCK_DEVICE) {
      on_device = TakeDeviceRecord(s.generation, &sender_device_);
      // Its device times were lost (cannot happen while the ring keeps the step): host times.
      if (!on_device) s.clock = v1::STEP_CLOCK_DEVICE_MISSING;
    }
    s.ToProto(&record, on_device ? &sender_device_.phases : nullptr);
    TakeOps(s.generation, &step_ops_);
    // Fewer than counted: lost in the op ring (the sender fell behind) or recorded by another
    // thread as the step ended.
    if (step_ops_.size() < s.ops) ops_lost_.fetch_add(s.ops - step_ops_.size());
    AppendStepOps(step_ops_, s.begin_ns, s.end_ns, s.end_unix_ns, &record,
                  on_device ? &sender_device_.ops : nullptr);
    size_t bytes = EncodedFieldBytes(record.ByteSizeLong());
    if (bytes > f.budget && record.ops_size() > 0) {
      // Alone it would not fit a message: the step goes without its ops.
      const size_t ops = record.ops_size();
      ops_oversized_.fetch_add(ops, std::memory_order_relaxed);
      if (!warned_ops_cut_.exchange(true)) {
        spdlog::warn(
            "rankwatch collector: step {} with {} ops is {} bytes, more than a Kafka message of "
            "max_message_bytes {} holds: sent without its ops (counted in ops_oversized); "
            "further ones are only counted",
            record.step(), ops, bytes, max_message_bytes_);
      }
      record.clear_ops();
      record.clear_ops_origin_unix_ns();
      bytes = EncodedFieldBytes(record.ByteSizeLong());
    }
    if (!f.empty() && (f.bytes + bytes > f.budget ||
                       static_cast<size_t>(f.batch.steps_size()) >= kMaxBatchSteps)) {
      SealBatch(&f);
    }
    f.batch.add_steps()->Swap(&record);
    f.bytes += bytes;
  }
  std::deque<KernelEventInput> kernels;
  {
    std::lock_guard<std::mutex> lock(kernels_mu_);
    kernels.swap(kernels_);
  }
  for (size_t next = 0; next < kernels.size();) {
    next = FillKernels(&f, kernels, next);
    if (next < kernels.size()) SealBatch(&f);
  }
  // Captures go in batches of their own (their trace names the capture), each followed by its
  // reply; the other replies ride in the last batch of this round. A capture is cut into
  // batches as the pending bytes have room (at least one batch a round), the rest next round.
  std::vector<v1::ControlReply> replies;
  while (true) {
    if (!capture_) {
      std::lock_guard<std::mutex> lock(control_mu_);
      if (captures_.empty()) break;
      capture_ = std::move(captures_.front());
      captures_.pop_front();
      capture_next_ = 0;
    }
    if (!f.empty()) SealBatch(&f);
    Filling chunk;
    StartFilling(&chunk, capture_->source_format, capture_->request_id);
    const std::deque<KernelEventInput>& events = capture_->events;
    while (capture_next_ < events.size()) {
      if (!pending_.empty() && pending_.bytes() + max_batch_bytes_ > options_.max_pending_bytes) {
        break;  // no room: the rest next round
      }
      capture_next_ = FillKernels(&chunk, events, capture_next_);
      SealBatch(&chunk);
    }
    if (capture_next_ < events.size()) break;
    replies.push_back(std::move(capture_->done));
    capture_.reset();
  }
  const bool capture_left = capture_.has_value();
  {
    std::lock_guard<std::mutex> lock(control_mu_);
    for (v1::ControlReply& r : replies_) replies.push_back(std::move(r));
    replies_.clear();
  }
  for (v1::ControlReply& r : replies) {
    const size_t bytes = EncodedFieldBytes(r.ByteSizeLong());
    if (bytes > f.budget) {
      DropOversized(0, bytes, "a control reply");
      continue;
    }
    if (!f.empty() && f.bytes + bytes > f.budget) SealBatch(&f);
    *f.batch.add_control_replies() = std::move(r);
    f.bytes += bytes;
  }
  // The final batch comes last: after every capture's.
  if (!f.empty() || (final && !capture_left)) {
    f.batch.set_final(final && !capture_left);
    SealBatch(&f);
  }
  return capture_left;
}

size_t Collector::FillKernels(Filling* f, const std::deque<KernelEventInput>& events, size_t from) {
  v1::Batch& b = f->batch;
  v1::KernelEvent e;
  size_t i = from;
  for (; i < events.size(); ++i) {
    const KernelEventInput& k = events[i];
    // Its size with the indexes its strings would get (new ones: at most strings_size + 2).
    const uint32_t provisional = static_cast<uint32_t>(b.strings_size()) + 2;
    auto index_of = [&](const std::string& text, size_t* new_bytes) -> uint32_t {
      if (text.empty()) return 0;
      auto it = f->interned.find(text);
      if (it != f->interned.end()) return it->second;
      *new_bytes += EncodedFieldBytes(text.size());
      return provisional;
    };
    size_t new_bytes = 0;
    e.Clear();
    e.set_name(index_of(k.name, &new_bytes));
    e.set_category(k.category == k.name ? e.name() : index_of(k.category, &new_bytes));
    e.set_ts_ns(k.ts_ns);
    e.set_dur_ns(k.dur_ns);
    e.set_stream(k.stream);
    e.set_correlation(k.correlation);
    e.set_external_id(-1);
    e.set_bytes(-1);
    e.set_wait_on_stream(-1);
    e.set_wait_on_cuda_event_record_corr_id(-1);
    e.set_process_rank(static_cast<int32_t>(identity_.rank));
    e.set_pid(identity_.pid);
    e.set_step(k.step);
    if (k.tid != 0) e.set_tid(k.tid);
    const size_t bytes = EncodedFieldBytes(e.ByteSizeLong()) + new_bytes;
    if (!f->empty() && (f->bytes + bytes > f->budget ||
                        static_cast<size_t>(b.kernels_size()) >= kMaxBatchKernels)) {
      break;  // full
    }
    auto intern = [&](const std::string& text) -> uint32_t {
      if (text.empty()) return 0;
      if (b.strings_size() == 0) b.add_strings("");
      auto [it, added] = f->interned.emplace(text, b.strings_size());
      if (added) b.add_strings(text);
      return it->second;
    };
    e.set_name(intern(k.name));
    e.set_category(intern(k.category));
    *b.add_kernels() = e;
    f->bytes += bytes;
  }
  return i;
}

void Collector::Produce() {
  const uint64_t completed = publisher_->delivered() + publisher_->failed();
  while (completed_seen_ < completed && !inflight_sizes_.empty()) {
    inflight_bytes_ -= inflight_sizes_.front();
    inflight_sizes_.pop_front();
    ++completed_seen_;
  }
  // A producer that delivered is healthy: the next fatal error is recreated after the first
  // backoff again. (Taking batches proves nothing: a producer takes them before it fails.)
  if (publisher_->delivered() > 0) recreate_backoff_ = kFirstRecreateBackoff;
  const size_t window = static_cast<size_t>(options_.kafka_queue_max_messages);
  while (!pending_.empty() && inflight_sizes_.size() < window) {
    const PendingBatch& front = pending_.front();
    absl::Status s = publisher_->Publish(identity_.training_job, front.payload, front.records);
    if (s.ok()) {
      inflight_sizes_.push_back(front.payload.size());
      inflight_bytes_ += front.payload.size();
      produced_.fetch_add(1, std::memory_order_relaxed);
      pending_.PopFront();
      front_failures_ = 0;
      continue;
    }
    if (absl::IsResourceExhausted(s)) break;  // librdkafka's queue is full: retry later
    if (absl::IsOutOfRange(s)) {
      // Too large for message.max.bytes (a property set it below max_message_bytes): it never
      // fits. Dropped and counted (the producer counted it in its oversized()), never retried.
      oversized_records_.fetch_add(front.records, std::memory_order_relaxed);
      if (!warned_oversized_.exchange(true)) {
        spdlog::warn(
            "rankwatch collector: {}: the batch ({} records) is dropped and counted in "
            "messages_oversized; further ones are only counted",
            std::string(s.message()), front.records);
      }
      pending_.PopFront();
      front_failures_ = 0;
      continue;
    }
    // Anything else (a fatal idempotent-producer state) needs a fresh producer. A batch that a
    // fresh producer refuses too is dropped: it would hold every later batch back forever.
    if (++front_failures_ >= kMaxFatalFailuresPerBatch) {
      unsendable_batches_.fetch_add(1, std::memory_order_relaxed);
      oversized_records_.fetch_add(front.records, std::memory_order_relaxed);
      if (!warned_unsendable_.exchange(true)) {
        spdlog::warn(
            "rankwatch collector: {} (with a fresh producer too): the batch ({} records) is "
            "dropped and counted in records_dropped; further ones are only counted",
            std::string(s.message()), front.records);
      }
      pending_.PopFront();
      front_failures_ = 0;
      continue;
    }
    const auto now = std::chrono::steady_clock::now();
    if (now < next_recreate_) {
      --front_failures_;  // not retried with a fresh producer yet
      break;
    }
    next_recreate_ = now + recreate_backoff_;
    spdlog::warn(
        "rankwatch collector: {}; recreating the Kafka producer (again at the earliest in {} s)",
        std::string(s.message()), recreate_backoff_.count() / 1000);
    recreate_backoff_ = std::min(recreate_backoff_ * 2, kMaxRecreateBackoff);
    auto fresh = BatchPublisher::Create(ToPublisherOptions(options_));
    if (!fresh.ok()) break;
    base_delivered_ += publisher_->delivered();
    base_failed_ += publisher_->failed();
    base_pub_oversized_ += publisher_->oversized();
    base_pub_failed_records_ += publisher_->failed_records();
    publisher_ = std::move(*fresh);
    producer_restarts_.fetch_add(1, std::memory_order_relaxed);
    inflight_sizes_.clear();
    inflight_bytes_ = 0;
    completed_seen_ = 0;
    break;
  }
}

void Collector::DrainBacklog(std::chrono::steady_clock::time_point deadline) {
  while (!pending_.empty()) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return;
    publisher_->Poll(left);  // returns at the first delivery report
    Produce();
  }
}

void Collector::UpdateBuffered() {
  const uint64_t bytes = pending_.bytes() + inflight_bytes_;
  buffered_bytes_.store(bytes, std::memory_order_relaxed);
  delivered_.store(base_delivered_ + publisher_->delivered(), std::memory_order_relaxed);
  failed_.store(base_failed_ + publisher_->failed(), std::memory_order_relaxed);
  pub_oversized_.store(base_pub_oversized_ + publisher_->oversized(), std::memory_order_relaxed);
  failed_records_.store(base_pub_failed_records_ + publisher_->failed_records(),
                        std::memory_order_relaxed);
  AtomicMax(max_buffered_bytes_, bytes);
  pending_dropped_records_.store(pending_.dropped_records(), std::memory_order_relaxed);
  pending_dropped_batches_.store(pending_.dropped_batches(), std::memory_order_relaxed);
}

void Collector::SenderLoop() {
  // Named like librdkafka's threads ("rdk:..."), so that per-thread CPU (top -H, /proc) shows
  // what the collector costs a training process.
  pthread_setname_np(pthread_self(), "rw:sender");
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    wake_.wait_for(lock, std::chrono::milliseconds(options_.flush_interval_ms),
                   [this] { return stop_ || flush_requested_; });
    const bool stopping = stop_, final = final_;
    flush_requested_ = false;
    lock.unlock();
    ReleaseOverdue(false);  // steps whose device times are too late go with host times
    capture_left_ = Drain(stopping && final);
    Produce();
    if (!stopping) {
      DrainBacklog(std::chrono::steady_clock::now() +
                   std::chrono::milliseconds(options_.flush_interval_ms));
    }
    publisher_->Poll(std::chrono::milliseconds(0));  // serves delivery reports
    Produce();
    UpdateBuffered();
    if (pending_.empty() && inflight_sizes_.empty() && ring_.size() == 0 && !capture_left_) {
      idle_generation_.fetch_add(1, std::memory_order_release);
    }
    lock.lock();
    if (stopping) break;
    // A capture's next batches go as soon as the last ones left (DrainBacklog waited for them).
    if (capture_left_) flush_requested_ = true;
  }
}

absl::Status Collector::Flush(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  const uint64_t start = idle_generation_.load(std::memory_order_acquire);
  while (std::chrono::steady_clock::now() < deadline && !closed_.load()) {
    RequestFlush();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    // Two idle rounds after the request: the second began after everything queued now.
    if (idle_generation_.load(std::memory_order_acquire) >= start + 2) return absl::OkStatus();
  }
  return absl::DeadlineExceededError("telemetry not yet delivered to Kafka");
}

absl::Status Collector::Close(bool final, std::chrono::milliseconds timeout) {
  if (closed_.exchange(true)) return absl::OkStatus();
  // No control requests or replies after this (the last replies ship below). The listener's
  // thread may be inside ReplyControl, which takes control_mu_: joined outside that lock.
  std::shared_ptr<ControlListener> listener;
  {
    std::lock_guard<std::mutex> lock(control_mu_);
    listener = std::move(control_);
  }
  // A thread waiting for stacks requests returns now; the last reference stops the listener.
  stacks_idle_.notify_all();
  if (listener != nullptr) listener->WakeStacks();
  listener.reset();
  // Steps still waiting for their device times go with their host times, before the last round.
  ReleaseOverdue(true);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    final_ = final;
  }
  wake_.notify_one();
  sender_.join();
  // The sender is gone: this thread now owns its state. A capture it left is cut into its
  // remaining batches as they go; the final batch follows it.
  while ((!pending_.empty() || capture_left_) && std::chrono::steady_clock::now() < deadline) {
    if (capture_left_) capture_left_ = Drain(final);
    Produce();
    (void)publisher_->Flush(std::chrono::milliseconds(20));
  }
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline - std::chrono::steady_clock::now());
  absl::Status s = publisher_->Flush(std::max(left, std::chrono::milliseconds(0)));
  Produce();
  UpdateBuffered();
  if (!pending_.empty() || capture_left_) {
    return absl::DeadlineExceededError("telemetry left undelivered at close");
  }
  return s;
}

CollectorStats Collector::stats() const {
  CollectorStats s;
  s.steps_recorded = steps_recorded_.load(std::memory_order_relaxed);
  s.kernels_recorded = kernels_recorded_.load(std::memory_order_relaxed);
  uint64_t kernels_dropped;
  {
    std::lock_guard<std::mutex> lock(kernels_mu_);
    kernels_dropped = kernels_dropped_;
  }
  s.records_dropped = ring_.dropped() + kernels_dropped +
                      pending_dropped_records_.load(std::memory_order_relaxed) +
                      oversized_records_.load(std::memory_order_relaxed) +
                      failed_records_.load(std::memory_order_relaxed);
  s.batches_dropped = pending_dropped_batches_.load(std::memory_order_relaxed) +
                      unsendable_batches_.load(std::memory_order_relaxed);
  s.batches_produced = produced_.load(std::memory_order_relaxed);
  s.batches_delivered = delivered_.load(std::memory_order_relaxed);
  s.batches_failed = failed_.load(std::memory_order_relaxed);
  s.buffered_bytes = buffered_bytes_.load(std::memory_order_relaxed);
  s.max_buffered_bytes = max_buffered_bytes_.load(std::memory_order_relaxed);
  s.memory_bound_bytes = memory_bound_bytes();
  {
    std::lock_guard<std::mutex> lock(control_mu_);
    if (control_ != nullptr) s.control = control_->stats();
    s.control_replies = control_replies_;
    s.captures_sent = captures_sent_;
  }
  s.ops_recorded = ops_recorded_.load(std::memory_order_relaxed);
  // Ops the op ring dropped show as their step's shortfall (Drain), counted in ops_lost_.
  s.ops_oversized = ops_oversized_.load(std::memory_order_relaxed);
  s.ops_dropped = ops_over_limit_.load(std::memory_order_relaxed) +
                  ops_lost_.load(std::memory_order_relaxed) + s.ops_oversized;
  s.messages_oversized = sender_oversized_.load(std::memory_order_relaxed) +
                         pub_oversized_.load(std::memory_order_relaxed);
  s.producer_restarts = producer_restarts_.load(std::memory_order_relaxed);
  s.gc_pauses = gc_pauses_.load(std::memory_order_relaxed);
  s.gc_pauses_before_first_step = gc_pauses_before_first_step_.load(std::memory_order_relaxed);
  s.device_steps = device_steps_.load(std::memory_order_relaxed);
  s.device_steps_missing = device_steps_missing_.load(std::memory_order_relaxed);
  s.device_times_late = device_times_late_.load(std::memory_order_relaxed);
  return s;
}

uint64_t Collector::memory_bound_bytes() const {
  const uint64_t ring = ring_.capacity() * (sizeof(TimedStep) + sizeof(size_t)) +
                        op_ring_.capacity() * (sizeof(StepOp) + sizeof(size_t));
  const uint64_t kernels =
      options_.max_kernel_events * (sizeof(KernelEventInput) + 2 * kMaxKernelString);
  // One capture at a time (the Python collector runs them one after the other).
  const uint64_t capture =
      options_.max_capture_events * (sizeof(KernelEventInput) + 2 * kMaxKernelString);
  // Steps held for their device times, each with at most max_ops_per_step op times; released
  // steps' device times (a record per step the ring holds, op_ring_capacity op times in all).
  const uint64_t device =
      options_.device_hold_steps *
          (sizeof(HeldStep) + options_.max_ops_per_step * sizeof(DeviceOpTime)) +
      ring_.capacity() * sizeof(DeviceRecord) + options_.op_ring_capacity * sizeof(DeviceOpTime);
  return ring + kernels + capture + device + options_.max_pending_bytes +
         uint64_t(options_.kafka_queue_max_kbytes) * 1024;
}

}  // namespace rankwatch
