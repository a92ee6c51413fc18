// The C API of collectors/lib/rankwatch_collector.h over rankwatch::Collector.
#include "collectors/lib/rankwatch_collector.h"

#include <cstdio>
#include <memory>

#include "collectors/lib/collector.h"

struct rw_collector {
  std::unique_ptr<rankwatch::Collector> impl;
};

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
  // The C API cannot act on control requests (captures) yet: it does not listen, so that it
  // never accepts a request it would not carry out.
  o.control_topic.clear();
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

void rw_memory_peak(rw_collector* c, uint64_t allocated, uint64_t reserved, uint64_t capacity) {
  c->impl->RecordMemory(allocated, reserved, capacity);
}

void rw_kernels_record(rw_collector* c, const rw_kernel_event* events, size_t n) {
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
  c->impl->RecordKernels(in);
}

void rw_training_strategy_set(rw_collector* c, const char* training_strategy, int sharded) {
  c->impl->SetTrainingStrategy(training_strategy != nullptr ? training_strategy : "", sharded != 0);
}

int rw_flush(rw_collector* c, int timeout_ms) {
  return c->impl->Flush(std::chrono::milliseconds(timeout_ms)).ok() ? 0 : -1;
}

void rw_stats_get(const rw_collector* c, rw_stats* out) {
  const rankwatch::CollectorStats s = c->impl->stats();
  *out = rw_stats{s.steps_recorded,     s.kernels_recorded,  s.records_dropped, s.batches_dropped,
                  s.batches_produced,   s.batches_delivered, s.batches_failed,  s.buffered_bytes,
                  s.max_buffered_bytes, s.memory_bound_bytes};
}

}  // extern "C"
