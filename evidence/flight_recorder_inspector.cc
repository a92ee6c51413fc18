#include "evidence/flight_recorder_inspector.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <utility>

#include "common/wall_clock.h"
#include "flight_recorder/fr_proto.h"
#include "operators/step_time_diagnosis.h"

namespace rankwatch {
namespace {

// Steps every rank completed: steps aligned at their timeout with ranks missing are not.
uint64_t CompleteSteps(const JobSnapshot& s) {
  return s.aligned_steps - std::min(s.aligned_steps, s.timed_out_steps);
}

}  // namespace

FlightRecorderInspector::FlightRecorderInspector(FlightRecorderInspectorOptions options,
                                                 Sender send)
    : options_(std::move(options)),
      send_(std::move(send)),
      requests_("frd", options_.answer_deadline) {}

size_t FlightRecorderInspector::KeptBytes(const v1::FlightRecorderDump& d) {
  size_t lists = 0;  // the groups' rank lists as the wire packs them (varints)
  for (const v1::FlightRecorderGroup& g : d.groups())
    for (uint32_t r : g.ranks())
      lists += r < (1u << 7) ? 1 : r < (1u << 14) ? 2 : r < (1u << 21) ? 3 : r < (1u << 28) ? 4 : 5;
  const size_t wire = d.ByteSizeLong();
  return wire > lists ? wire - lists : 0;
}

void FlightRecorderInspector::OnBatch(const v1::Batch& batch) {
  if (batch.flight_recorder_dumps_size() == 0) return;
  const std::string& name = batch.source().training_job();
  const int64_t now = WallNowUnixNs();
  std::lock_guard<std::mutex> lock(mu_);
  for (const v1::FlightRecorderDump& d : batch.flight_recorder_dumps()) {
    const size_t bytes = KeptBytes(d);
    auto it = jobs_.find(name);
    const size_t replaced = it != jobs_.end() && it->second.dumps.count(d.rank()) > 0
                                ? it->second.dumps[d.rank()].bytes
                                : 0;
    if ((it == jobs_.end() && jobs_.size() >= options_.max_jobs && !MakeRoom(name, 0)) ||
        !MakeRoom(name, bytes > replaced ? bytes - replaced : 0)) {
      ++counters_.dumps_dropped;
      spdlog::warn(
          "training job '{}': the Flight Recorder dump of rank {} ({} bytes) is dropped: "
          "dumps of more than {} jobs or {} bytes are not kept",
          name, d.rank(), bytes, options_.max_jobs, options_.max_bytes);
      continue;
    }
    Job& job = jobs_[name];
    Kept& kept = job.dumps[d.rank()];
    job.bytes -= kept.bytes;
    bytes_ -= kept.bytes;
    if (!job.lists) job.lists = std::make_unique<fr::FrRanksInterner>();
    kept.dump = fr::RankDumpFromProto(d, job.lists.get());
    kept.node = d.node();
    kept.bytes = bytes;
    job.bytes += bytes;
    bytes_ += bytes;
    job.batch_world_size = std::max(job.batch_world_size, batch.source().world_size());
    job.last_dump_unix_ns = now;
    job.pending = true;
    job.steps_known = false;
    ++counters_.dumps;
  }
}

bool FlightRecorderInspector::MakeRoom(const std::string& job, size_t bytes) {
  while (bytes_ + bytes > options_.max_bytes || jobs_.size() > options_.max_jobs ||
         (jobs_.count(job) == 0 && jobs_.size() >= options_.max_jobs)) {
    auto oldest = jobs_.end();
    for (auto i = jobs_.begin(); i != jobs_.end(); ++i) {
      if (i->first == job) continue;
      if (oldest == jobs_.end() || i->second.last_dump_unix_ns < oldest->second.last_dump_unix_ns) {
        oldest = i;
      }
    }
    if (oldest == jobs_.end()) return bytes_ + bytes <= options_.max_bytes;
    spdlog::info("training job '{}': its Flight Recorder dumps are dropped to make room",
                 oldest->first);
    Drop(oldest);
  }
  return true;
}

void FlightRecorderInspector::Drop(std::map<std::string, Job>::iterator it) {
  bytes_ -= it->second.bytes;
  hang_alerts_.Forget(it->first);
  jobs_.erase(it);
}

void FlightRecorderInspector::Request(
    const std::vector<std::shared_ptr<const JobSnapshot>>& snapshots, int64_t now_unix_ns) {
  if (!send_) return;
  std::vector<std::pair<std::string, v1::ControlRequest>> to_send;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& s : snapshots) {
      const bool hung = s->step.label == StepLabel::kHang && !s->finished && s->world_size > 0;
      if (!hung) continue;
      const uint64_t complete = CompleteSteps(*s);
      auto it = jobs_.find(s->training_job);
      if (it != jobs_.end() && it->second.asked_at_steps == complete) continue;  // this hang's
      if (it == jobs_.end() && !MakeRoom(s->training_job, 0)) continue;
      Job& job = jobs_[s->training_job];
      job.asked_at_steps = complete;
      v1::ControlRequest request =
          requests_.OpenToEveryRank(s->training_job, s->world_size, now_unix_ns);
      requests_.Close(request.id());  // the answers are the dumps themselves
      request.set_requested_by(
          "hang diagnosis (no step aligned for " +
          std::to_string(static_cast<int64_t>(s->step.seconds_since_last_aligned)) + " s)");
      request.mutable_flight_recorder();
      to_send.emplace_back(s->training_job, std::move(request));
    }
  }
  for (auto& [job, request] : to_send) {
    const absl::Status sent = send_(job, request.SerializeAsString());
    std::lock_guard<std::mutex> lock(mu_);
    if (sent.ok()) {
      ++counters_.requests;
      spdlog::info(
          "training job '{}' is hung: asked its ranks for their Flight Recorder dumps "
          "({})",
          job, request.id());
    } else {
      ++counters_.send_failures;
      spdlog::warn("training job '{}' is hung: the Flight Recorder request could not be sent: {}",
                   job, std::string(sent.message()));
    }
  }
}

void FlightRecorderInspector::Analyze(const TickView& tick) {
  struct Due {
    std::string job;
    std::vector<fr::RankDump> dumps;
    std::vector<std::string> nodes;
    uint32_t world_size = 0;
    int64_t last_dump_unix_ns = 0;
  };
  std::vector<Due> due;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = jobs_.begin(); it != jobs_.end();) {
      Job& job = it->second;
      const auto snapshot = tick.latest->find(it->first);
      const JobSnapshot* s = snapshot == tick.latest->end() ? nullptr : snapshot->second.get();
      if (s != nullptr && !job.dumps.empty()) {
        // Progress after the newest dump: the hang it describes is over.
        const uint64_t complete = CompleteSteps(*s);
        if (!job.steps_known) {
          job.complete_steps = complete;
          job.steps_known = true;
        } else if (complete > job.complete_steps) {
          spdlog::info(
              "training job '{}' made progress: its Flight Recorder dumps and verdict "
              "are dropped",
              it->first);
          bytes_ -= job.bytes;
          job.bytes = 0;
          job.dumps.clear();
          job.lists.reset();
          job.verdict.reset();
          job.pending = false;
          job.republish = false;
        }
      }
      const uint32_t world_size =
          s != nullptr && s->world_size > 0 ? s->world_size : job.batch_world_size;
      const bool all_came = world_size > 0 && job.dumps.size() >= world_size;
      const bool settled =
          tick.now_unix_ns - job.last_dump_unix_ns >=
          std::chrono::duration_cast<std::chrono::nanoseconds>(options_.settle).count();
      if (job.pending && !job.dumps.empty() && (all_came || settled)) {
        job.pending = false;
        Due& d = due.emplace_back();
        d.job = it->first;
        d.world_size = world_size;
        d.last_dump_unix_ns = job.last_dump_unix_ns;
        d.nodes.resize(world_size);
        for (const auto& [rank, kept] : job.dumps) {
          if (rank >= world_size) continue;  // of an older, larger world
          d.dumps.push_back(kept.dump);
          d.nodes[rank] = kept.node;
        }
      }
      ++it;
    }
  }
  for (Due& d : due) {
    fr::FrAnalysisOptions o;
    o.world_size = d.world_size;
    const fr::FrVerdict verdict = fr::AnalyzeFlightRecorder(d.dumps, o);
    v1::FlightRecorderVerdict out;
    fr::VerdictToProto(verdict, {}, &out, &d.nodes);
    out.set_analyzed_unix_ns(tick.now_unix_ns);
    out.set_last_dump_unix_ns(d.last_dump_unix_ns);
    out.set_dumps(static_cast<uint32_t>(d.dumps.size()));
    spdlog::info("training job '{}': Flight Recorder verdict from {} of {} ranks' dumps: {}", d.job,
                 d.dumps.size(), d.world_size, out.summary());
    std::lock_guard<std::mutex> lock(mu_);
    ++counters_.analyses;
    auto it = jobs_.find(d.job);
    if (it == jobs_.end()) continue;  // dropped meanwhile
    it->second.verdict = std::move(out);
    it->second.republish = true;
  }
}

void FlightRecorderInspector::OnTick(const TickView& tick, std::vector<v1::Alert>* alerts) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const std::string& job : *tick.removed) {
      if (auto it = jobs_.find(job); it != jobs_.end()) Drop(it);
      hang_alerts_.Forget(job);
    }
  }
  Request(*tick.evaluated, tick.now_unix_ns);
  Analyze(tick);
  std::lock_guard<std::mutex> lock(mu_);
  hang_alerts_.Attach(alerts, [this](const std::string& job, v1::Alert* a) {
    auto it = jobs_.find(job);
    if (it == jobs_.end() || !it->second.verdict) return false;
    *a->mutable_evidence()->mutable_flight_recorder() = *it->second.verdict;
    it->second.republish = false;
    return true;
  });
  // A verdict that came after the job's hang alert was raised: the alert again, with it.
  for (auto& [name, job] : jobs_) {
    if (!job.republish || !job.verdict) continue;
    job.republish = false;
    const auto verdict = [&job](const std::string&, v1::Alert* a) {
      *a->mutable_evidence()->mutable_flight_recorder() = *job.verdict;
      return true;
    };
    hang_alerts_.Republish(name, tick.now_unix_ns, verdict, alerts);
  }
}

std::optional<v1::FlightRecorderVerdict> FlightRecorderInspector::Get(
    const std::string& job) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = jobs_.find(job);
  if (it == jobs_.end()) return std::nullopt;
  return it->second.verdict;
}

FlightRecorderInspectorCounters FlightRecorderInspector::counters() const {
  std::lock_guard<std::mutex> lock(mu_);
  return counters_;
}

}  // namespace rankwatch
