#include "serving/timeline.h"

#include <algorithm>
#include <cctype>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <map>
#include <set>

#include "common/json_string.h"
#include "operators/step_codec.h"
#include "serving/diagnosis_proto.h"
#include "state/job_state_store.h"

namespace rankwatch {
namespace {

// The alerts a timeline lists at most (the newest are kept).
constexpr size_t kMaxTimelineAlerts = 10'000;

// Phases laid end to end inside a step slice, in this order; the wait comes after them.
constexpr Phase kLaidOut[] = {Phase::kDataloader, Phase::kForward, Phase::kBackward,
                              Phase::kForwardBackward, Phase::kOptimizer};

std::string PhaseLabel(v1::Phase p) {
  std::string name = v1::Phase_Name(p);
  if (name.rfind("PHASE_", 0) == 0) name = name.substr(6);
  for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return name;
}

std::string EnumLabel(const std::string& name, std::string_view prefix) {
  std::string out = name.rfind(prefix, 0) == 0 ? name.substr(prefix.size()) : name;
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string Millis(int64_t ns) {
  char buf[40];
  std::snprintf(buf, sizeof(buf), "%.6f", static_cast<double>(ns) * 1e-6);
  return buf;
}

// Microseconds with nanosecond precision, as the trace format's "ts" and "dur".
std::string Micros(int64_t ns) {
  char buf[40];
  std::snprintf(buf, sizeof(buf), "%lld.%03lld", static_cast<long long>(ns / 1000),
                static_cast<long long>(std::llabs(ns % 1000)));
  if (ns < 0 && ns > -1000) return std::string("-") + buf;
  return buf;
}

}  // namespace

absl::StatusOr<v1::Timeline> BuildTimeline(const JobSnapshot& snapshot,
                                           const v1::GetTimelineRequest& request,
                                           const StateStore& store, const AlertHub* alerts,
                                           const CaptureStore* captures) {
  uint64_t first = request.has_first_step() ? request.first_step() : 0;
  uint64_t last =
      request.has_last_step() ? request.last_step() : std::numeric_limits<uint64_t>::max();
  // No range: the newest stored steps, as many as the step window holds (the store is up to
  // one checkpoint interval behind the live window).
  const bool window = !request.has_first_step() && !request.has_last_step();
  if (first > last) {
    return absl::InvalidArgumentError("steps " + std::to_string(first) + "-" +
                                      std::to_string(last) + ": the first step is after the last");
  }
  uint32_t max_rank_steps = request.max_rank_steps();
  if (max_rank_steps == 0) max_rank_steps = kDefaultTimelineRankSteps;
  if (max_rank_steps > kMaxTimelineRankSteps) {
    return absl::InvalidArgumentError("max_rank_steps " + std::to_string(max_rank_steps) +
                                      " is more than " + std::to_string(kMaxTimelineRankSteps));
  }
  auto stored = job_state::ReadSteps(store, snapshot.training_job, first, last);
  if (!stored.ok()) return stored.status();

  v1::Timeline out;
  out.set_training_job(snapshot.training_job);
  out.set_world_size(snapshot.world_size);
  out.set_stored_first_step(stored->stored_first);
  out.set_stored_last_step(stored->stored_last);
  for (uint32_t r = 0; r < snapshot.world_size; ++r) out.add_rank_nodes(snapshot.NodeOf(r));
  for (uint32_t r : snapshot.step.culprit_ranks) out.add_culprit_ranks(r);

  if (window && snapshot.window_steps > 0 && stored->steps.size() > snapshot.window_steps) {
    stored->steps.erase(stored->steps.begin(),
                        stored->steps.end() - static_cast<std::ptrdiff_t>(snapshot.window_steps));
  }
  // The newest steps that fit.
  size_t begin = stored->steps.size();
  uint64_t rank_steps = 0;
  while (begin > 0) {
    const uint64_t n = static_cast<uint64_t>(stored->steps[begin - 1].ranks_size());
    if (rank_steps + n > max_rank_steps) break;
    rank_steps += n;
    --begin;
  }
  out.set_truncated(begin > 0);

  int64_t span_start = std::numeric_limits<int64_t>::max();
  int64_t span_end = std::numeric_limits<int64_t>::min();
  for (size_t i = begin; i < stored->steps.size(); ++i) {
    AlignedStep step;
    if (absl::Status s = DecodeStep(stored->steps[i], &step); !s.ok()) {
      return absl::DataLossError("stored step " + std::to_string(stored->steps[i].step()) +
                                 " of job '" + snapshot.training_job +
                                 "': " + std::string(s.message()));
    }
    std::sort(step.samples.begin(), step.samples.end(),
              [](const StepSample& a, const StepSample& b) { return a.rank < b.rank; });
    v1::TimelineStep* ts = out.add_steps();
    ts->set_step(step.step);
    ts->set_timed_out(step.timed_out);
    for (const StepSample& sample : step.samples) {
      v1::TimelineRankStep* rs = ts->add_ranks();
      rs->set_rank(sample.rank);
      rs->set_end_unix_ns(sample.end_unix_ns);
      for (int p = 0; p < kPhaseCount; ++p) {
        const Phase phase = static_cast<Phase>(p);
        if (!sample.Has(phase)) continue;
        v1::TimelinePhase* tp = rs->add_phases();
        tp->set_phase(ToProto(phase));
        tp->set_ns(sample.Get(phase));
      }
      if (sample.end_unix_ns > 0) {
        span_end = std::max(span_end, sample.end_unix_ns);
        span_start =
            std::min(span_start, sample.end_unix_ns -
                                     (sample.Has(Phase::kStep) ? sample.Get(Phase::kStep) : 0));
      }
    }
  }
  if (span_start > span_end) return out;  // no step in the range: nothing happened in it

  const uint64_t first_shown = out.steps(0).step();
  const uint64_t last_shown = out.steps(out.steps_size() - 1).step();
  if (alerts != nullptr) {
    // The alert events raised at the steps shown, and the alerts firing since before them
    // (their last event before the first step shown fired them). An alert's step is the
    // newest step of the evaluation that raised it; without one, its time places it. Without
    // an upper bound, alerts raised after the newest stored step are listed too: the store is
    // up to one checkpoint behind the live window, and an alert that just fired is the one a
    // reader came for.
    const bool open_ended = !request.has_last_step();
    AlertFilter filter;
    filter.training_job = snapshot.training_job;
    std::map<std::string, v1::TimelineAlert> before;
    std::vector<v1::TimelineAlert> within;
    alerts->Backlog(
        0, alerts->last_sequence() + 1, filter, [&](std::shared_ptr<const v1::Alert> a) {
          const uint64_t step = a->has_evidence() ? a->evidence().step().window().last_step() : 0;
          const bool after = step > 0 ? step > last_shown : a->at_unix_ns() > span_end;
          const bool earlier = step > 0 ? step < first_shown : a->at_unix_ns() < span_start;
          if (after && !open_ended) return;
          v1::TimelineAlert ta;
          *ta.mutable_alert() = *a;
          ta.mutable_alert()->clear_evidence();  // the diagnosis is GetDiagnosis's
          ta.set_step(step);
          if (earlier) {
            before[a->id()] = std::move(ta);
          } else {
            within.push_back(std::move(ta));
          }
        });
    std::vector<v1::TimelineAlert> found;
    for (auto& [id, a] : before) {
      if (a.alert().state() == v1::ALERT_FIRING) found.push_back(std::move(a));
    }
    std::sort(found.begin(), found.end(),
              [](const v1::TimelineAlert& a, const v1::TimelineAlert& b) {
                return a.alert().sequence() < b.alert().sequence();
              });
    for (v1::TimelineAlert& a : within) found.push_back(std::move(a));
    const size_t skip = found.size() > kMaxTimelineAlerts ? found.size() - kMaxTimelineAlerts : 0;
    for (size_t i = skip; i < found.size(); ++i) *out.add_alerts() = std::move(found[i]);
  }
  if (captures != nullptr) {
    // Every capture of the job the daemon keeps (a few): where they fall against the steps
    // shown is for the reader to see.
    for (v1::Capture& c : captures->List(snapshot.training_job)) *out.add_captures() = std::move(c);
  }
  return out;
}

namespace {

// The trace's tracks: a thread per rank shown, in a process per node (by name, the unknown node
// last) or in one process for the job.
struct TraceTracks {
  const v1::Timeline& t;
  TimelineGrouping grouping;
  std::set<uint32_t> ranks;                // every rank with a step shown
  std::map<std::string, int> pid_of_node;  // "" : the unknown node, or the job's process

  std::string NodeOf(uint32_t rank) const {
    return rank < static_cast<uint32_t>(t.rank_nodes_size()) ? t.rank_nodes(rank) : "";
  }
  // The process of a rank shown.
  int PidOf(uint32_t rank) const {
    return grouping == TimelineGrouping::kNode ? pid_of_node.at(NodeOf(rank)) : 1;
  }
  // "pid": P, "tid": rank.
  std::string Ids(uint32_t rank) const {
    return "\"pid\": " + std::to_string(PidOf(rank)) + ", \"tid\": " + std::to_string(rank);
  }
};

// The trace's text: the opening, then events one after another.
struct TraceText {
  std::string out;
  bool first_event = true;

  void Event(const std::string& body) {
    if (!first_event) out += ",\n";
    first_event = false;
    out += "  {" + body + "}";
  }
};

// Where each rank's step began and ended, where each step ended (its last rank), and where the
// first step shown began; the collectors' clock.
struct StepBounds {
  std::map<std::pair<uint64_t, uint32_t>, std::pair<int64_t, int64_t>> of_rank;  // start, end
  std::map<uint64_t, int64_t> step_end;
  int64_t first_start = std::numeric_limits<int64_t>::max();
  uint64_t first_shown = 0;  // the first step shown (0: none)
};

TraceTracks LayOutTracks(const v1::Timeline& t, TimelineGrouping grouping) {
  TraceTracks tracks{t, grouping, {}, {}};
  for (const v1::TimelineStep& s : t.steps()) {
    for (const v1::TimelineRankStep& r : s.ranks()) tracks.ranks.insert(r.rank());
  }
  if (grouping == TimelineGrouping::kNode) {
    std::set<std::string> nodes;
    bool unknown = false;
    for (uint32_t r : tracks.ranks) {
      const std::string n = tracks.NodeOf(r);
      if (n.empty()) {
        unknown = true;
      } else {
        nodes.insert(n);
      }
    }
    int pid = 1;
    for (const std::string& n : nodes) tracks.pid_of_node[n] = pid++;
    if (unknown) tracks.pid_of_node[""] = pid;
  } else {
    tracks.pid_of_node[""] = 1;
  }
  return tracks;
}

// The opening: the display unit, and what the trace shows (otherData).
void WriteHeader(const v1::Timeline& t, TimelineGrouping grouping, TraceText* text) {
  std::string& out = text->out;
  out += "{\"displayTimeUnit\": \"ms\",\n \"otherData\": {\"generator\": \"rankwatch timeline\", ";
  out += "\"training_job\": " + JsonString(t.training_job()) +
         ", \"world_size\": " + std::to_string(t.world_size());
  if (t.steps_size() > 0) {
    out += ", \"first_step\": " + std::to_string(t.steps(0).step()) +
           ", \"last_step\": " + std::to_string(t.steps(t.steps_size() - 1).step());
  }
  out += ", \"truncated\": ";
  out += t.truncated() ? "true" : "false";
  out += ", \"grouping\": ";
  out += grouping == TimelineGrouping::kNode ? "\"node\"" : "\"rank\"";
  out += "},\n \"traceEvents\": [\n";
}

// Names and order of the processes and of the ranks' threads; a culprit rank says so.
void WriteTrackNames(const TraceTracks& tracks, TraceText* text) {
  const v1::Timeline& t = tracks.t;
  for (const auto& [node, pid] : tracks.pid_of_node) {
    const std::string name = tracks.grouping == TimelineGrouping::kRank ? "job " + t.training_job()
                             : node.empty()                             ? "node unknown"
                                                                        : "node " + node;
    text->Event("\"ph\": \"M\", \"name\": \"process_name\", \"pid\": " + std::to_string(pid) +
                ", \"args\": {\"name\": " + JsonString(name) + "}");
    text->Event("\"ph\": \"M\", \"name\": \"process_sort_index\", \"pid\": " + std::to_string(pid) +
                ", \"args\": {\"sort_index\": " + std::to_string(pid) + "}");
  }
  const std::set<uint32_t> culprits(t.culprit_ranks().begin(), t.culprit_ranks().end());
  for (uint32_t r : tracks.ranks) {
    std::string name = "rank " + std::to_string(r);
    if (tracks.grouping == TimelineGrouping::kRank && !tracks.NodeOf(r).empty()) {
      name += " (" + tracks.NodeOf(r) + ")";
    }
    if (culprits.count(r)) name += " culprit";
    const std::string ids = tracks.Ids(r);
    text->Event("\"ph\": \"M\", \"name\": \"thread_name\", " + ids +
                ", \"args\": {\"name\": " + JsonString(name) + "}");
    text->Event("\"ph\": \"M\", \"name\": \"thread_sort_index\", " + ids +
                ", \"args\": {\"sort_index\": " + std::to_string(r) + "}");
  }
}

// One rank's step: its slice, its phases laid end to end inside it, and the wait after them.
void WriteRankStep(const v1::TimelineStep& s, const v1::TimelineRankStep& r,
                   const TraceTracks& tracks, TraceText* text) {
  std::map<v1::Phase, int64_t> ns;
  for (const v1::TimelinePhase& p : r.phases()) ns[p.phase()] = p.ns();
  int64_t laid = 0;
  for (Phase p : kLaidOut) {
    if (auto it = ns.find(ToProto(p)); it != ns.end()) laid += std::max<int64_t>(0, it->second);
  }
  const auto step_it = ns.find(v1::PHASE_STEP);
  const int64_t step_ns = step_it != ns.end() ? step_it->second : laid;
  const int64_t start = r.end_unix_ns() - step_ns;
  const std::string ids = tracks.Ids(r.rank());
  std::string args = "\"step\": " + std::to_string(s.step());
  if (auto c = ns.find(v1::PHASE_COLLECTIVE); c != ns.end()) {
    args += ", \"collective_ms\": " + Millis(c->second);
  }
  if (s.timed_out()) args += ", \"timed_out\": true";
  text->Event("\"name\": \"step " + std::to_string(s.step()) +
              "\", \"cat\": \"step\", \"ph\": \"X\", " + ids + ", \"ts\": " + Micros(start) +
              ", \"dur\": " + Micros(step_ns) + ", \"args\": {" + args + "}");
  int64_t at = start;
  const int64_t end = r.end_unix_ns();
  for (Phase p : kLaidOut) {
    auto it = ns.find(ToProto(p));
    if (it == ns.end() || it->second <= 0 || at >= end) continue;
    const int64_t dur = std::min(it->second, end - at);
    text->Event("\"name\": " + JsonString(PhaseLabel(ToProto(p))) + ", \"cat\": \"phase\", " +
                "\"ph\": \"X\", " + ids + ", \"ts\": " + Micros(at) + ", \"dur\": " + Micros(dur) +
                ", \"args\": {\"step\": " + std::to_string(s.step()) + "}");
    at += dur;
  }
  if (end > at && step_it != ns.end()) {
    text->Event("\"name\": \"wait\", \"cat\": \"phase\", \"ph\": \"X\", " + ids +
                ", \"ts\": " + Micros(at) + ", \"dur\": " + Micros(end - at) +
                ", \"args\": {\"step\": " + std::to_string(s.step()) + "}");
  }
}

StepBounds FindStepBounds(const v1::Timeline& t) {
  StepBounds b;
  for (const v1::TimelineStep& s : t.steps()) {
    for (const v1::TimelineRankStep& r : s.ranks()) {
      int64_t step_ns = 0;
      for (const v1::TimelinePhase& p : r.phases()) {
        if (p.phase() == v1::PHASE_STEP) step_ns = p.ns();
      }
      if (r.end_unix_ns() <= 0) continue;
      b.of_rank[{s.step(), r.rank()}] = {r.end_unix_ns() - step_ns, r.end_unix_ns()};
      b.step_end[s.step()] = std::max(b.step_end[s.step()], r.end_unix_ns());
      b.first_start = std::min(b.first_start, r.end_unix_ns() - step_ns);
    }
  }
  b.first_shown = t.steps_size() > 0 ? t.steps(0).step() : 0;
  return b;
}

// Alerts: on the culprit rank's track, the node's process, or the whole trace; at the end of
// the step they were raised at (the collectors' clock, like the steps), or at the first step's
// start when they fired before it; by their time when their step is not known.
void WriteAlertMarks(const TraceTracks& tracks, const StepBounds& bounds, TraceText* text) {
  for (const v1::TimelineAlert& ta : tracks.t.alerts()) {
    const v1::Alert& a = ta.alert();
    std::string name = EnumLabel(v1::AlertKind_Name(a.kind()), "ALERT_") + " " +
                       EnumLabel(v1::AlertState_Name(a.state()), "ALERT_") + ": " + a.subject();
    int64_t rank = -1;
    if (a.subject().rfind("rank:", 0) == 0) {
      rank = static_cast<int64_t>(std::strtoul(a.subject().c_str() + 5, nullptr, 10));
    }
    int64_t at = a.at_unix_ns();
    const bool shown_step = ta.step() > 0 && bounds.step_end.count(ta.step());
    if (ta.step() > 0 && ta.step() < bounds.first_shown) {
      at = bounds.first_start;
      name += " (since before the first step shown)";
    } else if (shown_step) {
      auto b = bounds.of_rank.find({ta.step(), static_cast<uint32_t>(std::max<int64_t>(rank, 0))});
      at =
          rank >= 0 && b != bounds.of_rank.end() ? b->second.second : bounds.step_end.at(ta.step());
    } else if (at < bounds.first_start &&
               bounds.first_start != std::numeric_limits<int64_t>::max()) {
      at = bounds.first_start;
      name += " (since before the first step shown)";
    }
    std::string where = "\"s\": \"g\", \"pid\": 1, \"tid\": 0";
    if (rank >= 0 && tracks.ranks.count(static_cast<uint32_t>(rank))) {
      where = "\"s\": \"t\", " + tracks.Ids(static_cast<uint32_t>(rank));
    } else if (a.subject().rfind("node:", 0) == 0 && tracks.grouping == TimelineGrouping::kNode) {
      if (auto it = tracks.pid_of_node.find(a.subject().substr(5));
          it != tracks.pid_of_node.end()) {
        where = "\"s\": \"p\", \"pid\": " + std::to_string(it->second) + ", \"tid\": 0";
      }
    }
    text->Event("\"name\": " + JsonString(name) + ", \"cat\": \"alert\", \"ph\": \"i\", " + where +
                ", \"ts\": " + Micros(at) + ", \"args\": {\"id\": " + JsonString(a.id()) +
                ", \"step\": " + std::to_string(ta.step()) +
                ", \"at_unix_ns\": " + std::to_string(a.at_unix_ns()) + ", \"severity\": " +
                JsonString(EnumLabel(v1::Severity_Name(a.severity()), "SEVERITY_")) +
                ", \"sequence\": " + std::to_string(a.sequence()) + "}");
  }
}

// Captures: on each captured rank's track, at the start of the first step it profiled when
// that step is shown, else when the capture was asked for (the daemon's clock).
void WriteCaptureMarks(const TraceTracks& tracks, const StepBounds& bounds, TraceText* text) {
  for (const v1::Capture& c : tracks.t.captures()) {
    for (const v1::CaptureRank& cr : c.ranks()) {
      if (!tracks.ranks.count(cr.rank())) continue;
      std::string name = "capture " + c.id();
      if (!cr.role().empty()) name += " (" + cr.role() + ")";
      int64_t at = c.requested_unix_ns();
      if (cr.first_step() >= 0) {
        auto b = bounds.of_rank.find({static_cast<uint64_t>(cr.first_step()), cr.rank()});
        if (b != bounds.of_rank.end()) at = b->second.first;
      }
      text->Event("\"name\": " + JsonString(name) +
                  ", \"cat\": \"capture\", \"ph\": \"i\", \"s\": \"t\", " + tracks.Ids(cr.rank()) +
                  ", \"ts\": " + Micros(at) + ", \"args\": {\"id\": " + JsonString(c.id()) +
                  ", \"first_step\": " + std::to_string(cr.first_step()) + ", \"state\": " +
                  JsonString(EnumLabel(v1::CaptureState_Name(c.state()), "CAPTURE_")) +
                  ", \"requested_by\": " + JsonString(c.requested_by()) + "}");
    }
  }
}

}  // namespace

std::string TimelineChromeTrace(const v1::Timeline& t, TimelineGrouping grouping) {
  const TraceTracks tracks = LayOutTracks(t, grouping);
  TraceText text;
  text.out.reserve(256 + static_cast<size_t>(t.steps_size()) * tracks.ranks.size() * 400);
  WriteHeader(t, grouping, &text);
  WriteTrackNames(tracks, &text);
  for (const v1::TimelineStep& s : t.steps()) {
    for (const v1::TimelineRankStep& r : s.ranks()) WriteRankStep(s, r, tracks, &text);
  }
  const StepBounds bounds = FindStepBounds(t);
  WriteAlertMarks(tracks, bounds, &text);
  WriteCaptureMarks(tracks, bounds, &text);
  text.out += "\n ]}\n";
  return std::move(text.out);
}

}  // namespace rankwatch
