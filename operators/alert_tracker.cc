#include "operators/alert_tracker.h"

#include <algorithm>
#include <charconv>
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

// The node an alert's subject names: "node:X", or the node of "rank:R" when the job knows it;
// "" for any other subject (the job, a pipeline stage).
std::string NodeOfSubject(const JobSnapshot& s, const std::string& subject) {
  if (subject.starts_with("node:")) return subject.substr(5);
  if (subject.starts_with("rank:")) {
    uint32_t rank = 0;
    const char* begin = subject.data() + 5;
    const char* end = subject.data() + subject.size();
    if (std::from_chars(begin, end, rank).ec != std::errc()) return "";
    return s.NodeOf(rank);
  }
  return "";
}

void AddRank(std::vector<uint32_t>* ranks, uint32_t rank) {
  auto at = std::lower_bound(ranks->begin(), ranks->end(), rank);
  if (at != ranks->end() && *at == rank) return;
  if (ranks->size() >= NodeCharge::kMaxRanks) return;
  ranks->insert(at, rank);
}

// The node the job's current straggler verdict names, and what it costs a step.
struct Named {
  std::string node;
  double lost_rank_seconds_per_step = 0;
  uint64_t since_step = 0;
};

Named NamedByDiagnosis(const JobSnapshot& s) {
  Named n;
  const whatif::WhatIfVerdict* w =
      s.whatif != nullptr && s.whatif->verdict.verdict != whatif::Verdict::kNone
          ? &s.whatif->verdict
          : nullptr;
  if (w != nullptr) {
    // A pipeline job's slow worker (or GC pauses) on a rank: its what-if loss over the steps
    // it analysed.
    if ((w->verdict == whatif::Verdict::kSlowWorker || w->verdict == whatif::Verdict::kGcPauses) &&
        !w->ranks.empty() && s.whatif->result.steps > 0) {
      n.node = s.NodeOf(w->ranks.front());
      n.lost_rank_seconds_per_step = w->lost_rank_seconds / s.whatif->result.steps;
    }
    return n;
  }
  const StepDiagnosis& d = s.step;
  if (d.label != StepLabel::kStraggler && d.label != StepLabel::kInputStraggler &&
      d.label != StepLabel::kComputeStraggler) {
    return n;
  }
  if (d.scope == CulpritScope::kNode) {
    n.node = d.culprit_node;
  } else if (!d.culprit_ranks.empty()) {
    n.node = s.NodeOf(d.culprit_ranks.front());
  }
  if (d.straggler.present) {
    n.lost_rank_seconds_per_step = d.straggler.lost_rank_seconds_per_step;
    n.since_step = d.straggler.since_step;
  }
  return n;
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
  ChargeNodes(*snapshot, seen, now);
  for (const AlertEvent& e : events) {
    if (e.kind != AlertKind::kStraggler || e.state != AlertState::kFiring) continue;
    const std::string node = NodeOfSubject(*snapshot, e.subject);
    if (node.empty()) continue;
    NodeCharge& c = charges_[{job, node}];
    c.training_job = job;
    c.node = node;
    ++c.episodes;
    if (c.first_unix_ns == 0) c.first_unix_ns = now;
    c.last_unix_ns = now;
    charges_changed_.insert({job, node});
  }
  return events;
}

void AlertTracker::ChargeNodes(const JobSnapshot& s, const std::set<std::string>& seen,
                               int64_t now) {
  const std::string& job = s.training_job;
  // The nodes the job's firing straggler alerts name; those whose condition held this time.
  std::map<std::string, bool> firing;
  for (auto it = active_.lower_bound({job, ""}); it != active_.end() && it->first.first == job;
       ++it) {
    const AlertEvent& a = it->second.last;
    if (a.kind != AlertKind::kStraggler || a.state != AlertState::kFiring) continue;
    const std::string node = NodeOfSubject(s, a.subject);
    if (node.empty()) continue;
    const bool held = seen.count(it->first.second) > 0;
    firing[node] = firing[node] || held;
    NodeCharge& c = charges_[{job, node}];
    c.training_job = job;
    c.node = node;
    uint32_t rank = 0;
    if (a.subject.starts_with("rank:") &&
        std::from_chars(a.subject.data() + 5, a.subject.data() + a.subject.size(), rank).ec ==
            std::errc()) {
      AddRank(&c.ranks, rank);
    } else if (s.step.culprit_node == node) {
      for (uint32_t r : s.step.culprit_ranks) AddRank(&c.ranks, r);
    }
  }
  const Named named = NamedByDiagnosis(s);
  for (auto it = charges_.lower_bound({job, ""}); it != charges_.end() && it->first.first == job;
       ++it) {
    NodeCharge& c = it->second;
    const auto f = firing.find(c.node);
    const bool now_firing = f != firing.end();
    bool changed = now_firing != c.firing;
    c.firing = now_firing;
    if (!s.scheduler.k8s_namespace.empty() && c.k8s_namespace != s.scheduler.k8s_namespace) {
      c.k8s_namespace = s.scheduler.k8s_namespace;
      changed = true;
    }
    // The window's steps since the last charged one and since the straggler's onset (so a
    // second episode is charged from its own onset, not for the steps between the episodes).
    if (s.window_steps > 0 && now_firing && f->second && named.node == c.node &&
        named.lost_rank_seconds_per_step > 0) {
      const uint64_t from =
          std::max({c.charged_through_step + 1, named.since_step, s.window_first_step});
      if (s.window_last_step >= from) {
        c.lost_rank_seconds +=
            named.lost_rank_seconds_per_step * static_cast<double>(s.window_last_step - from + 1);
        c.charged_through_step = s.window_last_step;
        changed = true;
      }
    }
    if (changed) {
      c.last_unix_ns = now;
      charges_changed_.insert(it->first);
    }
  }
}

std::vector<NodeCharge> AlertTracker::TakeNodeCharges() {
  std::vector<NodeCharge> out = std::move(forgotten_charges_);
  forgotten_charges_.clear();
  out.reserve(out.size() + charges_changed_.size());
  for (const auto& key : charges_changed_) {
    if (auto it = charges_.find(key); it != charges_.end()) out.push_back(it->second);
  }
  charges_changed_.clear();
  return out;
}

std::vector<NodeCharge> AlertTracker::NodeCharges(const std::string& job) const {
  std::vector<NodeCharge> out;
  for (auto it = charges_.lower_bound({job, ""}); it != charges_.end() && it->first.first == job;
       ++it) {
    out.push_back(it->second);
  }
  return out;
}

std::vector<AlertEvent> AlertTracker::ForgetJob(const std::string& job, int64_t now) {
  std::vector<AlertEvent> events;
  for (auto it = active_.lower_bound({job, ""}); it != active_.end() && it->first.first == job;) {
    events.push_back(Emit(it->second, AlertState::kResolved, now));
    it = active_.erase(it);
  }
  // The job's node charges end: those firing stop (the fleet view keeps them, and hears so).
  for (auto it = charges_.lower_bound({job, ""}); it != charges_.end() && it->first.first == job;
       ++it) {
    if (it->second.firing) {
      it->second.firing = false;
      it->second.last_unix_ns = now;
    } else if (charges_changed_.count(it->first) == 0) {
      continue;
    }
    forgotten_charges_.push_back(it->second);
  }
  EraseCharges(job);
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
  for (const NodeCharge& c : NodeCharges(job)) {
    state::v1::NodeCulpritState* x = out.add_node_culprits();
    x->set_node(c.node);
    x->set_episodes(c.episodes);
    x->set_lost_rank_seconds(c.lost_rank_seconds);
    x->set_first_unix_ns(c.first_unix_ns);
    x->set_last_unix_ns(c.last_unix_ns);
    for (uint32_t r : c.ranks) x->add_ranks(r);
    x->set_charged_through_step(c.charged_through_step);
    x->set_firing(c.firing);
    x->set_k8s_namespace(c.k8s_namespace);
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
  for (const state::v1::NodeCulpritState& x : state.node_culprits()) {
    if (x.node().empty()) continue;
    NodeCharge& c = charges_[{job, x.node()}];
    c.training_job = job;
    c.node = x.node();
    c.episodes = x.episodes();
    c.lost_rank_seconds = x.lost_rank_seconds();
    c.first_unix_ns = x.first_unix_ns();
    c.last_unix_ns = x.last_unix_ns();
    c.ranks.clear();
    for (uint32_t r : x.ranks()) AddRank(&c.ranks, r);
    c.charged_through_step = x.charged_through_step();
    c.firing = x.firing();
    c.k8s_namespace = x.k8s_namespace();
    // Published again: the fleet view may have missed its last change (a crash before it was
    // published); it keeps the newest of equal records.
    charges_changed_.insert({job, c.node});
  }
}

void AlertTracker::DropJob(const std::string& job) {
  active_.erase(active_.lower_bound({job, ""}), active_.lower_bound({job + '\0', ""}));
  evaluated_through_.erase(job);
  replayed_before_.erase(job);
  EraseCharges(job);
}

void AlertTracker::EraseCharges(const std::string& job) {
  charges_.erase(charges_.lower_bound({job, ""}), charges_.lower_bound({job + '\0', ""}));
  charges_changed_.erase(charges_changed_.lower_bound({job, ""}),
                         charges_changed_.lower_bound({job + '\0', ""}));
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
