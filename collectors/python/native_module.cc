// rankwatch._native: the pybind11 binding of the collector library for the `rankwatch`
// Python package (collectors/python/rankwatch/). Calls that can wait (flush, close) release
// the GIL; recording calls are a few atomic operations and keep it.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cctype>
#include <stdexcept>

#include "collectors/lib/collector.h"
#include "collectors/lib/process_memory.h"
#include "wire/schema.h"

namespace py = pybind11;
using rankwatch::Collector;
using rankwatch::StepPhase;

namespace {

std::unique_ptr<Collector> MakeCollector(
    const std::string& training_job, uint32_t rank, uint32_t world_size, const std::string& node,
    uint32_t local_rank, uint32_t pid, const std::string& device, const std::string& brokers,
    const std::string& topic, int flush_interval_ms, size_t step_ring_capacity,
    size_t max_pending_bytes, int kafka_queue_max_messages, int kafka_queue_max_kbytes,
    const std::map<std::string, std::string>& properties, const std::string& control_topic,
    bool take_stacks, const std::map<std::string, std::string>& scheduler, bool watch_gc,
    size_t max_ops_per_step, uint64_t gc_op_min_ns, size_t max_message_bytes, int device_hold_ms,
    size_t device_hold_steps) {
  rankwatch::CollectorIdentity id{training_job,
                                  rank,
                                  world_size,
                                  node,
                                  local_rank,
                                  pid,
                                  device,
                                  /*training_strategy=*/"",
                                  /*sharded=*/false};
  auto field = [&scheduler](const char* key) {
    auto it = scheduler.find(key);
    return it == scheduler.end() ? std::string() : it->second;
  };
  id.scheduler = field("scheduler");
  id.scheduler_job = field("scheduler_job");
  id.k8s_namespace = field("namespace");
  id.owner = field("owner");
  id.pod = field("pod");
  rankwatch::CollectorOptions o;
  o.brokers = brokers;
  o.topic = topic;
  o.flush_interval_ms = flush_interval_ms;
  o.step_ring_capacity = step_ring_capacity;
  o.max_pending_bytes = max_pending_bytes;
  o.kafka_queue_max_messages = kafka_queue_max_messages;
  o.kafka_queue_max_kbytes = kafka_queue_max_kbytes;
  o.control_topic = control_topic;
  o.take_stacks = take_stacks;
  o.watch_gc = watch_gc;
  o.max_ops_per_step = max_ops_per_step;
  o.gc_op_min_ns = gc_op_min_ns;
  if (max_message_bytes > 0) o.max_message_bytes = max_message_bytes;
  o.device_hold_ms = device_hold_ms;
  o.device_hold_steps = device_hold_steps;
  for (const auto& [k, v] : properties) o.properties[k] = v;
  auto c = Collector::Create(std::move(id), std::move(o));
  if (!c.ok()) throw std::invalid_argument(std::string(c.status().message()));
  return std::move(*c);
}

// (name, category, ts_ns, dur_ns, stream, correlation, step[, tid]) tuples.
std::vector<rankwatch::KernelEventInput> KernelEvents(const std::vector<py::tuple>& events) {
  std::vector<rankwatch::KernelEventInput> in;
  in.reserve(events.size());
  for (const py::tuple& t : events) {
    if (t.size() != 7 && t.size() != 8) {
      throw std::invalid_argument("kernel events are 7- or 8-tuples");
    }
    in.push_back({t[0].cast<std::string>(), t[1].cast<std::string>(), t[2].cast<int64_t>(),
                  t[3].cast<int64_t>(), t[4].cast<int64_t>(), t[5].cast<int64_t>(),
                  t[6].cast<int64_t>(), t.size() == 8 ? t[7].cast<uint64_t>() : 0});
  }
  return in;
}

// {"forward-compute": 1, ...}: every OpType but OP_UNSPECIFIED, named as the wire says
// (telemetry.proto: lower-case kebab form without the prefix).
py::dict OpTypes() {
  py::dict d;
  for (int i = rankwatch::v1::OpType_MIN; i <= rankwatch::v1::OpType_MAX; ++i) {
    if (i == rankwatch::v1::OP_UNSPECIFIED || !rankwatch::v1::OpType_IsValid(i)) continue;
    std::string name = rankwatch::v1::OpType_Name(static_cast<rankwatch::v1::OpType>(i)).substr(3);
    for (char& ch : name) ch = ch == '_' ? '-' : static_cast<char>(std::tolower(ch));
    d[py::str(name)] = i;
  }
  return d;
}

// The gc.callbacks entry rankwatch installs: a builtin function (METH_FASTCALL, no pybind11
// dispatch, which would cost more than a Python callback) whose `self` is a capsule holding
// its GcWatcher. Times each collection from "start" to "stop" and accounts it to the
// collector's open step (Collector::AddGcPause). CPython calls it with the GIL held, on the
// thread that collects; collections do not nest.
constexpr char kGcCapsule[] = "rankwatch._native.GcWatcher";

struct GcWatcher {
  PyObject* owner;  // the Python collector (a reference: it outlives the callback)
  Collector* collector;
  uint64_t begin_ns = 0;
};

PyObject* GcCallback(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  auto* w = static_cast<GcWatcher*>(PyCapsule_GetPointer(self, kGcCapsule));
  if (w == nullptr) return nullptr;
  if (nargs < 1 || !PyUnicode_Check(args[0])) {
    PyErr_SetString(PyExc_TypeError, "a gc callback takes (phase, info)");
    return nullptr;
  }
  if (PyUnicode_CompareWithASCIIString(args[0], "start") == 0) {
    w->begin_ns = Collector::NowNs();
  } else if (w->begin_ns != 0) {
    w->collector->AddGcPause(w->begin_ns, Collector::NowNs());
    w->begin_ns = 0;
  }
  Py_RETURN_NONE;
}

PyMethodDef kGcCallbackDef = {
    "rankwatch_gc_callback",
    reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&GcCallback)), METH_FASTCALL,
    "gc.callbacks entry: each collection is a GC pause of the collector's open step"};

py::object GcCallbackOf(py::object collector) {
  auto* w = new GcWatcher{collector.ptr(), &collector.cast<Collector&>()};
  Py_INCREF(w->owner);
  PyObject* capsule = PyCapsule_New(w, kGcCapsule, [](PyObject* cap) {
    auto* watcher = static_cast<GcWatcher*>(PyCapsule_GetPointer(cap, kGcCapsule));
    Py_DECREF(watcher->owner);
    delete watcher;
  });
  if (capsule == nullptr) {
    Py_DECREF(w->owner);
    delete w;
    throw py::error_already_set();
  }
  PyObject* fn = PyCFunction_New(&kGcCallbackDef, capsule);
  Py_DECREF(capsule);  // the function holds it
  if (fn == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(fn);
}

rankwatch::RankLayout LayoutOf(uint32_t data_rank, uint32_t data_size, uint32_t pipeline_rank,
                               uint32_t pipeline_size, uint32_t tensor_rank, uint32_t tensor_size,
                               uint32_t context_rank, uint32_t context_size, uint32_t expert_rank,
                               uint32_t expert_size, uint32_t virtual_stages) {
  auto size = [](uint32_t s) { return s == 0 ? 1u : s; };
  return rankwatch::RankLayout{data_rank,           size(data_size),     pipeline_rank,
                               size(pipeline_size), tensor_rank,         size(tensor_size),
                               context_rank,        size(context_size),  expert_rank,
                               size(expert_size),   size(virtual_stages)};
}

constexpr uint32_t kDefaultStackFrames = 64;
constexpr size_t kMaxStackThreads = 64;
constexpr size_t kMaxStackString = 512;
// A stacks reply stays under this and under what one batch carries (Collector::
// max_reply_bytes: max_message_bytes less the batch's envelope); frames beyond it are counted
// as omitted, the threads given first (the training thread) kept whole.
constexpr size_t kMaxStacksReplyBytes = 256 << 10;
// Room kept for the reply's own fields (request id, steps, ...) and the estimates' error.
constexpr size_t kStacksReplySlackBytes = 2048;

std::string Cut(std::string s) {
  if (s.size() > kMaxStackString) s.resize(kMaxStackString);
  return s;
}

// threads: (name, thread_id, training, [(file, line, function), ...] outermost first, omitted)
// collectives: (group, group_size, entered, completed)
rankwatch::v1::ControlReply StacksReply(const std::string& request_id,
                                        const std::vector<py::tuple>& threads,
                                        const std::vector<py::tuple>& collectives,
                                        int64_t last_step, bool in_step, size_t max_reply_bytes) {
  const size_t max_bytes =
      std::min(kMaxStacksReplyBytes, max_reply_bytes > 2 * kStacksReplySlackBytes
                                         ? max_reply_bytes - kStacksReplySlackBytes
                                         : max_reply_bytes / 2);
  rankwatch::v1::ControlReply r;
  r.set_request_id(request_id);
  r.set_state(rankwatch::v1::CONTROL_DONE);
  r.set_first_step(-1);
  r.set_last_step(last_step);
  r.set_in_step(in_step);
  size_t bytes = 0;
  for (const py::tuple& t : threads) {
    if (static_cast<size_t>(r.stacks_size()) == kMaxStackThreads) break;
    if (t.size() != 5) throw std::invalid_argument("a thread is a 5-tuple");
    rankwatch::v1::ThreadStack* th = r.add_stacks();
    th->set_name(Cut(t[0].cast<std::string>()));
    th->set_thread_id(t[1].cast<uint64_t>());
    th->set_training(t[2].cast<bool>());
    const auto frames = t[3].cast<std::vector<py::tuple>>();
    for (const py::tuple& f : frames) {
      if (f.size() != 3) throw std::invalid_argument("a frame is a (file, line, function) tuple");
    }
    uint32_t omitted = t[4].cast<uint32_t>();
    // Innermost frames matter most: when the reply is full, the outer ones are left out.
    size_t keep = frames.size();
    size_t need = 0;
    for (size_t i = frames.size(); i-- > 0;) {
      const size_t f =
          frames[i][0].cast<std::string>().size() + frames[i][2].cast<std::string>().size() + 16;
      if (bytes + need + f > max_bytes) break;
      need += f;
      keep = i;
    }
    omitted += static_cast<uint32_t>(keep);
    for (size_t i = keep; i < frames.size(); ++i) {
      const py::tuple& f = frames[i];
      rankwatch::v1::StackFrame* out = th->add_frames();
      out->set_file(Cut(f[0].cast<std::string>()));
      out->set_line(f[1].cast<uint32_t>());
      out->set_function(Cut(f[2].cast<std::string>()));
    }
    th->set_frames_omitted(omitted);
    bytes += need + th->name().size() + 16;
  }
  for (const py::tuple& t : collectives) {
    if (t.size() != 4) throw std::invalid_argument("a collective counter is a 4-tuple");
    std::string group = Cut(t[0].cast<std::string>());
    if (bytes + group.size() + 40 > max_bytes) break;  // the process groups past the bound
    bytes += group.size() + 40;
    rankwatch::v1::CollectiveCounter* c = r.add_collectives();
    c->set_group(std::move(group));
    c->set_group_size(t[1].cast<uint32_t>());
    c->set_entered(t[2].cast<uint64_t>());
    c->set_completed(t[3].cast<uint64_t>());
  }
  // The estimates above are close; the reply's own size decides. Outermost frames go first,
  // from the last thread that has any.
  for (int i = r.stacks_size() - 1; i >= 0 && r.ByteSizeLong() > max_bytes;) {
    rankwatch::v1::ThreadStack* th = r.mutable_stacks(i);
    if (th->frames_size() == 0) {
      --i;
      continue;
    }
    th->mutable_frames()->erase(th->mutable_frames()->begin());
    th->set_frames_omitted(th->frames_omitted() + 1);
  }
  while (r.ByteSizeLong() > max_bytes && r.collectives_size() > 0) {
    r.mutable_collectives()->RemoveLast();
  }
  return r;
}

rankwatch::v1::ControlState ControlStateNamed(const std::string& state) {
  if (state == "refused") return rankwatch::v1::CONTROL_REFUSED;
  if (state == "done") return rankwatch::v1::CONTROL_DONE;
  if (state == "failed") return rankwatch::v1::CONTROL_FAILED;
  throw std::invalid_argument("control reply state is refused, done or failed, not '" + state +
                              "'");
}

py::dict RequestDict(const rankwatch::v1::ControlRequest& r) {
  py::dict d;
  d["id"] = r.id();
  d["ranks"] = std::vector<uint32_t>(r.ranks().begin(), r.ranks().end());
  d["deadline_unix_ns"] = r.deadline_unix_ns();
  d["requested_by"] = r.requested_by();
  if (r.has_capture()) {
    d["action"] = "capture";
    d["steps"] = r.capture().steps();
    d["cuda"] = r.capture().cuda();
  } else if (r.has_stacks()) {
    d["action"] = "stacks";
    d["max_frames"] = r.stacks().max_frames() == 0 ? kDefaultStackFrames : r.stacks().max_frames();
  } else if (r.has_flight_recorder()) {
    d["action"] = "flight_recorder";
  } else {
    d["action"] = "unknown";
  }
  return d;
}

}  // namespace

PYBIND11_MODULE(_native, m) {
  m.doc() = "rankwatch collector library (C++), bound for the rankwatch package";
  // The training script owns stdout: the collector's (and librdkafka's) log lines go to stderr.
  spdlog::set_default_logger(spdlog::stderr_color_mt("rankwatch"));
  m.attr("VERSION") = RANKWATCH_VERSION;
  m.attr("SCHEMA_VERSION") = rankwatch::kSchemaVersion;
  m.def("now_ns", &Collector::NowNs, "monotonic clock, ns: the clock of every *_ns argument");
  m.attr("PHASE_DATALOADER") = static_cast<int>(StepPhase::kDataloader);
  m.attr("PHASE_FORWARD") = static_cast<int>(StepPhase::kForward);
  m.attr("PHASE_BACKWARD") = static_cast<int>(StepPhase::kBackward);
  m.attr("PHASE_OPTIMIZER") = static_cast<int>(StepPhase::kOptimizer);
  m.attr("PHASE_COLLECTIVE") = static_cast<int>(StepPhase::kCollective);
  m.attr("PHASE_FORWARD_BACKWARD") = static_cast<int>(StepPhase::kForwardBackward);
  m.attr("OP_TYPES") = OpTypes();

  py::class_<Collector>(m, "Collector")
      .def(py::init(&MakeCollector), py::arg("training_job"), py::arg("rank"),
           py::arg("world_size"), py::arg("node"), py::arg("local_rank"), py::arg("pid"),
           py::arg("device"), py::arg("brokers"), py::arg("topic") = "rankwatch.telemetry",
           py::arg("flush_interval_ms") = 1000, py::arg("step_ring_capacity") = 4096,
           py::arg("max_pending_bytes") = 4u << 20, py::arg("kafka_queue_max_messages") = 4,
           py::arg("kafka_queue_max_kbytes") = 4096,
           py::arg("properties") = std::map<std::string, std::string>{},
           py::arg("control_topic") = "rankwatch.control", py::arg("take_stacks") = false,
           py::arg("scheduler") = std::map<std::string, std::string>{}, py::arg("watch_gc") = false,
           py::arg("max_ops_per_step") = 4096, py::arg("gc_op_min_ns") = 1'000'000,
           py::arg("max_message_bytes") = 0, py::arg("device_hold_ms") = 10000,
           py::arg("device_hold_steps") = 16)
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
      .def("add_op",
           [](Collector& c, int type, uint32_t microbatch, uint32_t chunk, uint64_t begin_ns,
              uint64_t end_ns) {
             if (type == rankwatch::v1::OP_UNSPECIFIED || !rankwatch::v1::OpType_IsValid(type)) {
               throw std::invalid_argument("unknown op type " + std::to_string(type));
             }
             // The op's index within its step (set_device_times names it so); -1: dropped.
             return c.AddOp(static_cast<rankwatch::v1::OpType>(type), microbatch, chunk, begin_ns,
                            end_ns);
           })
      .def("expect_device_times", &Collector::ExpectDeviceTimes,
           "the open step's device times will follow (set_device_times): its record waits for "
           "them, at most device_hold_ms")
      .def(
          "set_device_times",
          [](Collector& c, uint64_t step, const std::vector<std::pair<int, uint64_t>>& phases,
             const std::vector<std::tuple<uint32_t, uint64_t, uint64_t>>& ops, bool missing) {
            rankwatch::DeviceTimes d;
            d.missing = missing;
            for (const auto& [phase, ns] : phases) {
              if (phase < 0 || phase >= rankwatch::kStepPhaseCount) {
                throw std::invalid_argument("unknown phase " + std::to_string(phase));
              }
              d.phases.phase_ns[phase] = ns;
              d.phases.phase_mask |= 1u << phase;
            }
            d.ops.reserve(ops.size());
            for (const auto& [index, begin_ns, end_ns] : ops) {
              d.ops.push_back({index, begin_ns, end_ns});
            }
            return c.SetDeviceTimes(step, d);
          },
          py::arg("step"), py::arg("phases"), py::arg("ops"), py::arg("missing") = false,
          "hands over step `step`'s device times: phases as (phase, device ns), ops as (op "
          "index, device begin ns, device end ns) on now_ns()'s clock; missing: the events did "
          "not complete in time (host times go). False when no held step has that number (sent "
          "with host times already, or never marked; counted in device_times_late)")
      .def("add_gc_pause", &Collector::AddGcPause)
      .def(
          "set_layout",
          [](Collector& c, uint32_t data_rank, uint32_t data_size, uint32_t pipeline_rank,
             uint32_t pipeline_size, uint32_t tensor_rank, uint32_t tensor_size,
             uint32_t context_rank, uint32_t context_size, uint32_t expert_rank,
             uint32_t expert_size, uint32_t virtual_stages) {
            const absl::Status s = c.SetLayout(LayoutOf(
                data_rank, data_size, pipeline_rank, pipeline_size, tensor_rank, tensor_size,
                context_rank, context_size, expert_rank, expert_size, virtual_stages));
            if (!s.ok()) throw std::invalid_argument(std::string(s.message()));
          },
          py::kw_only(), py::arg("data_rank") = 0, py::arg("data_size") = 1,
          py::arg("pipeline_rank") = 0, py::arg("pipeline_size") = 1, py::arg("tensor_rank") = 0,
          py::arg("tensor_size") = 1, py::arg("context_rank") = 0, py::arg("context_size") = 1,
          py::arg("expert_rank") = 0, py::arg("expert_size") = 1, py::arg("virtual_stages") = 1,
          "the rank's place in the parallel layout, in every batch from now on (ValueError when "
          "it does not fit the world size)")
      .def_property_readonly("layout",
                             [](const Collector& c) -> py::object {
                               const std::optional<rankwatch::RankLayout> l = c.identity().layout;
                               if (!l) return py::none();
                               py::dict d;
                               d["data_rank"] = l->data_rank;
                               d["data_size"] = l->data_size;
                               d["pipeline_rank"] = l->pipeline_rank;
                               d["pipeline_size"] = l->pipeline_size;
                               d["tensor_rank"] = l->tensor_rank;
                               d["tensor_size"] = l->tensor_size;
                               d["context_rank"] = l->context_rank;
                               d["context_size"] = l->context_size;
                               d["expert_rank"] = l->expert_rank;
                               d["expert_size"] = l->expert_size;
                               d["virtual_stages"] = l->virtual_stages;
                               return d;
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
      .def("record_collectives", &Collector::RecordCollectives, py::arg("entered"),
           "collectives issued so far on the default process group (each step carries it)")
      .def("record_kernels",
           [](Collector& c, const std::vector<py::tuple>& events) {
             c.RecordKernels(KernelEvents(events));
           })
      .def("control_pending", &Collector::control_pending,
           "accepted control requests wait (one atomic load: call it every step)")
      .def(
          "take_control_requests",
          [](Collector& c) {
            py::list out;
            for (const auto& r : c.TakeControlRequests()) out.append(RequestDict(r));
            return out;
          },
          "the accepted control requests, oldest first, as dicts (id, action, ranks, "
          "deadline_unix_ns, requested_by; steps and cuda for a capture)")
      .def(
          "wait_stack_requests",
          [](Collector& c, int timeout_ms) {
            std::vector<rankwatch::v1::ControlRequest> got;
            {
              py::gil_scoped_release unlocked;
              got = c.WaitStacksRequests(std::chrono::milliseconds(timeout_ms));
            }
            py::list out;
            for (const auto& r : got) out.append(RequestDict(r));
            return out;
          },
          py::arg("timeout_ms"),
          "waits (without the GIL) for stacks requests, each answered ACCEPTED already; [] after "
          "the timeout or once the collector closes")
      .def("wake_stack_waiters", &Collector::WakeStacksWaiters,
           py::call_guard<py::gil_scoped_release>(),
           "makes every wait_stack_requests call return now (with nothing)")
      .def(
          "reply_stacks",
          [](Collector& c, const std::string& request_id, const std::vector<py::tuple>& threads,
             const std::vector<py::tuple>& collectives, int64_t last_step, bool in_step) {
            c.ReplyControl(StacksReply(request_id, threads, collectives, last_step, in_step,
                                       c.max_reply_bytes()));
          },
          py::arg("request_id"), py::arg("threads"), py::arg("collectives"), py::arg("last_step"),
          py::arg("in_step"),
          "answers a stacks request DONE: threads as (name, id, training, frames outermost "
          "first as (file, line, function), omitted), collectives as (group, size, entered, "
          "completed)")
      .def(
          "reply_control",
          [](Collector& c, const std::string& request_id, const std::string& state,
             const std::string& reason, int64_t first_step, uint32_t steps,
             uint64_t profiled_step_ns) {
            rankwatch::v1::ControlReply r;
            r.set_request_id(request_id);
            r.set_state(ControlStateNamed(state));
            r.set_reason(reason);
            r.set_first_step(first_step);
            r.set_steps(steps);
            r.set_profiled_step_ns(profiled_step_ns);
            c.ReplyControl(std::move(r));
          },
          py::arg("request_id"), py::arg("state"), py::arg("reason") = "",
          py::arg("first_step") = -1, py::arg("steps") = 0, py::arg("profiled_step_ns") = 0)
      .def(
          "send_capture",
          [](Collector& c, const std::string& request_id, const std::string& source_format,
             const std::vector<py::tuple>& events, int64_t first_step, uint32_t steps,
             uint64_t profiled_step_ns) {
            rankwatch::v1::ControlReply done;
            done.set_request_id(request_id);
            done.set_state(rankwatch::v1::CONTROL_DONE);
            done.set_first_step(first_step);
            done.set_steps(steps);
            done.set_profiled_step_ns(profiled_step_ns);
            c.SendCapture(request_id, source_format, KernelEvents(events), std::move(done));
          },
          py::arg("request_id"), py::arg("source_format"), py::arg("events"), py::arg("first_step"),
          py::arg("steps"), py::arg("profiled_step_ns"),
          "ships a capture's events (batches of their own, tagged with the request id), then "
          "its DONE reply")
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
             d["ops_recorded"] = s.ops_recorded;
             d["ops_dropped"] = s.ops_dropped;
             d["gc_pauses"] = s.gc_pauses;
             d["gc_pauses_before_first_step"] = s.gc_pauses_before_first_step;
             d["messages_oversized"] = s.messages_oversized;
             d["ops_oversized"] = s.ops_oversized;
             d["producer_restarts"] = s.producer_restarts;
             d["device_steps"] = s.device_steps;
             d["device_steps_missing"] = s.device_steps_missing;
             d["device_times_late"] = s.device_times_late;
             py::dict control;
             control["reading"] = s.control.reading;
             control["messages"] = s.control.messages;
             control["accepted"] = s.control.accepted;
             control["duplicates"] = s.control.duplicates;
             py::dict refused;
             for (int i = 0; i < rankwatch::kControlRefusalCount; ++i) {
               refused[rankwatch::ControlRefusalName(static_cast<rankwatch::ControlRefusal>(i))] =
                   s.control.refused[i];
             }
             control["refused"] = refused;
             control["replies"] = s.control_replies;
             control["captures_sent"] = s.captures_sent;
             d["control"] = control;
             return d;
           })
      .def_property_readonly("memory_bound_bytes", &Collector::memory_bound_bytes)
      .def_property_readonly(
          "max_message_bytes", [](const Collector& c) { return c.max_message_bytes(); },
          "the largest Kafka message produced (message.max.bytes in effect)")
      .def_property_readonly("max_batch_bytes", &Collector::max_batch_bytes,
                             "the serialized bytes one telemetry batch may have within it")
      .def_property_readonly("max_reply_bytes", &Collector::max_reply_bytes,
                             "the bytes one control reply may have (stacks replies are cut "
                             "below it)");

  m.def("gc_callback", &GcCallbackOf, py::arg("collector"),
        "a gc.callbacks entry for `collector`: each collection, \"start\" to \"stop\", is a "
        "GC pause of its open step");

  py::class_<rankwatch::ProcessPeakMemory>(m, "ProcessPeakMemory")
      .def(py::init<>())
      .def("take_peak_bytes", &rankwatch::ProcessPeakMemory::TakePeakBytes,
           "peak RSS (bytes) since the previous call")
      .def_property_readonly("resets", &rankwatch::ProcessPeakMemory::resets)
      .def_property_readonly("status_reads", &rankwatch::ProcessPeakMemory::status_reads)
      .def_property_readonly("capacity_bytes", &rankwatch::ProcessPeakMemory::capacity_bytes,
                             "the process's memory capacity: its cgroup's limit, else MemTotal");
}
