// msprof timeline step_trace_*.json -> step records (see iteration_trace.h for the mapping).
#include <simdjson.h>

#include <cmath>
#include <map>

#include "traces/iteration_trace.h"

namespace rankwatch {
namespace {

struct Iteration {
  double time_ns = -1, fp_bp_ns = -1, refresh_ns = -1, reduce_ns = 0;
  double fp_start_us = NAN, end_us = NAN;
  bool has_reduce = false;
};

// Scale of a duration key's unit suffix "Name(ns)" / "(us)" / "(ms)", or 0 when `key` is not
// `name` with a unit.
double UnitToNs(std::string_view key, std::string_view name) {
  if (!key.starts_with(name) || key.size() < name.size() + 4) return 0;
  const std::string_view unit = key.substr(name.size());
  if (unit == "(ns)") return 1;
  if (unit == "(us)") return 1e3;
  if (unit == "(ms)") return 1e6;
  return 0;
}

// Finds "<name>(<unit>)" among `args` and returns it in ns, or -1.
double DurationArg(simdjson::dom::object args, std::string_view name) {
  for (auto field : args) {
    const double scale = UnitToNs(field.key, name);
    double v;
    if (scale > 0 && !field.value.get_double().get(v)) return v * scale;
  }
  return -1;
}

template <typename JsonValue>
double NumberOr(JsonValue e, std::string_view key, double fallback) {
  double v;
  return e[key].get_double().get(v) ? fallback : v;
}

absl::Status Fail(const std::filesystem::path& file, const std::string& why) {
  return absl::InvalidArgumentError(file.string() + ": " + why);
}

}  // namespace

absl::StatusOr<IterationTrace> ReadMsprofStepTrace(const std::filesystem::path& file) {
  IterationTrace trace;
  trace.file = file;
  trace.format = IterationTraceFormat::kMsprofStepTraceJson;
  // step_trace_<device>_<model>_<iteration>.json
  const std::string stem = file.stem().string();
  const std::string device = stem.substr(11, stem.find('_', 11) - 11);
  trace.device = "npu:" + device;
  trace.rank = static_cast<uint32_t>(std::stoul(device));

  simdjson::dom::parser parser;
  simdjson::dom::element info;
  const auto info_path = file.parent_path().parent_path() / ("info.json." + device);
  if (std::filesystem::exists(info_path)) {
    if (auto err = parser.load(info_path.string()).get(info)) {
      return Fail(info_path, std::string("not JSON: ") + simdjson::error_message(err));
    }
    int64_t rank;
    if (!info["rank_id"].get_int64().get(rank) && rank >= 0)
      trace.rank = static_cast<uint32_t>(rank);
    std::string_view host;
    if (!info["hostname"].get_string().get(host)) trace.node = std::string(host);
  }

  simdjson::dom::element doc;
  if (auto err = parser.load(file.string()).get(doc)) {
    return Fail(file, std::string("not JSON: ") + simdjson::error_message(err));
  }
  simdjson::dom::array events;
  if (doc.get_array().get(events) && doc["traceEvents"].get_array().get(events)) {
    return Fail(file, "neither a JSON array of events nor an object with traceEvents");
  }
  std::map<int64_t, Iteration> iterations;
  for (simdjson::dom::element e : events) {
    std::string_view cat, ph;
    if (e["cat"].get_string().get(cat) || e["ph"].get_string().get(ph) || ph != "X") continue;
    simdjson::dom::object args;
    int64_t id;
    if (e["args"].get_object().get(args) || args["Iteration ID"].get_int64().get(id)) {
      return Fail(file,
                  std::string("a '") + std::string(cat) + "' event without args.\"Iteration ID\"");
    }
    Iteration& it = iterations[id];
    if (cat == "Iteration Time") {
      it.time_ns = DurationArg(args, "Iteration Time");
      if (it.time_ns < 0) it.time_ns = NumberOr(e, "dur", -1e-3) * 1e3;
      it.fp_start_us = NumberOr(args, "FP Start", NAN);
      it.end_us = NumberOr(args, "Iteration End", NAN);
    } else if (cat == "FP_BP Time") {
      it.fp_bp_ns = DurationArg(args, "FP_BP Time");
      if (it.fp_bp_ns < 0) it.fp_bp_ns = NumberOr(e, "dur", -1e-3) * 1e3;
    } else if (cat == "Iteration Refresh") {
      it.refresh_ns = DurationArg(args, "Iteration Refresh");
      if (it.refresh_ns < 0) it.refresh_ns = NumberOr(e, "dur", -1e-3) * 1e3;
    } else if (cat == "Reduce") {
      it.reduce_ns += NumberOr(e, "dur", 0) * 1e3;
      it.has_reduce = true;
    }
  }
  if (iterations.empty()) return Fail(file, "no iteration events (cat \"Iteration Time\")");
  const Iteration* previous = nullptr;
  int64_t previous_id = 0;
  for (const auto& [id, it] : iterations) {
    if (it.time_ns < 0)
      return Fail(file, "iteration " + std::to_string(id) + " has no Iteration Time");
    v1::StepRecord r;
    r.set_step(static_cast<uint64_t>(id));
    // The gap between the previous iteration's end and this FP start: data loading and
    // augmentation (msprof's "Data_aug Bound"); 0 for the first iteration in the file.
    double gap_ns = 0;
    if (previous != nullptr &&
        previous_id + 1 == id &&  // previous_id < id: no overflow !std::isnan(previous->end_us) &&
        !std::isnan(it.fp_start_us)) {
      gap_ns = std::max(0.0, (it.fp_start_us - previous->end_us) * 1e3);
    }
    r.set_dataloader_ns(static_cast<uint64_t>(std::llround(gap_ns)));
    if (it.fp_bp_ns >= 0)
      r.set_forward_backward_ns(static_cast<uint64_t>(std::llround(it.fp_bp_ns)));
    if (it.refresh_ns >= 0) r.set_optimizer_ns(static_cast<uint64_t>(std::llround(it.refresh_ns)));
    if (it.has_reduce) r.set_collective_ns(static_cast<uint64_t>(std::llround(it.reduce_ns)));
    r.set_step_time_ns(static_cast<uint64_t>(std::llround(gap_ns + it.time_ns)));
    trace.steps.push_back(r);
    previous = &it;
    previous_id = id;
  }
  return trace;
}

}  // namespace rankwatch
