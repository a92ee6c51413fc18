/* rankwatch collector C API: record per-step phase timings, ops, GC pauses, memory peaks and
 * kernel events of one training rank and publish them to Kafka for rankwatchd
 * (collectors/lib/collector.h is the C++ class behind it).
 *
 * Pipeline-parallel jobs also say where the rank sits in the parallel layout (rw_layout_set)
 * and record the ops of each step (rw_op_begin / rw_op_end around each, or rw_op_add): forward
 * and backward compute of each microbatch, pipeline sends and receives, data-parallel
 * collectives, the optimizer; rankwatchd's what-if analysis replays them (docs/whatif.md).
 *
 * Every recording call is non-blocking and allocation-free on the step path (kernel events
 * are copied into a bounded buffer). When Kafka is slow or down the oldest data is dropped
 * and counted; the collector reconnects by itself. No message is larger than
 * rw_options.max_message_bytes (default 1,000,000 bytes): batches, captures included, are cut
 * below it; a step whose ops alone would not fit goes without them, and anything else that
 * cannot fit is dropped and counted, never retried.
 *
 * rw_options and rw_stats grew fields at their ends (max_message_bytes, device_hold_ms,
 * device_hold_steps; messages_oversized, ops_oversized, producer_restarts, device_steps,
 * device_steps_missing, device_times_late): zero-initialise rw_options (`rw_options o = {0};`)
 * and rebuild against this header.
 *
 * Device time: on a GPU, host clock reads around a phase or op (rw_phase_add, rw_op_add) say
 * when the host queued the work, not when the device ran it. A caller that times the work on
 * the device as well does so with its own events (cudaEventRecord / hipEventRecord around each
 * phase and op on the streams it runs on, or CUPTI activity records) and hands the device
 * times of a step over when they are ready, a step or more later, never waiting for them:
 *
 *   rw_step_begin(c, step);
 *   rw_step_expect_device_times(c);          -- this step's record waits for them
 *   record event e0 on the stream; int op = rw_op_add_indexed(c, ...host times...);
 *   record event e1; ...; rw_step_end(c);
 *   ... later steps: once cudaEventQuery(e1) == cudaSuccess (never cudaEventSynchronize on
 *   the training thread), cudaEventElapsedTime gives the device duration; put its begin and
 *   end onto rw_now_ns()'s clock (e.g. an anchor event whose host time is known) ...
 *   rw_device_op_time t = {op, begin_ns, end_ns};
 *   rw_device_times d = {0};
 *   d.phase_ns[RW_PHASE_FORWARD] = forward_device_ns; d.phase_mask = 1u << RW_PHASE_FORWARD;
 *   d.ops = &t; d.n_ops = 1;
 *   rw_device_times_set(c, step, &d);        -- or d.missing = 1 when they did not complete
 *
 * The record of a marked step is held (not queued) until rw_device_times_set hands its times
 * over; held steps go in step order. One whose times do not come within device_hold_ms
 * (default 10 s), or the oldest of more than device_hold_steps (default 16) held, goes with
 * its host times, marked STEP_CLOCK_DEVICE_MISSING; so do the held steps at
 * rw_collector_destroy. With device times the record carries them in its phase fields and ops
 * (clock STEP_CLOCK_DEVICE) and keeps the host's beside them (StepRecord.host_phases,
 * OpRecord.host_start_offset_us / host_duration_us; proto/rankwatch/v1/telemetry.proto).
 * The dataloader is host work: its device time is ignored.
 *
 * Control channel: the collector reads the daemon's requests for its rank from the control
 * topic on a thread of its own (control.proto). An application that can profile itself sets
 * `take_captures`, polls rw_capture_take at step boundaries (one atomic load when nothing
 * waits), profiles the steps asked for with its own profiler and answers with
 * rw_capture_send (the events, then DONE) or rw_capture_fail. Without `take_captures` a
 * capture request is refused at once with the reason "unsupported". Stacks requests (the
 * daemon asks every rank of a hung job where it is) are refused "unsupported" too: only the
 * Python package answers them; the refusal still tells the daemon the process is alive.
 *
 * Thread-safety: rw_step_begin / rw_step_end, rw_step_expect_device_times and rw_capture_take
 * from the training thread;
 * every other call from any thread. A handle is valid from rw_collector_create until
 * rw_collector_destroy.
 */
#ifndef RANKWATCH_COLLECTOR_H_
#define RANKWATCH_COLLECTOR_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct rw_collector rw_collector;

enum rw_phase {
  RW_PHASE_DATALOADER = 0,
  RW_PHASE_FORWARD = 1,
  RW_PHASE_BACKWARD = 2,
  RW_PHASE_OPTIMIZER = 3,
  RW_PHASE_COLLECTIVE = 4,
  RW_PHASE_FORWARD_BACKWARD = 5
};

typedef struct rw_identity {
  const char* training_job; /* required */
  uint32_t rank;            /* < world_size */
  uint32_t world_size;      /* >= 1 */
  const char* node;         /* host name; NULL = "" */
  uint32_t local_rank;
  uint32_t pid;       /* 0 = this process */
  const char* device; /* "cuda:0", "cpu", ...; NULL = "cpu" */
} rw_identity;

typedef struct rw_options {
  const char* brokers;          /* Kafka bootstrap servers (required) */
  const char* topic;            /* NULL = "rankwatch.telemetry" */
  int flush_interval_ms;        /* 0 = 1000 */
  size_t step_ring_capacity;    /* 0 = 4096 steps */
  size_t max_pending_bytes;     /* 0 = 4 MiB */
  int kafka_queue_max_messages; /* 0 = 4 (1 to 5: batches in librdkafka at once) */
  int kafka_queue_max_kbytes;   /* 0 = 4096 */
  const char* control_topic;    /* NULL = "rankwatch.control"; "" = no control channel */
  int take_captures;            /* != 0: the application acts on capture requests */
  int watch_gc; /* != 0: every GC pause is reported (rw_gc_pause_add): steps carry gc_ns = 0 too */
  /* The largest Kafka message produced (librdkafka's message.max.bytes): set it to the
   * brokers' and the topic's limit. 0 = 1,000,000 (Kafka's default); at least 16384. Batches are
   * sealed below it; what cannot fit is dropped and counted (rw_stats.messages_oversized). */
  size_t max_message_bytes;
  /* Device time (rw_step_expect_device_times): the longest a marked step's record waits for
   * its device times before it goes with its host times (0 = 10000 ms), and the most steps
   * held at once (0 = 16; the oldest goes with its host times when more are). */
  int device_hold_ms;
  size_t device_hold_steps;
} rw_options;

/* Where the rank sits in the job's parallel layout; a size of 0 means 1 (not used). Every rank
 * is below its size; data x pipeline x tensor x context sizes multiply to the world size. */
typedef struct rw_layout {
  uint32_t data_rank, data_size;
  uint32_t pipeline_rank, pipeline_size; /* the pipeline stage */
  uint32_t tensor_rank, tensor_size;
  uint32_t context_rank, context_size;
  uint32_t expert_rank, expert_size;
  uint32_t virtual_stages; /* model chunks per stage (interleaved 1F1B); 0 or 1 = not */
} rw_layout;

/* The kinds of op (OpType in proto/rankwatch/v1/telemetry.proto, the same numbers). */
enum rw_op_type {
  RW_OP_FORWARD_COMPUTE = 1,
  RW_OP_BACKWARD_COMPUTE = 2,
  RW_OP_FORWARD_SEND = 3,  /* pipeline: activations to the next stage */
  RW_OP_FORWARD_RECV = 4,  /* pipeline: activations from the previous stage */
  RW_OP_BACKWARD_SEND = 5, /* pipeline: gradients to the previous stage */
  RW_OP_BACKWARD_RECV = 6, /* pipeline: gradients from the next stage */
  RW_OP_TENSOR_PARALLEL = 7,
  RW_OP_GRADS_REDUCE_SCATTER = 8,
  RW_OP_PARAMS_ALL_GATHER = 9,
  RW_OP_GRADS_ALL_REDUCE = 10,
  RW_OP_LAYERNORM_GRADS_ALL_REDUCE = 11,
  RW_OP_EMBEDDING_GRADS_ALL_REDUCE = 12,
  RW_OP_OPTIMIZER_CLIP_MAIN_GRAD = 13,
  RW_OP_OPTIMIZER = 14,
  RW_OP_GC = 15,
  RW_OP_DATA_LOADING = 16,
  RW_OP_BACKWARD_WEIGHT_COMPUTE = 17 /* zero-bubble: the weight-gradient part of backward */
};

/* An op being timed, on the caller's stack: rw_op_begin fills it, rw_op_end records it. */
typedef struct rw_op_scope {
  enum rw_op_type type;
  uint32_t microbatch, chunk;
  uint64_t begin_ns;
} rw_op_scope;

typedef struct rw_kernel_event {
  const char* name;     /* copied; NULL = "" */
  const char* category; /* copied; NULL = "" */
  int64_t ts_ns, dur_ns;
  int64_t stream;      /* -1 for CPU events */
  int64_t correlation; /* -1 when absent */
  int64_t step;        /* -1 when unknown */
} rw_kernel_event;

/* A capture request the collector accepted: profile `steps` steps from the next one. */
typedef struct rw_capture_request {
  char id[129];             /* the request id, NUL-terminated: pass it back when answering */
  uint32_t steps;           /* 1 to 100 */
  int cuda;                 /* != 0: GPU activities too, where the rank has a GPU */
  int64_t deadline_unix_ns; /* the daemon stops waiting for the answer then */
} rw_capture_request;

typedef struct rw_stats {
  uint64_t steps_recorded, kernels_recorded, records_dropped, batches_dropped;
  uint64_t batches_produced, batches_delivered, batches_failed;
  uint64_t buffered_bytes, max_buffered_bytes, memory_bound_bytes;
  uint64_t control_accepted, control_refused; /* control requests of this rank */
  uint64_t captures_sent;
  uint64_t ops_recorded, ops_dropped; /* ops kept; over 4,096 a step or their step lost */
  /* Batches dropped as too large for max_message_bytes (their records are in records_dropped);
   * ops dropped from steps that alone would not fit a message (in ops_dropped too); Kafka
   * producers recreated after a fatal error. */
  uint64_t messages_oversized, ops_oversized, producer_restarts;
  /* Device time: marked steps sent with their device times; sent with host times only (missing,
   * too late, over device_hold_steps, or at destroy); rw_device_times_set calls that found no
   * held step of theirs (-1). */
  uint64_t device_steps, device_steps_missing, device_times_late;
} rw_stats;

/* When the device ran op `op_index` of a step (rw_op_add_indexed's result), on rw_now_ns()'s
 * clock: the caller converts its events' times onto it. */
typedef struct rw_device_op_time {
  uint32_t op_index;
  uint64_t begin_ns, end_ns;
} rw_device_op_time;

/* A step's device times (rw_device_times_set). */
typedef struct rw_device_times {
  uint64_t phase_ns[6]; /* indexed by enum rw_phase: the phase's device time (ns) */
  uint32_t phase_mask;  /* bit (1u << phase): phase_ns[phase] is set (the dataloader's ignored) */
  const rw_device_op_time* ops; /* n_ops device op times (copied); NULL when n_ops is 0 */
  size_t n_ops;
  int missing; /* != 0: the events did not complete in time: host times, STEP_CLOCK_DEVICE_MISSING
                */
} rw_device_times;

/* Creates a collector and starts its sender thread; never waits for the broker. Returns NULL
 * on bad arguments and, when `error` is not NULL, writes a message into it (NUL-terminated). */
rw_collector* rw_collector_create(const rw_identity* identity, const rw_options* options,
                                  char* error, size_t error_size);
/* Ships what is left (a final batch when `final` != 0: the rank ended cleanly), waits up to
 * `timeout_ms` for delivery and frees the collector. NULL is a no-op. */
void rw_collector_destroy(rw_collector* c, int final, int timeout_ms);

/* Monotonic nanoseconds: the clock of every *_ns argument. */
uint64_t rw_now_ns(void);
/* Opens `step` now; phases recorded since the previous rw_step_end belong to it. */
void rw_step_begin(rw_collector* c, uint64_t step);
/* Closes the open step now and queues its record. */
void rw_step_end(rw_collector* c);
/* Adds [begin_ns, end_ns) to `phase` of the open (or next) step. */
void rw_phase_add(rw_collector* c, enum rw_phase phase, uint64_t begin_ns, uint64_t end_ns);
/* Sets where the rank sits in the parallel layout (every batch carries it from now on): 0, or -1
 * when it does not fit the world size (then a message is written into `error` when not NULL). */
int rw_layout_set(rw_collector* c, const rw_layout* layout, char* error, size_t error_size);
/* Adds op [begin_ns, end_ns) of `type`, `microbatch` and model `chunk` to the open (or next)
 * step: 0, or -1 for a type this library does not know (nothing recorded). At most 4,096 ops a
 * step are kept; the rest are dropped and counted (rw_stats.ops_dropped). */
int rw_op_add(rw_collector* c, enum rw_op_type type, uint32_t microbatch, uint32_t chunk,
              uint64_t begin_ns, uint64_t end_ns);
/* rw_op_add that returns the op's index within its step (>= 0: what rw_device_times_set names
 * it by), or -1 when nothing was recorded (a type this library does not know, or over the
 * step's 4,096 ops). */
int rw_op_add_indexed(rw_collector* c, enum rw_op_type type, uint32_t microbatch, uint32_t chunk,
                      uint64_t begin_ns, uint64_t end_ns);
/* Starts timing an op now: `rw_op_scope op = rw_op_begin(RW_OP_FORWARD_COMPUTE, mb, 0);` */
rw_op_scope rw_op_begin(enum rw_op_type type, uint32_t microbatch, uint32_t chunk);
/* Ends the op `scope` began now and adds it to the open step (rw_op_add's result). */
int rw_op_end(rw_collector* c, const rw_op_scope* scope);
/* rw_op_end that returns the op's index within its step, or -1 (rw_op_add_indexed's result). */
int rw_op_end_indexed(rw_collector* c, const rw_op_scope* scope);
/* The open step's device times will follow (rw_device_times_set): its record is held at
 * rw_step_end until they come, device_hold_ms pass or more than device_hold_steps are held.
 * Training thread, while the step is open (or before: it marks the next step to end). */
void rw_step_expect_device_times(rw_collector* c);
/* Hands over the device times of step `step` (its rw_step_begin number; marked and ended):
 * 0, or -1 when no held step has that number (already sent with its host times, or never
 * marked; counted in rw_stats.device_times_late). `times` NULL means missing. Any thread. */
int rw_device_times_set(rw_collector* c, uint64_t step, const rw_device_times* times);
/* A garbage-collection pause [begin_ns, end_ns) of the open (or next) step: its gc_ns and
 * gc_count, and an op of type RW_OP_GC when it lasts 1 ms or more. */
void rw_gc_pause_add(rw_collector* c, uint64_t begin_ns, uint64_t end_ns);
/* Raises the open step's memory peaks (bytes; 0 = unknown). */
void rw_memory_peak(rw_collector* c, uint64_t allocated, uint64_t reserved, uint64_t capacity);
/* Copies `n` events into the collector's bounded kernel buffer. */
void rw_kernels_record(rw_collector* c, const rw_kernel_event* events, size_t n);
/* How the job trains ("ddp", "fsdp", "deepspeed_zero3", ...; NULL = "" = not said) and whether
 * it shards parameters across ranks (`sharded` != 0: FSDP, ZeRO-3): carried by every batch
 * from now on. */
void rw_training_strategy_set(rw_collector* c, const char* training_strategy, int sharded);
/* Waits up to `timeout_ms` until everything recorded so far is delivered; 0 when it was. */
int rw_flush(rw_collector* c, int timeout_ms);

/* Takes the oldest accepted capture request into `out`: 1 when one was waiting, 0 when none
 * (or without `take_captures`). Training thread; costs one atomic load when none waits. */
int rw_capture_take(rw_collector* c, rw_capture_request* out);
/* Answers capture `request_id`: its `n` events (copied; at most 50,000 are sent, a reply
 * says how many were cut), tagged with the request, in as many batches as max_message_bytes
 * needs, then its DONE reply with the first step
 * profiled, the steps profiled and their step times summed (ns). `source_format` names the
 * profiler (NULL = "rw_capture"). Any thread; never blocks on Kafka. */
void rw_capture_send(rw_collector* c, const char* request_id, const char* source_format,
                     int64_t first_step, uint32_t steps, uint64_t profiled_step_ns,
                     const rw_kernel_event* events, size_t n);
/* Answers capture `request_id` FAILED with `reason` (NULL = "failed"): the application began
 * and could not finish. Any thread. */
void rw_capture_fail(rw_collector* c, const char* request_id, const char* reason);
void rw_stats_get(const rw_collector* c, rw_stats* out);

#ifdef __cplusplus
}
#endif

#endif /* RANKWATCH_COLLECTOR_H_ */
