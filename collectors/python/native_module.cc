// rankwatch._native: the pybind11 binding of the collector library for the `rankwatch`
// Python package (collectors/python/rankwatch/). Calls that can wait (flush, close) release
// the GIL; recording calls are a few atomic operations and keep it.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <stdexcept>

#include "collectors/lib/collector.h"
#include "collectors/lib/process_memory.h"

namespace py = pybind11;
using rankwatch::Collector;
using rankwatch::StepPhase;

namespace {

std::unique_ptr<Collector> MakeCollector(const std::string& training_job, uint32_t rank,
                                         uint32_t world_size, const std::string& node,
                                         uint32_t local_rank, uint32_t pid,
                                         const std::string& device, const std::string& brokers,
                                         const std::string& topic, int flush_interval_ms,
                                         size_t step_ring_capacity, size_t max_pending_bytes,
                                         int kafka_queue_max_messages, int kafka_queue_max_kbytes,
                                         const std::map<std::string, std::string>& properties) {
  rankwatch::CollectorIdentity id{training_job, rank, world_size, node, local_rank, pid, device,
                                  /*training_strategy=*/"", /*sharded=*/false};
  rankwatch::CollectorOptions o;
  o.brokers = brokers;
  o.topic = topic;
  o.flush_interval_ms = flush_interval_ms;
  o.step_ring_capacity = step_ring_capacity;
  o.max_pending_bytes = max_pending_bytes;
  o.kafka_queue_max_messages = kafka_queue_max_messages;
  o.kafka_queue_max_kbytes = kafka_queue_max_kbytes;
  for (const auto& [k, v] : properties) o.properties[k] = v;
  auto c = Collector::Create(std::move(id), std::move(o));
  if (!c.ok()) throw std::invalid_argument(std::string(c.status().message()));
  return std::move(*c);
}

}  // namespace

PYBIND11_MODULE(_native, m) {
  m.doc() = "rankwatch collector library (C++), bound for the rankwatch package";
  // The training script owns stdout: the collector's (and librdkafka's) log lines go to stderr.
  spdlog::set_default_logger(spdlog::stderr_color_mt("rankwatch"));
  m.def("now_ns", &Collector::NowNs, "monotonic clock, ns: the clock of every *_ns argument");
  m.attr("PHASE_DATALOADER") = static_cast<int>(StepPhase::kDataloader);
  m.attr("PHASE_FORWARD") = static_cast<int>(StepPhase::kForward);
  m.attr("PHASE_BACKWARD") = static_cast<int>(StepPhase::kBackward);
  m.attr("PHASE_OPTIMIZER") = static_cast<int>(StepPhase::kOptimizer);
  m.attr("PHASE_COLLECTIVE") = static_cast<int>(StepPhase::kCollective);
  m.attr("PHASE_FORWARD_BACKWARD") = static_cast<int>(StepPhase::kForwardBackward);

  py::class_<Collector>(m, "Collector")
      .def(py::init(&MakeCollector), py::arg("training_job"), py::arg("rank"),
           py::arg("world_size"), py::arg("node"), py::arg("local_rank"), py::arg("pid"),
           py::arg("device"), py::arg("brokers"), py::arg("topic") = "rankwatch.telemetry",
           py::arg("flush_interval_ms") = 1000, py::arg("step_ring_capacity") = 4096,
           py::arg("max_pending_bytes") = 4u << 20, py::arg("kafka_queue_max_messages") = 4,
           py::arg("kafka_queue_max_kbytes") = 4096,
           py::arg("properties") = std::map<std::string, std::string>{})
      .def("begin_step", [](Collector& c, uint64_t step) { c.BeginStep(step, Collector::NowNs()); })
      .def("end_step", [](Collector& c) { c.EndStep(Collector::NowNs()); })
      .def(
          "end_step_with_peak_rss",
          [](Collector& c, rankwatch::ProcessPeakMemory& peak) {
            // One call at the end of a CPU rank's step: its peak RSS and the process's memory
            // capacity (cgroup limit, else MemTotal), then the step's end.
            c.RecordMemory(peak.TakePeakBytes(), 0, peak.capacity_bytes());
            c.EndStep(Collector::NowNs());
          },
          py::arg("peak"))
      .def("add_phase",
           [](Collector& c, int phase, uint64_t begin_ns, uint64_t end_ns) {
             if (phase < 0 || phase >= rankwatch::kStepPhaseCount) {
               throw std::invalid_argument("unknown phase " + std::to_string(phase));
             }
             c.AddPhase(static_cast<StepPhase>(phase), begin_ns, end_ns);
           })
      .def(
          "set_training_strategy",
          [](Collector& c, const std::string& training_strategy, bool sharded) {
            c.SetTrainingStrategy(training_strategy, sharded);
          },
          py::arg("training_strategy"), py::arg("sharded") = false,
          "how the job trains (\"ddp\", \"fsdp\", ...) and whether it shards parameters: "
          "in every batch from now on")
      .def_property_readonly("training_strategy",
                             [](const Collector& c) { return c.identity().training_strategy; })
      .def_property_readonly("sharded", [](const Collector& c) { return c.identity().sharded; })
      .def("record_memory", &Collector::RecordMemory, py::arg("peak_allocated"),
           py::arg("peak_reserved") = 0, py::arg("capacity") = 0)
      .def("record_kernels",
           [](Collector& c, const std::vector<py::tuple>& events) {
             // (name, category, ts_ns, dur_ns, stream, correlation, step)
             std::vector<rankwatch::KernelEventInput> in;
             in.reserve(events.size());
             for (const py::tuple& t : events) {
               if (t.size() != 7) throw std::invalid_argument("kernel events are 7-tuples");
               in.push_back({t[0].cast<std::string>(), t[1].cast<std::string>(),
                             t[2].cast<int64_t>(), t[3].cast<int64_t>(), t[4].cast<int64_t>(),
                             t[5].cast<int64_t>(), t[6].cast<int64_t>()});
             }
             c.RecordKernels(in);
           })
      .def(
          "flush",
          [](Collector& c, int timeout_ms) {
            return c.Flush(std::chrono::milliseconds(timeout_ms)).ok();
          },
          py::arg("timeout_ms") = 10000, py::call_guard<py::gil_scoped_release>())
      .def(
          "close",
          [](Collector& c, bool final, int timeout_ms) {
            return c.Close(final, std::chrono::milliseconds(timeout_ms)).ok();
          },
          py::arg("final") = true, py::arg("timeout_ms") = 10000,
          py::call_guard<py::gil_scoped_release>())
      .def("stats",
           [](const Collector& c) {
             const rankwatch::CollectorStats s = c.stats();
             py::dict d;
             d["steps_recorded"] = s.steps_recorded;
             d["kernels_recorded"] = s.kernels_recorded;
             d["records_dropped"] = s.records_dropped;
             d["batches_dropped"] = s.batches_dropped;
             d["batches_produced"] = s.batches_produced;
             d["batches_delivered"] = s.batches_delivered;
             d["batches_failed"] = s.batches_failed;
             d["buffered_bytes"] = s.buffered_bytes;
             d["max_buffered_bytes"] = s.max_buffered_bytes;
             d["memory_bound_bytes"] = s.memory_bound_bytes;
             return d;
           })
      .def_property_readonly("memory_bound_bytes", &Collector::memory_bound_bytes);

  py::class_<rankwatch::ProcessPeakMemory>(m, "ProcessPeakMemory")
      .def(py::init<>())
      .def("take_peak_bytes", &rankwatch::ProcessPeakMemory::TakePeakBytes,
           "peak RSS (bytes) since the previous call")
      .def_property_readonly("resets", &rankwatch::ProcessPeakMemory::resets)
      .def_property_readonly("status_reads", &rankwatch::ProcessPeakMemory::status_reads)
      .def_property_readonly("capacity_bytes", &rankwatch::ProcessPeakMemory::capacity_bytes,
                             "the process's memory capacity: its cgroup's limit, else MemTotal");
}
