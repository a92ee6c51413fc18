// The C API of collectors/lib/rankwatch_collector.h over rankwatch::Collector.
#include "collectors/lib/rankwatch_collector.h"

#include <cstdio>
#include <deque>
#include <memory>

#include "collectors/lib/collector.h"

struct rw_collector {
  std::unique_ptr<rankwatch::Collector> impl;
  std::deque<rankwatch::v1::ControlRequest>
      captures;  // taken, not handed out yet (training thread)
};

namespace {

// The C enum is the wire's, number for number.
constexpr bool Same(rw_op_type c, rankwatch::v1::OpType wire) {
  return static_cast<int>(c) == static_cast<int>(wire);
}
static_assert(
    Same(RW_OP_FORWARD_COMPUTE, rankwatch::v1::OP_FORWARD_COMPUTE) &&
        Same(RW_OP_BACKWARD_COMPUTE, rankwatch::v1::OP_BACKWARD_COMPUTE) &&
        Same(RW_OP_FORWARD_SEND, rankwatch::v1::OP_FORWARD_SEND) &&
        Same(RW_OP_FORWARD_RECV, rankwatch::v1::OP_FORWARD_RECV) &&
        Same(RW_OP_BACKWARD_SEND, rankwatch::v1::OP_BACKWARD_SEND) &&
        Same(RW_OP_BACKWARD_RECV, rankwatch::v1::OP_BACKWARD_RECV) &&
        Same(RW_OP_TENSOR_PARALLEL, rankwatch::v1::OP_TENSOR_PARALLEL) &&
        Same(RW_OP_GRADS_REDUCE_SCATTER, rankwatch::v1::OP_GRADS_REDUCE_SCATTER) &&
        Same(RW_OP_PARAMS_ALL_GATHER, rankwatch::v1::OP_PARAMS_ALL_GATHER) &&
        Same(RW_OP_GRADS_ALL_REDUCE, rankwatch::v1::OP_GRADS_ALL_REDUCE) &&
        Same(RW_OP_LAYERNORM_GRADS_ALL_REDUCE, rankwatch::v1::OP_LAYERNORM_GRADS_ALL_REDUCE) &&
        Same(RW_OP_EMBEDDING_GRADS_ALL_REDUCE, rankwatch::v1::OP_EMBEDDING_GRADS_ALL_REDUCE) &&
        Same(RW_OP_OPTIMIZER_CLIP_MAIN_GRAD, rankwatch::v1::OP_OPTIMIZER_CLIP_MAIN_GRAD) &&
        Same(RW_OP_OPTIMIZER, rankwatch::v1::OP_OPTIMIZER) &&
        Same(RW_OP_GC, rankwatch::v1::OP_GC) &&
        Same(RW_OP_DATA_LOADING, rankwatch::v1::OP_DATA_LOADING) &&
        Same(RW_OP_BACKWARD_WEIGHT_COMPUTE, rankwatch::v1::OP_BACKWARD_WEIGHT_COMPUTE) &&
        Same(RW_OP_BACKWARD_WEIGHT_COMPUTE, rankwatch::v1::OpType_MAX),
    "rw_op_type and telemetry.proto's OpType differ");

std::vector<rankwatch::KernelEventInput> ToEvents(const rw_kernel_event* events, size_t n) {
  std::vector<rankwatch::KernelEventInput> in(n);
  for (size_t i = 0; i < n; ++i) {
    const rw_kernel_event& e = events[i];
    in[i].name = e.name != nullptr ? e.name : "";
    in[i].category = e.category != nullptr ? e.category : "";
    in[i].ts_ns = e.ts_ns;
    in[i].dur_ns = e.dur_ns;
    in[i].stream = e.stream;
    in[i].correlation = e.correlation;
    in[i].step = e.step;
  }
  return in;
}

}  // namespace

extern "C" {

rw_collector* rw_collector_create(const rw_identity* identity, const rw_options* options,
                                  char* error, size_t error_size) {
  auto fail = [&](const std::string& message) -> rw_collector* {
    if (error != nullptr && error_size > 0) std::snprintf(error, error_size, "%s", message.c_str());
    return nullptr;
  };
  if (identity == nullptr || options == nullptr) return fail("identity and options are required");
  if (identity->training_job == nullptr || options->brokers == nullptr) {
    return fail("training_job and brokers are required");
  }
  rankwatch::CollectorIdentity id;
  id.training_job = identity->training_job;
  id.rank = identity->rank;
  id.world_size = identity->world_size;
  id.node = identity->node != nullptr ? identity->node : "";
  id.local_rank = identity->local_rank;
  id.pid = identity->pid;
  id.device = identity->device != nullptr ? identity->device : "cpu";
  rankwatch::CollectorOptions o;
  o.brokers = options->brokers;
  if (options->topic != nullptr) o.topic = options->topic;
  if (options->flush_interval_ms > 0) o.flush_interval_ms = options->flush_interval_ms;
  if (options->step_ring_capacity > 0) o.step_ring_capacity = options->step_ring_capacity;
  if (options->max_pending_bytes > 0) o.max_pending_bytes = options->max_pending_bytes;
  if (options->kafka_queue_max_messages > 0) {
    o.kafka_queue_max_messages = options->kafka_queue_max_messages;
  }
  if (options->kafka_queue_max_kbytes > 0)
    o.kafka_queue_max_kbytes = options->kafka_queue_max_kbytes;
  if (options->control_topic != nullptr) o.control_topic = options->control_topic;
  o.take_captures = options->take_captures != 0;
  o.watch_gc = options->watch_gc != 0;
  if (options->max_message_bytes > 0) o.max_message_bytes = options->max_message_bytes;
  if (options->device_hold_ms > 0) o.device_hold_ms = options->device_hold_ms;
  if (options->device_hold_steps > 0) o.device_hold_steps = options->device_hold_steps;
  auto c = rankwatch::Collector::Create(std::move(id), std::move(o));
  if (!c.ok()) return fail(std::string(c.status().message()));
  return new rw_collector{std::move(*c)};
}

void rw_collector_destroy(rw_collector* c, int final, int timeout_ms) {
  if (c == nullptr) return;
  (void)c->impl->Close(final != 0, std::chrono::milliseconds(timeout_ms));
  delete c;
}

uint64_t rw_now_ns(void) { return rankwatch::Collector::NowNs(); }

void rw_step_begin(rw_collector* c, uint64_t step) {
  c->impl->BeginStep(step, rankwatch::Collector::NowNs());
}

void rw_step_end(rw_collector* c) { c->impl->EndStep(rankwatch::Collector::NowNs()); }

void rw_phase_add(rw_collector* c, enum rw_phase phase, uint64_t begin_ns, uint64_t end_ns) {
  if (static_cast<int>(phase) < 0 || static_cast<int>(phase) >= rankwatch::kStepPhaseCount) return;
  c->impl->AddPhase(static_cast<rankwatch::StepPhase>(phase), begin_ns, end_ns);
}

int rw_layout_set(rw_collector* c, const rw_layout* layout, char* error, size_t error_size) {
  auto size = [](uint32_t s) { return s == 0 ? 1u : s; };
  rankwatch::RankLayout l;
  l.data_rank = layout->data_rank;
  l.data_size = size(layout->data_size);
  l.pipeline_rank = layout->pipeline_rank;
  l.pipeline_size = size(layout->pipeline_size);
  l.tensor_rank = layout->tensor_rank;
  l.tensor_size = size(layout->tensor_size);
  l.context_rank = layout->context_rank;
  l.context_size = size(layout->context_size);
  l.expert_rank = layout->expert_rank;
  l.expert_size = size(layout->expert_size);
  l.virtual_stages = size(layout->virtual_stages);
  const absl::Status s = c->impl->SetLayout(l);
  if (s.ok()) return 0;
  if (error != nullptr && error_size > 0) {
    std::snprintf(error, error_size, "%s", std::string(s.message()).c_str());
  }
  return -1;
}

int rw_op_add(rw_collector* c, enum rw_op_type type, uint32_t microbatch, uint32_t chunk,
              uint64_t begin_ns, uint64_t end_ns) {
  const int t = static_cast<int>(type);
  if (t == rankwatch::v1::OP_UNSPECIFIED || !rankwatch::v1::OpType_IsValid(t)) return -1;
  c->impl->AddOp(static_cast<rankwatch::v1::OpType>(t), microbatch, chunk, begin_ns, end_ns);
  return 0;
}

int rw_op_add_indexed(rw_collector* c, enum rw_op_type type, uint32_t microbatch, uint32_t chunk,
                      uint64_t begin_ns, uint64_t end_ns) {
  const int t = static_cast<int>(type);
  if (t == rankwatch::v1::OP_UNSPECIFIED || !rankwatch::v1::OpType_IsValid(t)) return -1;
  return c->impl->AddOp(static_cast<rankwatch::v1::OpType>(t), microbatch, chunk, begin_ns, end_ns);
}

rw_op_scope rw_op_begin(enum rw_op_type type, uint32_t microbatch, uint32_t chunk) {
  return rw_op_scope{type, microbatch, chunk, rankwatch::Collector::NowNs()};
}

int rw_op_end(rw_collector* c, const rw_op_scope* scope) {
  return rw_op_add(c, scope->type, scope->microbatch, scope->chunk, scope->begin_ns,
                   rankwatch::Collector::NowNs());
}

int rw_op_end_indexed(rw_collector* c, const rw_op_scope* scope) {
  return rw_op_add_indexed(c, scope->type, scope->microbatch, scope->chunk, scope->begin_ns,
                           rankwatch::Collector::NowNs());
}

void rw_step_expect_device_times(rw_collector* c) { c->impl->ExpectDeviceTimes(); }

int rw_device_times_set(rw_collector* c, uint64_t step, const rw_device_times* times) {
  rankwatch::DeviceTimes d;
  if (times == nullptr || times->missing != 0) {
    d.missing = true;
  } else {
    static_assert(sizeof(times->phase_ns) / sizeof(times->phase_ns[0]) ==
                  rankwatch::kStepPhaseCount);
    for (int i = 0; i < rankwatch::kStepPhaseCount; ++i) d.phases.phase_ns[i] = times->phase_ns[i];
    d.phases.phase_mask = times->phase_mask;
    if (times->ops != nullptr) {
      d.ops.reserve(times->n_ops);
      for (size_t i = 0; i < times->n_ops; ++i) {
        const rw_device_op_time& t = times->ops[i];
        d.ops.push_back({t.op_index, t.begin_ns, t.end_ns});
      }
    }
  }
  return c->impl->SetDeviceTimes(step, d) ? 0 : -1;
}

void rw_gc_pause_add(rw_collector* c, uint64_t begin_ns, uint64_t end_ns) {
  c->impl->AddGcPause(begin_ns, end_ns);
}

void rw_memory_peak(rw_collector* c, uint64_t allocated, uint64_t reserved, uint64_t capacity) {
  c->impl->RecordMemory(allocated, reserved, capacity);
}

void rw_kernels_record(rw_collector* c, const rw_kernel_event* events, size_t n) {
  c->impl->RecordKernels(ToEvents(events, n));
}

void rw_training_strategy_set(rw_collector* c, const char* training_strategy, int sharded) {
  c->impl->SetTrainingStrategy(training_strategy != nullptr ? training_strategy : "", sharded != 0);
}

int rw_flush(rw_collector* c, int timeout_ms) {
  return c->impl->Flush(std::chrono::milliseconds(timeout_ms)).ok() ? 0 : -1;
}

void rw_stats_get(const rw_collector* c, rw_stats* out) {
  const rankwatch::CollectorStats s = c->impl->stats();
  uint64_t refused = 0;
  for (uint64_t n : s.control.refused) refused += n;
  *out = rw_stats{s.steps_recorded,     s.kernels_recorded,     s.records_dropped,
                  s.batches_dropped,    s.batches_produced,     s.batches_delivered,
                  s.batches_failed,     s.buffered_bytes,       s.max_buffered_bytes,
                  s.memory_bound_bytes, s.control.accepted,     refused,
                  s.captures_sent,      s.ops_recorded,         s.ops_dropped,
                  s.messages_oversized, s.ops_oversized,        s.producer_restarts,
                  s.device_steps,       s.device_steps_missing, s.device_times_late};
}

int rw_capture_take(rw_collector* c, rw_capture_request* out) {
  if (c->captures.empty()) {
    if (!c->impl->control_pending()) return 0;
    for (rankwatch::v1::ControlRequest& r : c->impl->TakeControlRequests()) {
      // The listener accepts nothing but captures (the only action), and captures only with
      // take_captures; anything else would be a newer action: say so rather than drop it.
      if (r.action_case() != rankwatch::v1::ControlRequest::kCapture) {
        rankwatch::v1::ControlReply reply;
        reply.set_request_id(r.id());
        reply.set_state(rankwatch::v1::CONTROL_FAILED);
        reply.set_reason("unsupported: the C API takes captures only");
        c->impl->ReplyControl(std::move(reply));
        continue;
      }
      c->captures.push_back(std::move(r));
    }
    if (c->captures.empty()) return 0;
  }
  const rankwatch::v1::ControlRequest& r = c->captures.front();
  std::snprintf(out->id, sizeof(out->id), "%s", r.id().c_str());
  out->steps = r.capture().steps();
  out->cuda = r.capture().cuda() ? 1 : 0;
  out->deadline_unix_ns = r.deadline_unix_ns();
  c->captures.pop_front();
  return 1;
}

void rw_capture_send(rw_collector* c, const char* request_id, const char* source_format,
                     int64_t first_step, uint32_t steps, uint64_t profiled_step_ns,
                     const rw_kernel_event* events, size_t n) {
  const std::string id = request_id != nullptr ? request_id : "";
  rankwatch::v1::ControlReply done;
  done.set_request_id(id);
  done.set_state(rankwatch::v1::CONTROL_DONE);
  done.set_first_step(first_step);
  done.set_steps(steps);
  done.set_profiled_step_ns(profiled_step_ns);
  c->impl->SendCapture(id, source_format != nullptr ? source_format : "rw_capture",
                       ToEvents(events, n), std::move(done));
}

void rw_capture_fail(rw_collector* c, const char* request_id, const char* reason) {
  rankwatch::v1::ControlReply reply;
  reply.set_request_id(request_id != nullptr ? request_id : "");
  reply.set_state(rankwatch::v1::CONTROL_FAILED);
  reply.set_reason(reason != nullptr ? reason : "failed");
  c->impl->ReplyControl(std::move(reply));
}

}  // extern "C"
