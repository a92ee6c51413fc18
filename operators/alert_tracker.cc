#include "operators/alert_tracker.h"

#include <algorithm>
#include <set>

namespace rankwatch {
namespace {

struct Candidate {
  AlertKind kind;
  std::string subject;
  Severity severity;
  StragglerCause cause = StragglerCause::kNone;
};

std::vector<Candidate> CandidatesOf(const JobSnapshot& s) {
  std::vector<Candidate> out;
  const StepDiagnosis& d = s.step;
  // A pipeline job's what-if verdict replaces the flat straggler verdict: the ranks of a long
  // stage are not stragglers, and a moving slow replica is not noise.
  const whatif::WhatIfVerdict* w =
      s.whatif != nullptr && s.whatif->verdict.verdict != whatif::Verdict::kNone
          ? &s.whatif->verdict
          : nullptr;
  if (w != nullptr && w->verdict != whatif::Verdict::kBalanced &&
      !(w->verdict == whatif::Verdict::kUnattributed && w->severity == Severity::kInfo)) {
    std::string subject = "job";
    if ((w->verdict == whatif::Verdict::kSlowWorker || w->verdict == whatif::Verdict::kGcPauses) &&
        !w->ranks.empty()) {
      subject = "rank:" + std::to_string(w->ranks.front());
    } else if (w->verdict == whatif::Verdict::kStageImbalance) {
      subject = "stage:" + std::to_string(w->stage);
    }
    out.push_back({AlertKind::kStraggler, subject, w->severity});
  }
  switch (d.label) {
    case StepLabel::kStraggler:
    case StepLabel::kInputStraggler:
    case StepLabel::kComputeStraggler: {
      if (w != nullptr) break;
      const StragglerCause cause = d.cause;
      std::string subject = "job";
      if (d.scope == CulpritScope::kNode) {
        subject = "node:" + d.culprit_node;
      } else if (!d.culprit_ranks.empty()) {
        subject = "rank:" + std::to_string(d.culprit_ranks.front());
      }
      out.push_back({AlertKind::kStraggler, subject, d.severity, cause});
      break;
    }
    case StepLabel::kHang: out.push_back({AlertKind::kHang, "job", d.severity}); break;
    case StepLabel::kInputBound: out.push_back({AlertKind::kInputBound, "job", d.severity}); break;
    case StepLabel::kWaitHeavy: out.push_back({AlertKind::kWaitHeavy, "job", d.severity}); break;
    default: break;
  }
  const MemoryDiagnosis& m = s.memory;
  const MemoryKindEvidence& e = m.kinds[static_cast<int>(m.kind)];
  switch (m.label) {
    case MemoryLabel::kCreep:
    case MemoryLabel::kCreepEarly:
      out.push_back(
          {AlertKind::kMemoryCreep,
           m.creep_scope == CreepScope::kRank ? "rank:" + std::to_string(m.creep_rank) : "job",
           m.severity});
      break;
    case MemoryLabel::kHighPressure:
      out.push_back(
          {AlertKind::kMemoryPressure, "rank:" + std::to_string(e.worst_rank), m.severity});
      break;
    case MemoryLabel::kImbalance:
      out.push_back(
          {AlertKind::kMemoryImbalance, "rank:" + std::to_string(e.worst_rank), m.severity});
      break;
    default: break;
  }
  return out;
}

}  // namespace

std::string_view AlertKindName(AlertKind kind) {
  switch (kind) {
    case AlertKind::kStraggler: return "straggler";
    case AlertKind::kHang: return "hang";
    case AlertKind::kMemoryCreep: return "memory_creep";
    case AlertKind::kMemoryPressure: return "memory_pressure";
    case AlertKind::kMemoryImbalance: return "memory_imbalance";
    case AlertKind::kInputBound: return "input_bound";
    case AlertKind::kWaitHeavy: return "wait_heavy";
  }
  return "unknown";
}

std::string_view AlertStateName(AlertState state) {
  switch (state) {
    case AlertState::kPending: return "pending";
    case AlertState::kFiring: return "firing";
    case AlertState::kResolved: return "resolved";
  }
  return "unknown";
}

AlertEvent AlertTracker::Emit(Active& a, AlertState state, int64_t at) {
  a.last.state = state;
  if (state == AlertState::kFiring) a.last.fired = true;
  a.last.sequence = next_sequence_++;
  a.last.at_unix_ns = at;
  return a.last;
}

std::vector<AlertEvent> AlertTracker::Evaluate(std::shared_ptr<const JobSnapshot> snapshot,
                                               int64_t now) {
  std::vector<AlertEvent> events;
  const std::string& job = snapshot->training_job;
  if (auto r = replayed_before_.find(job); r != replayed_before_.end()) {
    // Silent re-evaluations of the restored window too: a restarted daemon may wait seconds
    // for its partitions before the replay starts.
    if (snapshot->window_steps > 0 && snapshot->window_last_step < r->second) return events;
    replayed_before_.erase(r);
  }
  if (snapshot->window_steps > 0) evaluated_through_[job] = snapshot->window_last_step;
  std::set<std::string> seen;
  for (const Candidate& c : CandidatesOf(*snapshot)) {
    const std::string rest = std::string(AlertKindName(c.kind)) + "|" + c.subject;
    const std::string id = job + "|" + rest;
    seen.insert(rest);
    auto [it, inserted] = active_.try_emplace({job, rest});
    Active& a = it->second;
    a.clean = 0;
    ++a.consecutive;
    a.last.severity = c.severity;
    a.last.cause = c.cause;
    a.last.evidence = snapshot;
    if (inserted) {
      a.last.id = id;
      a.last.training_job = job;
      a.last.kind = c.kind;
      a.last.subject = c.subject;
      events.push_back(Emit(a, AlertState::kPending, now));
    }
    if (a.last.state == AlertState::kPending && a.consecutive >= options_.fire_after) {
      events.push_back(Emit(a, AlertState::kFiring, now));
    }
  }
  // This job's alerts whose condition is absent: a pending one is dropped at once (resolved),
  // a firing one resolves after `resolve_after` clean evaluations.
  for (auto it = active_.lower_bound({job, ""}); it != active_.end() && it->first.first == job;) {
    Active& a = it->second;
    if (seen.count(it->first.second)) {
      ++it;
      continue;
    }
    a.consecutive = 0;
    ++a.clean;
    if (a.last.state == AlertState::kPending || a.clean >= options_.resolve_after) {
      a.last.evidence = snapshot;
      events.push_back(Emit(a, AlertState::kResolved, now));
      it = active_.erase(it);
    } else {
      ++it;
    }
  }
  return events;
}

std::vector<AlertEvent> AlertTracker::ForgetJob(const std::string& job, int64_t now) {
  std::vector<AlertEvent> events;
  for (auto it = active_.lower_bound({job, ""}); it != active_.end() && it->first.first == job;) {
    events.push_back(Emit(it->second, AlertState::kResolved, now));
    it = active_.erase(it);
  }
  evaluated_through_.erase(job);
  replayed_before_.erase(job);
  return events;
}

state::v1::AlertTrackerState AlertTracker::ExportJob(const std::string& job) const {
  state::v1::AlertTrackerState out;
  out.set_training_job(job);
  if (auto e = evaluated_through_.find(job); e != evaluated_through_.end()) {
    out.set_evaluated_through_step(e->second);
  }
  for (auto it = active_.lower_bound({job, ""}); it != active_.end() && it->first.first == job;
       ++it) {
    const Active& a = it->second;
    state::v1::ActiveAlert* x = out.add_alerts();
    x->set_id(a.last.id);
    x->set_kind(static_cast<uint32_t>(a.last.kind));
    x->set_subject(a.last.subject);
    x->set_state(static_cast<uint32_t>(a.last.state));
    x->set_severity(static_cast<uint32_t>(a.last.severity));
    x->set_cause(static_cast<uint32_t>(a.last.cause));
    x->set_at_unix_ns(a.last.at_unix_ns);
    x->set_consecutive(a.consecutive);
    x->set_clean(a.clean);
    x->set_fired(a.last.fired);
  }
  return out;
}

void AlertTracker::RestoreJob(const state::v1::AlertTrackerState& state) {
  const std::string& job = state.training_job();
  DropJob(job);
  if (state.evaluated_through_step() > 0) {
    evaluated_through_[job] = state.evaluated_through_step();
    replayed_before_[job] = state.evaluated_through_step();
  }
  for (const state::v1::ActiveAlert& x : state.alerts()) {
    if (x.kind() > static_cast<uint32_t>(AlertKind::kWaitHeavy) ||
        x.state() > static_cast<uint32_t>(AlertState::kResolved)) {
      continue;  // written by a newer build: forget it rather than guess
    }
    Active& a = active_[{job, x.id().substr(std::min(x.id().size(), job.size() + 1))}];
    a.last.id = x.id();
    a.last.training_job = job;
    a.last.kind = static_cast<AlertKind>(x.kind());
    a.last.subject = x.subject();
    a.last.state = static_cast<AlertState>(x.state());
    a.last.severity = static_cast<Severity>(x.severity());
    a.last.cause = static_cast<StragglerCause>(x.cause());
    a.last.at_unix_ns = x.at_unix_ns();
    a.last.fired = x.fired();
    a.consecutive = x.consecutive();
    a.clean = x.clean();
  }
}

void AlertTracker::DropJob(const std::string& job) {
  active_.erase(active_.lower_bound({job, ""}), active_.lower_bound({job + '\0', ""}));
  evaluated_through_.erase(job);
  replayed_before_.erase(job);
}

std::map<AlertKind, int> AlertTracker::Firing(const std::string& job) const {
  std::map<AlertKind, int> out;
  for (auto it = active_.lower_bound({job, ""}); it != active_.end() && it->first.first == job;
       ++it) {
    if (it->second.last.state == AlertState::kFiring) ++out[it->second.last.kind];
  }
  return out;
}

}  // namespace rankwatch
