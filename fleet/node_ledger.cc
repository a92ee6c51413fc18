#include "fleet/node_ledger.h"

#include <algorithm>
#include <charconv>
#include <cmath>

#include "fmt/format.h"
#include "rankwatch/state/v1/job_state.pb.h"
#include "spdlog/spdlog.h"

namespace rankwatch {
namespace {

constexpr std::string_view kNodeAlertIdPrefix = "fleet|node_culprit|node:";

std::string RecordKey(const std::string& node, const std::string& job) {
  std::string key(kNodeRecordKeyPrefix);
  key += node;
  key += '\0';
  key += job;
  return key;
}

std::string OutboxKey(const std::string& node, const std::string& job) {
  std::string key(kNodeOutboxKeyPrefix);
  key += node;
  key += '\0';
  key += job;
  return key;
}

v1::NodeJob ToNodeJob(const NodeCharge& c) {
  v1::NodeJob j;
  j.set_training_job(c.training_job);
  j.set_episodes(c.episodes);
  j.set_lost_rank_seconds(c.lost_rank_seconds);
  j.set_first_unix_ns(c.first_unix_ns);
  j.set_last_unix_ns(c.last_unix_ns);
  for (uint32_t r : c.ranks) j.add_ranks(r);
  j.set_namespace_(c.k8s_namespace);
  j.set_firing(c.firing);
  return j;
}

// Whether `a` is newer than `b`: the later charge; at the same time, the larger totals.
bool Newer(const v1::NodeJob& a, const v1::NodeJob& b) {
  if (a.last_unix_ns() != b.last_unix_ns()) return a.last_unix_ns() > b.last_unix_ns();
  if (a.episodes() != b.episodes()) return a.episodes() > b.episodes();
  return a.lost_rank_seconds() > b.lost_rank_seconds();
}

// "24 h", "7 d", "90 min": a window in words.
std::string Span(std::chrono::nanoseconds d) {
  const double s = std::chrono::duration<double>(d).count();
  if (s >= 2 * 86400 && std::fmod(s, 86400) == 0) return fmt::format("{:.0f} d", s / 86400);
  if (s >= 3600) return fmt::format("{:.0f} h", s / 3600);
  return fmt::format("{:.0f} min", s / 60);
}

}  // namespace

int32_t PartitionOfNode(const std::string& node, int32_t partitions) {
  if (partitions <= 0) return 0;
  uint64_t h = 14695981039346656037ull;
  for (unsigned char c : node) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return static_cast<int32_t>(h % static_cast<uint64_t>(partitions));
}

NodeLedger::NodeLedger(NodeLedgerOptions options) : options_(options) {}

void NodeLedger::Charge(const std::vector<NodeCharge>& charges) {
  std::lock_guard lock(mu_);
  for (const NodeCharge& c : charges) {
    if (c.node.empty() || c.training_job.empty()) continue;
    if (!ApplyLocked(c.node, ToNodeJob(c), true)) continue;
    unpublished_.insert({c.node, c.training_job});
    if (outbox_enabled_) {
      outbox_[{c.node, c.training_job}] = c.last_unix_ns;
      outbox_dirty_.insert({c.node, c.training_job});
    }
  }
}

void NodeLedger::EnableOutbox() {
  std::lock_guard lock(mu_);
  outbox_enabled_ = true;
}

void NodeLedger::Delivered(const std::string& node, const std::string& job, int64_t last_unix_ns) {
  std::lock_guard lock(mu_);
  auto it = outbox_.find({node, job});
  if (it == outbox_.end() || it->second > last_unix_ns) return;  // a newer charge still waits
  outbox_.erase(it);
  outbox_dirty_.insert({node, job});
}

size_t NodeLedger::undelivered() const {
  std::lock_guard lock(mu_);
  return outbox_enabled_ ? outbox_.size() : 0;
}

bool NodeLedger::Valid(const v1::NodeRecord& record) {
  if (record.node().empty() || record.by_job_size() > 1) return false;
  if (record.by_job_size() == 0) return record.last_unix_ns() > 0;
  return !record.by_job(0).training_job().empty();
}

bool NodeLedger::Apply(const v1::NodeRecord& record, bool save) {
  if (!Valid(record)) return false;
  std::lock_guard lock(mu_);
  if (record.by_job_size() == 0) {
    const bool changed =
        MarkLocked(record.node(), record.alert_firing(), record.last_unix_ns(), false);
    if (changed && save) alerts_unsaved_ = true;
    return changed;
  }
  return ApplyLocked(record.node(), record.by_job(0), save);
}

bool NodeLedger::MarkLocked(const std::string& node, bool firing, int64_t at_unix_ns,
                            bool publish) {
  auto [it, inserted] = alerts_.try_emplace(node);
  if (!inserted && it->second.at_unix_ns >= at_unix_ns) return false;
  it->second = {firing, at_unix_ns};
  if (publish) alerts_unpublished_.insert(node);
  return true;
}

void NodeLedger::PutAlertsLocked(Checkpoint* state) {
  state::v1::NodeAlertsState s;
  for (const auto& [node, mark] : alerts_) {
    auto* m = s.add_marks();
    m->set_node(node);
    m->set_at_unix_ns(mark.at_unix_ns);
    m->set_firing(mark.firing);
  }
  state->Put(StateFamily::kMetadata, std::string(kNodeAlertsKey), s.SerializeAsString());
  alerts_unsaved_ = false;
}

bool NodeLedger::ApplyLocked(const std::string& node, const v1::NodeJob& job, bool save) {
  Node& n = nodes_[node];
  auto [it, inserted] = n.jobs.try_emplace(job.training_job());
  if (!inserted) {
    if (!Newer(job, it->second)) return false;
    by_age_.erase({it->second.last_unix_ns(), node, job.training_job()});
  }
  it->second = job;
  by_age_.insert({job.last_unix_ns(), node, job.training_job()});
  forgotten_.erase({node, job.training_job()});
  if (save) unsaved_.insert({node, job.training_job()});
  while (by_age_.size() > options_.max_records) {
    const auto [at, old_node, old_job] = *by_age_.begin();
    EraseLocked(old_node, old_job);
  }
  return true;
}

void NodeLedger::EraseLocked(const std::string& node, const std::string& job) {
  auto n = nodes_.find(node);
  if (n == nodes_.end()) return;
  auto j = n->second.jobs.find(job);
  if (j == n->second.jobs.end()) return;
  by_age_.erase({j->second.last_unix_ns(), node, job});
  n->second.jobs.erase(j);
  if (n->second.jobs.empty()) nodes_.erase(n);
  unpublished_.erase({node, job});
  unsaved_.erase({node, job});
  forgotten_.insert({node, job});
  if (outbox_.erase({node, job}) > 0) outbox_dirty_.insert({node, job});
  outbox_to_republish_.erase({node, job});
}

std::vector<v1::NodeRecord> NodeLedger::TakeUnpublished() {
  std::lock_guard lock(mu_);
  // Charges undelivered when the daemon stopped: again, once the view read the topic (what it
  // holds of the key then is the newest, whoever wrote it).
  if (complete_ && !outbox_to_republish_.empty()) {
    if (outbox_enabled_) {
      unpublished_.insert(outbox_to_republish_.begin(), outbox_to_republish_.end());
    }
    outbox_to_republish_.clear();
  }
  std::vector<v1::NodeRecord> out;
  out.reserve(unpublished_.size());
  for (const auto& [node, job] : unpublished_) {
    const auto n = nodes_.find(node);
    if (n == nodes_.end()) continue;
    const auto j = n->second.jobs.find(job);
    if (j == n->second.jobs.end()) continue;
    v1::NodeRecord& r = out.emplace_back();
    r.set_node(node);
    *r.add_by_job() = j->second;
  }
  unpublished_.clear();
  for (const std::string& node : alerts_unpublished_) {
    const auto m = alerts_.find(node);
    if (m == alerts_.end()) continue;
    v1::NodeRecord& r = out.emplace_back();
    r.set_node(node);
    r.set_alert_firing(m->second.firing);
    r.set_last_unix_ns(m->second.at_unix_ns);
  }
  alerts_unpublished_.clear();
  return out;
}

Checkpoint NodeLedger::TakeUnsaved() {
  std::lock_guard lock(mu_);
  Checkpoint c;
  for (const auto& [node, job] : forgotten_) c.Delete(StateFamily::kMetadata, RecordKey(node, job));
  forgotten_.clear();
  for (const auto& [node, job] : unsaved_) {
    const auto n = nodes_.find(node);
    if (n == nodes_.end()) continue;
    const auto j = n->second.jobs.find(job);
    if (j == n->second.jobs.end()) continue;
    v1::NodeRecord r;
    r.set_node(node);
    *r.add_by_job() = j->second;
    c.Put(StateFamily::kMetadata, RecordKey(node, job), r.SerializeAsString());
  }
  unsaved_.clear();
  if (alerts_unsaved_) PutAlertsLocked(&c);
  for (const auto& key : outbox_dirty_) {
    const auto it = outbox_.find(key);
    if (it != outbox_.end() && outbox_enabled_) {
      c.Put(StateFamily::kMetadata, OutboxKey(key.first, key.second), std::to_string(it->second));
    } else {
      c.Delete(StateFamily::kMetadata, OutboxKey(key.first, key.second));
    }
  }
  outbox_dirty_.clear();
  if (!outbox_enabled_) outbox_.clear();  // a run without a nodes topic: markers deleted above
  return c;
}

absl::Status NodeLedger::LoadFrom(const StateStore& store) {
  size_t loaded = 0, damaged = 0;
  absl::Status s = store.ForEach(
      StateFamily::kMetadata, kNodeRecordKeyPrefix, [&](std::string_view, std::string_view value) {
        v1::NodeRecord r;
        if (!r.ParseFromArray(value.data(), static_cast<int>(value.size())) ||
            r.by_job_size() != 1) {
          ++damaged;
          return;
        }
        Apply(r, /*save=*/false);
        ++loaded;
      });
  if (!s.ok()) return s;
  if (damaged > 0) spdlog::warn("fleet view of nodes: {} damaged stored records ignored", damaged);
  auto alerts = store.Get(StateFamily::kMetadata, kNodeAlertsKey);
  if (!alerts.ok()) return alerts.status();
  // Charges not delivered when the daemon stopped.
  std::vector<std::pair<std::pair<std::string, std::string>, int64_t>> outbox;
  s = store.ForEach(
      StateFamily::kMetadata, kNodeOutboxKeyPrefix,
      [&](std::string_view key, std::string_view value) {
        const std::string_view rest = key.substr(kNodeOutboxKeyPrefix.size());
        const size_t zero = rest.find('\0');
        int64_t at = 0;
        if (zero == std::string_view::npos ||
            std::from_chars(value.data(), value.data() + value.size(), at).ec != std::errc()) {
          return;
        }
        outbox.push_back(
            {{std::string(rest.substr(0, zero)), std::string(rest.substr(zero + 1))}, at});
      });
  if (!s.ok()) return s;
  std::lock_guard lock(mu_);
  for (auto& [key, at] : outbox) {
    outbox_dirty_.insert(key);  // stored again with the outbox enabled, else deleted
    const auto n = nodes_.find(key.first);
    if (n == nodes_.end() || n->second.jobs.count(key.second) == 0) continue;
    outbox_[key] = at;
    outbox_to_republish_.insert(key);
  }
  if (!outbox_to_republish_.empty()) {
    spdlog::info(
        "fleet view of nodes: {} charges not delivered to the nodes topic before the restart "
        "are published again",
        outbox_to_republish_.size());
  }
  if (alerts->has_value()) {
    state::v1::NodeAlertsState state;
    if (state.ParseFromString(**alerts)) {
      // Published again: a transition this instance raised may not have reached the topic
      // before it stopped (the topic keeps the newest of equal marks).
      for (const auto& m : state.marks()) MarkLocked(m.node(), m.firing(), m.at_unix_ns(), true);
    }
  }
  if (loaded > 0) {
    spdlog::info("fleet view of nodes: {} records of {} nodes restored, {} node alerts firing",
                 loaded, nodes_.size(), FiringLocked());
  }
  return absl::OkStatus();
}

void NodeLedger::Prune(int64_t now_unix_ns) {
  const int64_t oldest = now_unix_ns - options_.horizon.count();
  std::lock_guard lock(mu_);
  while (!by_age_.empty() && std::get<0>(*by_age_.begin()) < oldest) {
    const auto [at, node, job] = *by_age_.begin();
    EraseLocked(node, job);
  }
  for (auto it = alerts_.begin(); it != alerts_.end();) {
    if (!it->second.firing && it->second.at_unix_ns < oldest) {
      it = alerts_.erase(it);
      alerts_unsaved_ = true;
    } else {
      ++it;
    }
  }
}

v1::NodeRecord NodeLedger::SummaryLocked(const std::string& node, const Node& n,
                                         int64_t now_unix_ns, bool with_jobs) const {
  const int64_t oldest = now_unix_ns - options_.horizon.count();
  const int64_t window_start = now_unix_ns - options_.alert_window.count();
  v1::NodeRecord r;
  r.set_node(node);
  std::vector<const v1::NodeJob*> jobs;
  for (const auto& [name, j] : n.jobs) {
    if (j.last_unix_ns() < oldest) continue;
    jobs.push_back(&j);
    r.set_jobs(r.jobs() + 1);
    r.set_episodes(r.episodes() + j.episodes());
    r.set_lost_rank_seconds(r.lost_rank_seconds() + j.lost_rank_seconds());
    if (j.first_unix_ns() > 0 &&
        (r.first_unix_ns() == 0 || j.first_unix_ns() < r.first_unix_ns())) {
      r.set_first_unix_ns(j.first_unix_ns());
    }
    r.set_last_unix_ns(std::max(r.last_unix_ns(), j.last_unix_ns()));
    if (j.last_unix_ns() >= window_start) r.set_jobs_in_alert_window(r.jobs_in_alert_window() + 1);
  }
  const auto mark = alerts_.find(node);
  r.set_alert_firing(mark != alerts_.end() && mark->second.firing);
  if (with_jobs) {
    std::sort(jobs.begin(), jobs.end(), [](const v1::NodeJob* a, const v1::NodeJob* b) {
      return a->last_unix_ns() > b->last_unix_ns();
    });
    for (const v1::NodeJob* j : jobs) *r.add_by_job() = *j;
  }
  return r;
}

v1::ListNodesResponse NodeLedger::ListNodes(const v1::ListNodesRequest& request,
                                            int64_t now_unix_ns) const {
  v1::ListNodesResponse out;
  out.set_horizon_seconds(
      std::chrono::duration_cast<std::chrono::seconds>(options_.horizon).count());
  out.set_alert_window_seconds(
      std::chrono::duration_cast<std::chrono::seconds>(options_.alert_window).count());
  out.set_alert_jobs(options_.alert_jobs);
  std::lock_guard lock(mu_);
  out.set_complete(complete_);
  std::vector<v1::NodeRecord> all;
  for (const auto& [node, n] : nodes_) {
    if (!request.node().empty() && node != request.node()) continue;
    v1::NodeRecord r = SummaryLocked(node, n, now_unix_ns, !request.node().empty());
    if (r.jobs() == 0) continue;
    all.push_back(std::move(r));
  }
  out.set_nodes_total(static_cast<uint32_t>(all.size()));
  std::sort(all.begin(), all.end(), [](const v1::NodeRecord& a, const v1::NodeRecord& b) {
    if (a.lost_rank_seconds() != b.lost_rank_seconds()) {
      return a.lost_rank_seconds() > b.lost_rank_seconds();
    }
    if (a.jobs() != b.jobs()) return a.jobs() > b.jobs();
    return a.node() < b.node();
  });
  const size_t limit = request.limit() > 0 ? request.limit() : 50;
  for (size_t i = 0; i < all.size() && i < limit; ++i) *out.add_nodes() = std::move(all[i]);
  return out;
}

v1::Alert NodeLedger::NodeAlert(const v1::NodeRecord& summary, v1::AlertState state,
                                int64_t now_unix_ns) const {
  v1::Alert a;
  a.set_id(std::string(kNodeAlertIdPrefix) + summary.node());
  a.set_kind(v1::ALERT_NODE_CULPRIT);
  a.set_subject("node:" + summary.node());
  a.set_state(state);
  a.set_severity(v1::SEVERITY_WARN);
  a.set_scope(v1::SCOPE_NODE);
  a.set_at_unix_ns(now_unix_ns);
  a.set_triggered_unix_ns(now_unix_ns);
  v1::Diagnosis* d = a.mutable_evidence();
  d->set_evaluated_unix_ns(now_unix_ns);
  v1::StepDiagnosis* step = d->mutable_step();
  step->set_scope(v1::SCOPE_NODE);
  step->set_culprit_node(summary.node());
  step->set_severity(v1::SEVERITY_WARN);
  std::string jobs;
  for (const v1::NodeJob& j : summary.by_job()) {
    if (j.last_unix_ns() < now_unix_ns - options_.alert_window.count()) continue;
    if (!jobs.empty()) jobs += ", ";
    jobs += j.training_job();
  }
  if (state == v1::ALERT_FIRING) {
    step->set_note(
        fmt::format("node {}: culprit of {} jobs in {}, {:.1f} rank-hours lost: drain it",
                    summary.node(), summary.jobs_in_alert_window(), Span(options_.alert_window),
                    summary.lost_rank_seconds() / 3600));
    step->set_next_step(fmt::format(
        "Drain {} and check its GPUs, NIC and host before it slows another job; its jobs: {} "
        "(rankwatch nodes --node {})",
        summary.node(), jobs, summary.node()));
  } else {
    step->set_note(fmt::format("node {}: culprit of {} jobs in {} (below {})", summary.node(),
                               summary.jobs_in_alert_window(), Span(options_.alert_window),
                               options_.alert_jobs));
  }
  return a;
}

std::vector<v1::Alert> NodeLedger::EvaluateAlerts(
    int64_t now_unix_ns, const std::function<bool(const std::string&)>& owns, Checkpoint* state) {
  std::vector<v1::Alert> out;
  std::lock_guard lock(mu_);
  for (const auto& [node, n] : nodes_) {
    if (!owns(node)) continue;
    const v1::NodeRecord r = SummaryLocked(node, n, now_unix_ns, true);
    const bool over = options_.alert_jobs > 0 && r.jobs_in_alert_window() >= options_.alert_jobs;
    const auto mark = alerts_.find(node);
    const bool fired = mark != alerts_.end() && mark->second.firing;
    if (over == fired) continue;
    // After the mark held (another instance's clock may run ahead): this one must win.
    const int64_t at =
        mark != alerts_.end() ? std::max(now_unix_ns, mark->second.at_unix_ns + 1) : now_unix_ns;
    MarkLocked(node, over, at, true);
    out.push_back(NodeAlert(r, over ? v1::ALERT_FIRING : v1::ALERT_RESOLVED, now_unix_ns));
    if (over) {
      spdlog::warn("alert firing: {}{}: {}", kNodeAlertIdPrefix, node,
                   out.back().evidence().step().note());
    } else {
      spdlog::info("alert resolved: {}{}", kNodeAlertIdPrefix, node);
    }
  }
  // A firing node whose records all went (the horizon): resolved.
  for (auto& [node, mark] : alerts_) {
    if (!mark.firing || nodes_.count(node) > 0 || !owns(node)) continue;
    mark = {false, std::max(now_unix_ns, mark.at_unix_ns + 1)};
    alerts_unpublished_.insert(node);
    v1::NodeRecord r;
    r.set_node(node);
    out.push_back(NodeAlert(r, v1::ALERT_RESOLVED, now_unix_ns));
  }
  if (!out.empty()) {
    if (state != nullptr) {
      PutAlertsLocked(state);
    } else {
      alerts_unsaved_ = true;
    }
  }
  return out;
}

void NodeLedger::SetComplete(bool complete) {
  std::lock_guard lock(mu_);
  complete_ = complete;
}

bool NodeLedger::complete() const {
  std::lock_guard lock(mu_);
  return complete_;
}

size_t NodeLedger::firing() const {
  std::lock_guard lock(mu_);
  return FiringLocked();
}

std::vector<std::string> NodeLedger::FiringAlertIds() const {
  std::lock_guard lock(mu_);
  std::vector<std::string> out;
  for (const auto& [node, mark] : alerts_) {
    if (mark.firing) out.push_back(std::string(kNodeAlertIdPrefix) + node);
  }
  return out;
}

size_t NodeLedger::FiringLocked() const {
  size_t n = 0;
  for (const auto& [node, mark] : alerts_) n += mark.firing ? 1 : 0;
  return n;
}

size_t NodeLedger::records() const {
  std::lock_guard lock(mu_);
  return by_age_.size();
}

}  // namespace rankwatch
