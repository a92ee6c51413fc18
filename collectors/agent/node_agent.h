// NodeAgent: the per-node side of the collectors. Every tick it samples the host and the
// training processes (ProcSampler) and the GPUs when NVML is present (NvmlProbe), and
// publishes new profiler traces found by a TraceWatcher: Ascend iteration traces as the step
// records of their rank (read with traces/iteration_trace.h, as `rankwatch replay` does) and
// Kineto traces as the kernel events of the rank in their distributedInfo, step by step
// (collectors/kineto_replay.h, as `rankwatch replay` does, without marking the rank final).
//
// Captures (control.proto): with a control listener (ControlListenerOptions.rank = kEveryRank,
// no reply sink), the agent answers the capture requests of its job for the ranks whose Kineto
// traces appear in its trace directory. It does not start a profiler: the job's own profiler
// writes traces on its schedule (torch.profiler with a repeating schedule and
// tensorboard_trace_handler, an on-demand trace), and the agent sends the next trace file of
// each addressed rank that completes before the request's deadline, tagged with the request
// id: the first `steps` profiler steps of it, then DONE (first step, steps, events, and the
// span of those steps' events as their time). A rank whose trace it has seen is answered
// ACCEPTED at once (on first sight, for a trace seen later); a rank it accepted and that wrote
// no trace by the deadline is answered FAILED. A rank whose traces it never saw is never
// answered by this agent: another agent, or the rank's own collector, speaks for it.
//
// Flight Recorder dumps (collectors/agent/fr_dump_watcher.h): with `flight_recorder_prefixes`
// (each a job's TORCH_NCCL_DEBUG_INFO_TEMP_FILE), every dump a rank writes is read
// (flight_recorder/fr_reader.h) and published in a batch of its own with the rank's identity
// (the job, the dump's rank), trimmed for transport (flight_recorder/fr_proto.h); an unreadable
// file too, with the reader's error. With `flight_recorder_pipe_prefixes` (each a job's
// TORCH_NCCL_DEBUG_INFO_PIPE_FILE) the agent takes the job's Flight Recorder requests
// (FlightRecorderAction): for each addressed rank whose pipe it finds it writes one byte to the
// pipe and answers ACCEPTED (FAILED when nobody reads the pipe), then DONE when the rank's
// dump appears, or FAILED at the request's deadline. Ranks without a pipe here are not answered.
//
// The world size of a dump's batch is `world_size` when the rank is below it, else the largest
// group in the dumps seen (set --world-size to the job's).
//
// Message size: every batch fits a Kafka message of the publisher's max_message_bytes
// (BatchPublisher::max_batch_bytes; `rankwatch agent --max-message-bytes`, default 1,000,000):
// an iteration trace's steps and a Kineto trace's events go in as many batches as that needs
// (room kept in the latter for a capture's id in the copies sent for a capture), and a Flight
// Recorder dump is trimmed to it (flight_recorder_transport.max_bytes at most that). A batch
// the producer still refuses as too large is counted (batches_oversized) and not retried.
//
// System samples never wait: when librdkafka's queue is full the batch is dropped and
// counted. A trace file's batches wait for room instead (a trace is worth more than a sample
// and comes in many batches), for at most `trace_publish_timeout` per file; then the file
// counts as failed. Samples pause while a trace is published.
//
// Not thread-safe: Tick() from one thread; counters() from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "collectors/agent/fr_dump_watcher.h"
#include "collectors/agent/nvml_probe.h"
#include "collectors/agent/proc_sampler.h"
#include "collectors/agent/trace_watcher.h"
#include "collectors/batch_publisher.h"
#include "collectors/lib/control_listener.h"
#include "flight_recorder/fr_proto.h"

namespace rankwatch {

struct NodeAgentOptions {
  // Identity of the agent's batches. Use the training job's id and world size when the agent
  // serves one job; the daemon creates a job from the first batch it sees with its world size.
  std::string training_job;              // required
  uint32_t rank = 0;                     // default: 0
  uint32_t world_size = 1;               // default: 1
  std::string node;                      // default: the host name (set by the caller)
  std::string trace_dir;                 // default: none (no trace watching)
  bool include_existing_traces = false;  // default: traces already there are not published
  ProcSamplerOptions proc;
  std::string nvml_library = "libnvidia-ml.so.1";  // default: libnvidia-ml.so.1
  // How long one trace file's batches may wait for Kafka in all. Default: 30 s.
  std::chrono::milliseconds trace_publish_timeout{30'000};
  // Flight Recorder dump prefixes to watch, and dump-request pipe prefixes. Default: none.
  std::vector<std::string> flight_recorder_prefixes;
  std::vector<std::string> flight_recorder_pipe_prefixes;
  // Dumps already there at start are published too (--include-existing, like traces).
  bool include_existing_dumps = false;
  fr::FrTransportOptions flight_recorder_transport;
};

struct NodeAgentCounters {
  std::atomic<uint64_t> samples{0};            // system samples published
  std::atomic<uint64_t> batches_sent{0};       // batches handed to Kafka
  std::atomic<uint64_t> batches_dropped{0};    // refused while the producer queue was full
  std::atomic<uint64_t> batches_oversized{0};  // refused as too large for a Kafka message
  std::atomic<uint64_t> trace_files_published{0};
  std::atomic<uint64_t> trace_files_failed{0};    // unreadable or unpublishable traces
  std::atomic<uint64_t> trace_steps{0};           // step records read from iteration traces
  std::atomic<uint64_t> trace_kernel_events{0};   // kernel events published from Kineto traces
  std::atomic<uint64_t> capture_requests{0};      // capture requests of the job taken
  std::atomic<uint64_t> capture_ranks_done{0};    // (request, rank) answered DONE
  std::atomic<uint64_t> capture_ranks_failed{0};  // (request, rank) answered FAILED
  std::atomic<uint64_t> fr_dumps_published{0};    // Flight Recorder dumps read and published
  std::atomic<uint64_t> fr_dumps_unreadable{0};   // published as unreadable, with the error
  std::atomic<uint64_t> fr_dumps_failed{0};       // could not be published
  std::atomic<uint64_t> fr_requests{0};           // Flight Recorder requests of the job taken
  std::atomic<uint64_t> fr_ranks_triggered{0};    // (request, rank): byte written to its pipe
  std::atomic<uint64_t> fr_ranks_done{0};         // (request, rank): its dump came, DONE
  std::atomic<uint64_t> fr_ranks_failed{0};       // (request, rank): FAILED
};

class NodeAgent {
 public:
  // `publisher` must outlive the agent. `control` (optional): the job's control requests, read
  // for every rank (kEveryRank) with no reply sink; the agent answers them.
  NodeAgent(NodeAgentOptions options, BatchPublisher* publisher,
            std::unique_ptr<ControlListener> control = nullptr);

  // One round at wall time `unix_ns`: a system sample, then any new trace files.
  void Tick(int64_t unix_ns);

  const NodeAgentCounters& counters() const { return counters_; }
  unsigned gpu_count() const { return nvml_ ? nvml_->device_count() : 0; }

 private:
  // `world_size` 0: the agent's.
  v1::Batch NewBatch(uint32_t rank, int64_t unix_ns, uint32_t world_size = 0);
  bool Publish(v1::Batch* batch);
  // A trace file's batch: waits for room in the producer's queue until `deadline`
  // (DeadlineExceeded then; other refusals as the publisher says).
  absl::Status PublishWaiting(v1::Batch* batch, std::chrono::steady_clock::time_point deadline);
  void PublishTrace(const FoundTrace& trace, int64_t unix_ns);
  void PublishKinetoTrace(const FoundTrace& trace, int64_t unix_ns);

  // --- captures ---
  struct Capture {
    v1::ControlRequest request;
    std::set<uint32_t> accepted;  // ranks answered ACCEPTED, not yet DONE or FAILED
    std::set<uint32_t> answered;  // ranks answered DONE or FAILED
  };
  // One capture's part of the trace file being published.
  struct FileCapture {
    uint32_t rank = 0;
    std::set<int64_t> steps;  // the profiler steps sent, at most the request's
    std::map<int64_t, std::pair<int64_t, int64_t>> span;  // step: first start, last end (ns)
    uint64_t events = 0;
  };
  bool Addresses(const Capture& c, uint32_t rank) const;
  void TakeCaptures(int64_t unix_ns);
  void ExpireCaptures(int64_t unix_ns);
  void Reply(uint32_t rank, v1::ControlReply reply, int64_t unix_ns);
  void Accept(Capture& c, uint32_t rank, int64_t unix_ns);
  // A batch of a Kineto trace was published: the captures that wait for its rank get their
  // copy (their steps' events). Fails as publishing does.
  absl::Status ForwardToCaptures(const v1::Batch& batch,
                                 std::chrono::steady_clock::time_point deadline,
                                 std::map<std::string, FileCapture>* file, int64_t unix_ns);

  // --- Flight Recorder ---
  struct DumpRequest {
    v1::ControlRequest request;
    std::set<uint32_t> triggered;  // ranks whose pipe took the byte, not yet DONE
  };
  void TakeDumpRequests(int64_t unix_ns);
  void ExpireDumpRequests(int64_t unix_ns);
  void PublishDump(const FoundDump& found, int64_t unix_ns);
  // The world size of rank `rank`'s batches (see the class comment).
  uint32_t DumpWorldSize(uint32_t rank) const;
  void ReplyDump(const v1::ControlRequest& request, uint32_t rank, v1::ControlState state,
                 const std::string& reason, int64_t unix_ns);

  const NodeAgentOptions options_;
  BatchPublisher* publisher_;
  // options_.flight_recorder_transport, its max_bytes within what a batch may carry.
  fr::FrTransportOptions fr_transport_;
  ProcSampler sampler_;
  std::unique_ptr<NvmlProbe> nvml_;
  std::unique_ptr<TraceWatcher> watcher_;
  std::unique_ptr<ControlListener> control_;
  std::vector<Capture> captures_;   // open: some addressed rank may still answer
  std::set<uint32_t> trace_ranks_;  // ranks whose Kineto traces appeared in the directory
  std::unique_ptr<FrDumpWatcher> dump_watcher_;
  std::vector<DumpRequest> dump_requests_;  // open: some triggered rank has not dumped yet
  uint32_t dump_world_size_ = 0;            // the largest group in the dumps read
  uint64_t sequence_ = 0;
  uint64_t dropped_since_last_ = 0;
  NodeAgentCounters counters_;
  std::string buffer_;
};

}  // namespace rankwatch
