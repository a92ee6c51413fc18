#include "traces/whatif_chrome_trace.h"

#include <simdjson.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <tuple>
#include <utility>

#include "absl/status/status.h"
#include "traces/trace_file_buffer.h"

namespace rankwatch {
namespace {

using whatif::Layout;
using whatif::Op;
using whatif::OpKind;

// More workers (data ranks x stages) than any job has: a corrupt trace or meta file.
constexpr int64_t kMaxWorkers = int64_t{1} << 20;

absl::Status Bad(const std::filesystem::path& file, const std::string& why) {
  return absl::InvalidArgumentError(file.string() + ": " + why);
}

struct Meta {
  std::string trial_name;
  Layout layout;
  uint32_t dsp = 1;
  uint32_t world_size = 0;
};

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r'))
    s.remove_suffix(1);
  return s;
}

// The meta yaml is flat `key: value` lines; unknown keys are ignored.
absl::StatusOr<Meta> ParseMeta(std::string_view text, const std::filesystem::path& file) {
  Meta m;
  int line_no = 0;
  std::map<std::string, uint32_t> sizes;
  while (!text.empty()) {
    ++line_no;
    const size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text.remove_prefix(nl == std::string_view::npos ? text.size() : nl + 1);
    if (const size_t hash = line.find('#'); hash != std::string_view::npos) {
      line = line.substr(0, hash);
    }
    line = Trim(line);
    if (line.empty() || line == "---") continue;
    const size_t colon = line.find(':');
    if (colon == std::string_view::npos) {
      return Bad(file, "line " + std::to_string(line_no) + ": expected `key: value`");
    }
    const std::string key(Trim(line.substr(0, colon)));
    std::string_view value = Trim(line.substr(colon + 1));
    if (value.size() >= 2 && (value.front() == '\'' || value.front() == '"') &&
        value.back() == value.front()) {
      value = value.substr(1, value.size() - 2);
    }
    if (key == "trial_name") {
      m.trial_name = std::string(value);
    } else if (key.size() > 5 && key.ends_with("_size")) {
      uint32_t v = 0;
      const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
      if (ec != std::errc() || end != value.data() + value.size() || v == 0) {
        return Bad(file, "line " + std::to_string(line_no) + ": " + key +
                             " must be a positive integer, got '" + std::string(value) + "'");
      }
      sizes[key] = v;
    }
  }
  auto size = [&](const char* key) {
    const auto it = sizes.find(key);
    return it == sizes.end() ? 1u : it->second;
  };
  m.layout.dp = size("dp_size");
  m.layout.pp = size("pp_size");
  m.layout.tp = size("tp_size");
  m.layout.vpp = size("vpp_size");
  m.dsp = size("dsp_size");
  if (const auto it = sizes.find("world_size"); it != sizes.end()) {
    m.world_size = it->second;
    const uint64_t product = uint64_t{m.layout.dp} * m.layout.pp * m.layout.tp * m.dsp;
    if (product != m.world_size) {
      return Bad(file,
                 "world_size " + std::to_string(m.world_size) +
                     " is not dp_size * pp_size * tp_size * dsp_size = " + std::to_string(product));
    }
  }
  return m;
}

struct RawEvent {
  uint64_t step = 0;
  int64_t pid = 0;
  int64_t tid = 0;
  int64_t seq = 0;
  double ts = 0;
  double dur = 0;
  OpKind kind = OpKind::kUnspecified;
  uint16_t microbatch = 0;
  uint16_t chunk = 0;
  uint32_t worker = 0;  // set once the threads are known
};

struct ThreadName {
  uint32_t stage = 0;
  uint32_t tp = 0;
};

// "PP rank <stage>, TP rank <t>, <lane>".
std::optional<ThreadName> ParseThreadName(std::string_view name) {
  unsigned stage = 0, tp = 0;
  int consumed = 0;
  const std::string s(name);
  if (std::sscanf(s.c_str(), "PP rank %u, TP rank %u, %n", &stage, &tp, &consumed) != 2 ||
      consumed == 0) {
    return std::nullopt;
  }
  return ThreadName{stage, tp};
}

// An integer member that may be written as a JSON integer or a whole float.
bool GetInt(simdjson::dom::element e, int64_t* out) {
  int64_t i = 0;
  if (e.get_int64().get(i) == simdjson::SUCCESS) {
    *out = i;
    return true;
  }
  double d = 0;
  if (e.get_double().get(d) == simdjson::SUCCESS && std::isfinite(d) && d == std::floor(d)) {
    *out = static_cast<int64_t>(d);
    return true;
  }
  return false;
}

bool GetNumber(simdjson::dom::element e, double* out) {
  double d = 0;
  if (e.get_double().get(d) != simdjson::SUCCESS || !std::isfinite(d)) return false;
  *out = d;
  return true;
}

std::string EventWhere(size_t index) { return "event " + std::to_string(index); }

}  // namespace

absl::StatusOr<WhatifTrace> ParseWhatifChromeTrace(std::string_view json,
                                                   std::string_view meta_yaml,
                                                   const std::filesystem::path& file) {
  WhatifTrace trace;
  trace.file = file;
  std::optional<Meta> meta;
  if (!meta_yaml.empty()) {
    auto m = ParseMeta(meta_yaml, file.parent_path() / "meta.yaml");
    if (!m.ok()) return m.status();
    meta = *std::move(m);
  }

  simdjson::dom::parser parser;
  simdjson::dom::element root;
  if (auto err = parser.parse(json.data(), json.size(), false).get(root); err) {
    return Bad(file, std::string("not valid JSON: ") + simdjson::error_message(err));
  }
  simdjson::dom::array events;
  if (root.is_array()) {
    events = root.get_array().value_unsafe();
  } else if (root.is_object()) {
    if (root["traceEvents"].get_array().get(events) != simdjson::SUCCESS) {
      return Bad(file, "a JSON object without a traceEvents array");
    }
  } else {
    return Bad(file, "not a Chrome trace: expected an array of events or {\"traceEvents\": [...]}");
  }

  std::map<std::pair<int64_t, int64_t>, ThreadName> threads;
  std::vector<RawEvent> raw;
  size_t index = 0;
  for (simdjson::dom::element ev : events) {
    const size_t at = index++;
    std::string_view ph;
    if (ev["ph"].get_string().get(ph) != simdjson::SUCCESS) continue;  // not a trace event
    if (ph == "M") {
      std::string_view name;
      if (ev["name"].get_string().get(name) != simdjson::SUCCESS || name != "thread_name") {
        continue;
      }
      int64_t pid = 0, tid = 0;
      std::string_view tname;
      simdjson::dom::element pid_e, tid_e;
      if (ev["pid"].get(pid_e) || ev["tid"].get(tid_e) || !GetInt(pid_e, &pid) ||
          !GetInt(tid_e, &tid) || ev["args"]["name"].get_string().get(tname) != simdjson::SUCCESS) {
        return Bad(file, EventWhere(at) + ": thread_name without pid, tid or args.name");
      }
      const auto parsed = ParseThreadName(tname);
      if (parsed && (parsed->stage >= kMaxWorkers || parsed->tp >= kMaxWorkers)) {
        return Bad(
            file, EventWhere(at) + ": thread name '" + std::string(tname) + "': rank out of range");
      }
      if (!parsed) {
        return Bad(file, EventWhere(at) + ": thread name '" + std::string(tname) +
                             "' is not \"PP rank <stage>, TP rank <t>, <lane>\"");
      }
      threads[{pid, tid}] = *parsed;
      continue;
    }
    if (ph != "X") continue;
    RawEvent r;
    std::string_view name;
    if (ev["name"].get_string().get(name) != simdjson::SUCCESS) {
      return Bad(file, EventWhere(at) + ": X event without a name");
    }
    const auto kind = whatif::OpKindFromName(name);
    if (!kind) return Bad(file, EventWhere(at) + ": unknown op type '" + std::string(name) + "'");
    r.kind = *kind;
    simdjson::dom::element pid_e, tid_e, ts_e, dur_e;
    if (ev["pid"].get(pid_e) || ev["tid"].get(tid_e) || ev["ts"].get(ts_e) ||
        ev["dur"].get(dur_e) || !GetInt(pid_e, &r.pid) || !GetInt(tid_e, &r.tid) ||
        !GetNumber(ts_e, &r.ts) || !GetNumber(dur_e, &r.dur)) {
      return Bad(file, EventWhere(at) + " (" + std::string(name) +
                           "): pid, tid, ts and dur must be numbers");
    }
    if (r.dur < 0) {  // the study's own traces have a few, tens of µs: clock noise
      ++trace.negative_durations;
      r.dur = 0;
    }
    if (r.pid < 0 || r.pid >= kMaxWorkers) {
      return Bad(file, EventWhere(at) + ": pid " + std::to_string(r.pid) + " out of range");
    }
    simdjson::dom::object args;
    int64_t step = 0;
    simdjson::dom::element step_e;
    if (ev["args"].get_object().get(args) != simdjson::SUCCESS || args["step"].get(step_e) ||
        !GetInt(step_e, &step) || step < 0) {
      return Bad(file, EventWhere(at) + " (" + std::string(name) + "): no args.step");
    }
    r.step = static_cast<uint64_t>(step);
    int64_t v = -1;
    if (simdjson::dom::element e; args["mb_id"].get(e) == simdjson::SUCCESS && GetInt(e, &v)) {
      r.microbatch = static_cast<uint16_t>(std::clamp<int64_t>(v, 0, 65535));
    }
    v = -1;
    if (simdjson::dom::element e;
        args["model_chunk"].get(e) == simdjson::SUCCESS && GetInt(e, &v)) {
      r.chunk = static_cast<uint16_t>(std::clamp<int64_t>(v, 0, 65535));
    }
    if (simdjson::dom::element e; args["seq_id"].get(e) == simdjson::SUCCESS) GetInt(e, &r.seq);
    raw.push_back(r);
  }

  // Layout: the meta file's, else what the trace shows.
  uint32_t max_pid = 0, max_stage = 0, max_tp = 0, max_chunk = 0;
  std::vector<RawEvent> kept;
  kept.reserve(raw.size());
  for (RawEvent& r : raw) {
    const auto it = threads.find({r.pid, r.tid});
    if (it == threads.end()) {
      return Bad(file, "an X event (" + std::string(whatif::OpKindName(r.kind)) + ") on pid " +
                           std::to_string(r.pid) + " tid " + std::to_string(r.tid) +
                           ", a thread without a thread_name event");
    }
    max_tp = std::max(max_tp, it->second.tp);
    if (it->second.tp != 0) {
      ++trace.other_tp_events;
      continue;
    }
    max_pid = std::max<uint32_t>(max_pid, static_cast<uint32_t>(r.pid));
    max_stage = std::max(max_stage, it->second.stage);
    max_chunk = std::max<uint32_t>(max_chunk, r.chunk);
    r.worker = it->second.stage;  // the stage for now
    kept.push_back(r);
  }
  if (kept.empty()) return Bad(file, "no op events of TP rank 0");
  if (meta) {
    trace.layout = meta->layout;
    trace.trial_name = meta->trial_name;
    trace.context_parallel = meta->dsp;
    const Layout& l = trace.layout;
    if (max_pid >= l.dp || max_stage >= l.pp || max_tp >= l.tp || max_chunk >= l.vpp) {
      return Bad(file, "the trace has data rank " + std::to_string(max_pid) + ", PP rank " +
                           std::to_string(max_stage) + ", TP rank " + std::to_string(max_tp) +
                           ", model chunk " + std::to_string(max_chunk) +
                           ": outside the meta file's dp " + std::to_string(l.dp) + ", pp " +
                           std::to_string(l.pp) + ", tp " + std::to_string(l.tp) + ", vpp " +
                           std::to_string(l.vpp));
    }
  } else {
    trace.layout = Layout{max_pid + 1, max_stage + 1, max_tp + 1, max_chunk + 1};
  }
  const Layout& l = trace.layout;
  if (uint64_t{l.dp} * l.pp > kMaxWorkers) {
    return Bad(file, "a layout of " + std::to_string(uint64_t{l.dp} * l.pp) +
                         " workers (dp x pp): more than " + std::to_string(kMaxWorkers));
  }
  for (RawEvent& r : kept) r.worker = r.worker * l.dp + static_cast<uint32_t>(r.pid);
  std::sort(kept.begin(), kept.end(), [](const RawEvent& a, const RawEvent& b) {
    return std::tie(a.step, a.worker, a.ts, a.seq, a.kind) <
           std::tie(b.step, b.worker, b.ts, b.seq, b.kind);
  });
  trace.events = kept.size();
  for (size_t i = 0; i < kept.size();) {
    whatif::StepOps step;
    step.step = kept[i].step;
    step.workers.resize(l.workers());
    size_t j = i;
    for (; j < kept.size() && kept[j].step == step.step; ++j) {
      const RawEvent& r = kept[j];
      step.workers[r.worker].push_back(Op{r.kind, r.microbatch, r.chunk, r.ts, r.dur});
    }
    for (uint32_t w = 0; w < l.workers(); ++w) {
      if (step.workers[w].empty()) {
        return Bad(file, "step " + std::to_string(step.step) + ": no ops of data rank " +
                             std::to_string(w % l.dp) + ", stage " + std::to_string(w / l.dp));
      }
    }
    trace.steps.push_back(std::move(step));
    i = j;
  }
  if (trace.trial_name.empty()) {
    std::string stem = file.filename().string();
    for (const char* suffix : {".gz", ".json"}) {
      if (stem.ends_with(suffix)) stem.resize(stem.size() - std::strlen(suffix));
    }
    if (stem.starts_with("timeline-")) stem = stem.substr(9);
    trace.trial_name = stem;
  }
  return trace;
}

absl::StatusOr<WhatifTrace> ReadWhatifChromeTrace(const std::filesystem::path& path) {
  std::error_code ec;
  std::filesystem::path file = path;
  if (std::filesystem::is_directory(path, ec)) {
    std::vector<std::filesystem::path> found;
    for (const auto& entry : std::filesystem::directory_iterator(path, ec)) {
      const std::string name = entry.path().filename().string();
      if (name.starts_with("timeline-") &&
          (name.ends_with(".json") || name.ends_with(".json.gz"))) {
        found.push_back(entry.path());
      }
    }
    if (found.size() != 1) {
      return absl::InvalidArgumentError(path.string() +
                                        ": expected one timeline-*.json[.gz], found " +
                                        std::to_string(found.size()));
    }
    file = found[0];
  }
  auto buffer = TraceFileBuffer::Read(file);
  if (!buffer.ok()) return buffer.status();

  // The meta file: meta-<name>.yaml for timeline-<name>.json[.gz], else the folder's only
  // meta-*.yaml.
  std::string stem = file.filename().string();
  for (const char* suffix : {".gz", ".json"}) {
    if (stem.ends_with(suffix)) stem.resize(stem.size() - std::strlen(suffix));
  }
  if (stem.starts_with("timeline-")) stem = stem.substr(9);
  std::filesystem::path meta_file = file.parent_path() / ("meta-" + stem + ".yaml");
  if (!std::filesystem::exists(meta_file, ec)) {
    meta_file.clear();
    std::vector<std::filesystem::path> metas;
    for (const auto& entry : std::filesystem::directory_iterator(
             file.parent_path().empty() ? std::filesystem::path(".") : file.parent_path(), ec)) {
      const std::string name = entry.path().filename().string();
      if (name.starts_with("meta-") && (name.ends_with(".yaml") || name.ends_with(".yml"))) {
        metas.push_back(entry.path());
      }
    }
    if (metas.size() == 1) meta_file = metas[0];
  }
  std::string meta_text;
  if (!meta_file.empty()) {
    std::ifstream in(meta_file);
    if (!in) return absl::NotFoundError(meta_file.string() + ": cannot open");
    std::ostringstream ss;
    ss << in.rdbuf();
    meta_text = ss.str();
    if (meta_text.empty()) return Bad(meta_file, "empty meta file");
  }
  auto trace = ParseWhatifChromeTrace(buffer->view(), meta_text, file);
  if (!trace.ok()) {
    // Meta errors name the meta file, not the placeholder.
    const std::string msg(trace.status().message());
    const std::string placeholder = (file.parent_path() / "meta.yaml").string() + ": ";
    if (!meta_file.empty() && msg.starts_with(placeholder)) {
      return Bad(meta_file, msg.substr(placeholder.size()));
    }
    return trace.status();
  }
  trace->meta_file = meta_file;
  return trace;
}

std::vector<WhatifWorkerOp> WhatifWorkerTimeline(const WhatifTrace& trace, uint32_t worker) {
  std::vector<WhatifWorkerOp> out;
  for (const whatif::StepOps& step : trace.steps) {
    if (worker >= step.workers.size()) break;
    for (const Op& op : step.workers[worker]) out.push_back({step.step, op});
  }
  std::stable_sort(out.begin(), out.end(), [](const WhatifWorkerOp& a, const WhatifWorkerOp& b) {
    return a.op.start_us < b.op.start_us;
  });
  return out;
}

}  // namespace rankwatch
