#include "alerting/alert_actions.h"

#include <google/protobuf/util/json_util.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <deque>
#include <iterator>

#include "common/json_string.h"
#include "state/outbound_state.h"

namespace rankwatch {
namespace {

using SteadyTime = std::chrono::steady_clock::time_point;
using Record = state::v1::ActionRecord;

std::string_view OutcomeLabel(Record::Outcome outcome) {
  switch (outcome) {
    case Record::PENDING: return "pending";
    case Record::DELIVERED: return "delivered";
    case Record::FAILED: return "failed";
    case Record::DRY_RUN: return "dry_run";
    case Record::CANCELLED: return "cancelled";
    default: return "unknown";
  }
}

// The job of an alert id ("job|kind|subject"; node alerts "fleet|node_culprit|node:N" belong to
// no job), for records read back from the store without their alert.
std::string JobOfAlertId(const std::string& id) {
  if (id.rfind("fleet|node_culprit|", 0) == 0) return "";
  const size_t subject = id.rfind('|');
  if (subject == std::string::npos || subject == 0) return "";
  const size_t kind = id.rfind('|', subject - 1);
  return kind == std::string::npos ? "" : id.substr(0, kind);
}

bool HasStacks(const v1::Alert& alert) {
  return alert.evidence().has_hang_stacks() && alert.evidence().hang_stacks().settled_unix_ns() > 0;
}

}  // namespace

bool ActionRule::Matches(const v1::Alert& alert) const {
  if (kind != v1::ALERT_KIND_UNSPECIFIED && alert.kind() != kind) return false;
  return alert.severity() >= min_severity;
}

absl::StatusOr<ActionRule> ParseActionRule(std::string_view text) {
  ActionRule rule;
  rule.text = std::string(text);
  const auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError("'" + std::string(text) + "': " + why +
                                      " (KIND[:SEVERITY]=observe|webhook, e.g. "
                                      "hang:critical=webhook)");
  };
  const size_t eq = text.find('=');
  if (eq == std::string_view::npos) return bad("no '='");
  const std::string_view match = text.substr(0, eq);
  const std::string_view action = text.substr(eq + 1);
  if (action == "observe") {
    rule.action = ActionRule::Action::kObserve;
  } else if (action == "webhook") {
    rule.action = ActionRule::Action::kWebhook;
  } else {
    return bad("unknown action '" + std::string(action) + "'");
  }
  const size_t colon = match.find(':');
  const std::string_view kind = match.substr(0, colon);
  if (kind != "*") {
    rule.kind = AlertKindOfLabel(kind);
    if (rule.kind == v1::ALERT_KIND_UNSPECIFIED) {
      return bad("unknown alert kind '" + std::string(kind) +
                 "' (straggler, hang, memory_creep, memory_pressure, memory_imbalance, "
                 "input_bound, wait_heavy, node_culprit or *)");
    }
  }
  if (colon != std::string_view::npos) {
    const std::string_view severity = match.substr(colon + 1);
    if (severity == "info") {
      rule.min_severity = v1::SEVERITY_INFO;
    } else if (severity == "warning") {
      rule.min_severity = v1::SEVERITY_WARN;
    } else if (severity == "critical") {
      rule.min_severity = v1::SEVERITY_CRIT;
    } else {
      return bad("unknown severity '" + std::string(severity) + "' (info, warning, critical)");
    }
  }
  return rule;
}

std::string ActionPayload(const v1::Alert& alert, const Record& record,
                          const AlertPresentationOptions& presentation) {
  const PresentedAlert shown = Present(alert, presentation);
  google::protobuf::util::JsonPrintOptions json;
  json.preserve_proto_field_names = true;
  std::string alert_json;
  (void)google::protobuf::util::MessageToJsonString(alert, &alert_json, json);
  const std::string delivery = record.alert_id() + "@" + std::to_string(record.firing_sequence());
  std::string out = "{\"version\":1";
  out += ",\"delivery\":" + JsonString(delivery);
  out += ",\"action\":\"webhook\"";
  out += ",\"rule\":" + JsonString(record.rule());
  out += ",\"alert_id\":" + JsonString(alert.id());
  out += ",\"firing_sequence\":" + std::to_string(record.firing_sequence());
  out += ",\"sequence\":" + std::to_string(alert.sequence());
  out += ",\"kind\":" + JsonString(AlertKindLabel(alert.kind()));
  out += ",\"severity\":" + JsonString(SeverityLabel(alert.severity()));
  out += ",\"training_job\":" + JsonString(alert.training_job());
  out += ",\"subject\":" + JsonString(alert.subject());
  out += ",\"fired_at\":" + JsonString(Rfc3339(record.fired_unix_ns()));
  out += ",\"labels\":";
  AppendJsonObject(shown.labels, &out);
  out += ",\"annotations\":";
  AppendJsonObject(shown.annotations, &out);
  out += ",\"generator_url\":" + JsonString(shown.generator_url);
  // A hang alert's stacks: whether they came within the wait (they are in alert.evidence).
  if (alert.kind() == v1::ALERT_HANG) {
    out += std::string(",\"hang_stacks\":") + (HasStacks(alert) ? "true" : "false");
  }
  out += ",\"alert\":" + (alert_json.empty() ? std::string("{}") : alert_json);
  out += '}';
  return out;
}

absl::StatusOr<std::vector<v1::AlertAction>> StoredActions(const StateStore& store,
                                                           const std::string& training_job,
                                                           size_t max) {
  std::deque<v1::AlertAction> out;
  const std::string prefix = training_job + "|";
  absl::Status s = outbound_state::ScanActions(store, 0, [&](Record&& r) {
    if (!training_job.empty() && r.alert_id().rfind(prefix, 0) != 0) return true;
    v1::AlertAction a;
    a.set_alert_id(r.alert_id());
    a.set_firing_sequence(r.firing_sequence());
    a.set_sent_sequence(r.sent_sequence());
    a.set_rule(r.rule());
    a.set_outcome(std::string(OutcomeLabel(r.outcome())));
    a.set_rounds(r.attempts());
    a.set_fired_unix_ns(r.fired_unix_ns());
    a.set_done_unix_ns(r.done_unix_ns());
    a.set_detail(r.detail());
    a.set_with_stacks(r.with_stacks());
    a.set_resolved(r.resolved());
    out.push_back(std::move(a));
    if (out.size() > max) out.pop_front();
    return true;
  });
  if (!s.ok()) return s;
  return std::vector<v1::AlertAction>(std::make_move_iterator(out.begin()),
                                      std::make_move_iterator(out.end()));
}

AlertActions::AlertActions(AlertActionsOptions options, const AlertHub* hub, Persist persist)
    : options_(std::move(options)), hub_(hub), persist_(std::move(persist)) {}

absl::StatusOr<std::unique_ptr<AlertActions>> AlertActions::Create(
    AlertActionsOptions options, const AlertHub* hub, const StateStore* store, Persist persist,
    PrometheusRegistry* registry, std::unique_ptr<HttpTransport> transport) {
  for (const std::string& url : options.webhooks) {
    if (auto parsed = ParseHttpUrl(url); !parsed.ok()) return parsed.status();
  }
  auto a =
      std::unique_ptr<AlertActions>(new AlertActions(std::move(options), hub, std::move(persist)));
  a->transport_ = transport ? std::move(transport) : MakeHttpTransport(a->options_.http);
  a->outcomes_ = registry->Counter(
      "rankwatch_alert_actions_total",
      "Actions of the action policy by alert kind and outcome (delivered, failed, dry_run, "
      "cancelled)",
      {"kind", "outcome"});
  a->calls_failed_ =
      registry
          ->Counter("rankwatch_alert_action_calls_failed_total",
                    "Webhook calls of actions that failed (retried with backoff)", {})
          ->WithLabels({});
  a->pending_ = registry
                    ->Gauge("rankwatch_alert_actions_pending",
                            "Actions waiting for their evidence or retrying", {})
                    ->WithLabels({});
  Checkpoint initial;
  std::optional<uint64_t> cursor;
  if (store != nullptr) {
    auto read = outbound_state::ReadActionCursor(*store);
    if (!read.ok()) return read.status();
    cursor = *read;
  }
  a->cursor_ = cursor ? *cursor : hub->last_sequence();
  if (!cursor) outbound_state::PutActionCursor(a->cursor_, &initial);
  if (store != nullptr) {
    const auto now = std::chrono::steady_clock::now();
    absl::Status s = outbound_state::ScanActions(*store, 0, [&](Record&& r) {
      if (r.resolved()) return true;
      Work w;
      w.record = std::move(r);
      a->open_[w.record.alert_id()] = {w.record.firing_sequence(),
                                       JobOfAlertId(w.record.alert_id())};
      if (!w.done()) {
        // Unfinished before the restart: its alert again from the log.
        const uint64_t seq = w.record.sent_sequence();
        hub->Backlog(seq - 1, seq + 1, {},
                     [&](std::shared_ptr<const v1::Alert> alert) { w.alert = std::move(alert); });
        if (w.alert == nullptr) {
          w.record.set_outcome(Record::FAILED);
          w.record.set_detail("its alert left the alert log before it was delivered");
          outbound_state::PutAction(w.record, &initial);
        } else {
          w.ready_at = a->NeedsEvidence(*w.alert) ? now + a->options_.evidence_wait : now;
          w.answered.assign(a->options_.webhooks.size(), false);
        }
      }
      a->work_[w.record.firing_sequence()] = std::move(w);
      return true;
    });
    if (!s.ok()) return s;
  }
  if (!initial.empty() && a->persist_) a->persist_(std::move(initial));
  spdlog::info("alert actions: {} rules, {} webhooks{}, alerts after sequence {}, {} open",
               a->options_.rules.size(), a->options_.webhooks.size(),
               a->options_.dry_run ? " (dry run)" : "", a->cursor_, a->work_.size());
  return a;
}

AlertActions::~AlertActions() { Stop(); }

void AlertActions::Start() {
  loop_.Start(options_.poll,
              [this](SteadyTime now, int64_t now_unix_ns) { RunOnce(now, now_unix_ns); });
}

void AlertActions::Stop() { loop_.Stop(); }

std::vector<Record> AlertActions::records() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Record> out;
  for (const auto& [seq, w] : work_) out.push_back(w.record);
  return out;
}

bool AlertActions::NeedsEvidence(const v1::Alert& alert) const {
  return alert.kind() == v1::ALERT_HANG && !HasStacks(alert) &&
         options_.evidence_wait > std::chrono::milliseconds(0);
}

void AlertActions::Apply(const std::shared_ptr<const v1::Alert>& alert, SteadyTime now,
                         std::vector<uint64_t>* changed) {
  const std::string& id = alert->id();
  auto open = open_.find(id);
  if (alert->state() == v1::ALERT_FIRING) {
    if (open == open_.end()) {  // a new firing
      open_[id] = {alert->sequence(), alert->training_job()};
      const auto rule = std::find_if(options_.rules.begin(), options_.rules.end(),
                                     [&](const ActionRule& r) { return r.Matches(*alert); });
      if (rule == options_.rules.end() || rule->action == ActionRule::Action::kObserve) return;
      Work w;
      w.record.set_alert_id(id);
      w.record.set_firing_sequence(alert->sequence());
      w.record.set_sent_sequence(alert->sequence());
      w.record.set_rule(rule->text);
      w.record.set_outcome(Record::PENDING);
      w.record.set_fired_unix_ns(alert->at_unix_ns());
      w.alert = alert;
      w.ready_at = NeedsEvidence(*alert) ? now + options_.evidence_wait : now;
      w.answered.assign(options_.webhooks.size(), false);
      if (w.ready_at > now) {
        spdlog::info("action for {}: waiting up to {} ms for its hang stacks", id,
                     options_.evidence_wait.count());
      }
      std::lock_guard<std::mutex> lock(mu_);
      work_[alert->sequence()] = std::move(w);
      changed->push_back(alert->sequence());
      return;
    }
    // A re-publication of the firing alert: newer evidence for an action not sent yet.
    std::lock_guard<std::mutex> lock(mu_);
    auto w = work_.find(open->second.firing_sequence);
    if (w == work_.end() || w->second.done() || w->second.rounds > 0) return;
    w->second.alert = alert;
    w->second.record.set_sent_sequence(alert->sequence());
    if (!NeedsEvidence(*alert)) w->second.ready_at = std::min(w->second.ready_at, now);
    changed->push_back(open->second.firing_sequence);
    return;
  }
  if (alert->state() != v1::ALERT_RESOLVED || open == open_.end()) return;
  const uint64_t firing = open->second.firing_sequence;
  open_.erase(open);
  std::lock_guard<std::mutex> lock(mu_);
  auto w = work_.find(firing);
  if (w == work_.end()) return;
  if (!w->second.done()) {
    w->second.record.set_detail("resolved before it was delivered");
    Finish(w->second, Record::CANCELLED, alert->at_unix_ns());
  }
  w->second.record.set_resolved(true);
  changed->push_back(firing);
}

bool AlertActions::Untracked(Work& w) {
  if (!w.untracked || !w.done()) return false;
  w.record.set_resolved(true);
  w.record.set_untracked(true);
  return true;
}

void AlertActions::ReleaseUntracked() {
  std::map<std::string, std::vector<std::string>> tracked;  // by job: what the hub tracks
  std::vector<uint64_t> released;
  for (auto it = open_.begin(); it != open_.end();) {
    const std::string& job = it->second.training_job;
    auto t = tracked.find(job);
    if (t == tracked.end()) t = tracked.emplace(job, hub_->Firing(job)).first;
    if (std::find(t->second.begin(), t->second.end(), it->first) != t->second.end()) {
      ++it;
      continue;
    }
    spdlog::info("alert actions: {} ended without a resolve here (the daemon no longer tracks it)",
                 it->first);
    released.push_back(it->second.firing_sequence);
    it = open_.erase(it);
  }
  if (released.empty()) return;
  Checkpoint c;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (uint64_t seq : released) {
      auto w = work_.find(seq);
      if (w == work_.end()) continue;
      w->second.untracked = true;  // a pending action is delivered first
      if (!Untracked(w->second)) continue;
      outbound_state::PutAction(w->second.record, &c);
      work_.erase(w);
    }
  }
  if (!c.empty() && persist_) persist_(std::move(c));
}

void AlertActions::Finish(Work& w, Record::Outcome outcome, int64_t now_unix_ns) {
  w.record.set_outcome(outcome);
  w.record.set_done_unix_ns(now_unix_ns);
  const std::string kind =
      std::string(AlertKindLabel(w.alert ? w.alert->kind() : v1::ALERT_KIND_UNSPECIFIED));
  outcomes_->WithLabels({kind, std::string(OutcomeLabel(outcome))})->Add(1);
}

bool AlertActions::Deliver(Work& w, SteadyTime now, int64_t now_unix_ns) {
  const std::string& id = w.record.alert_id();
  if (w.body.empty()) w.body = ActionPayload(*w.alert, w.record, options_.presentation);
  w.record.set_with_stacks(HasStacks(*w.alert));
  const std::string stacks = w.alert->kind() != v1::ALERT_HANG ? ""
                             : HasStacks(*w.alert)             ? ", with its stacks"
                                                               : ", without stacks";
  if (options_.dry_run) {
    std::string urls;
    for (const std::string& u : options_.webhooks) urls += (urls.empty() ? "" : ", ") + u;
    spdlog::info("action (dry run) for {} (rule {}): would POST {} bytes{} to {}", id,
                 w.record.rule(), w.body.size(), stacks, urls.empty() ? "no webhook" : urls);
    w.record.set_detail("dry run: nothing called");
    Finish(w, Record::DRY_RUN, now_unix_ns);
    return true;
  }
  ++w.rounds;
  w.record.set_attempts(static_cast<uint32_t>(w.rounds));
  std::string detail;
  auto secret = ReadSecretFile(options_.secret_file);
  if (!secret.ok()) {
    detail = std::string(secret.status().message());
  } else {
    const HttpHeaders headers = {
        {"X-Rankwatch-Signature", "sha256=" + HmacSha256Hex(*secret, w.body)},
        {"X-Rankwatch-Delivery", id + "@" + std::to_string(w.record.firing_sequence())},
        {"X-Rankwatch-Event", "alert-action"}};
    for (size_t i = 0; i < options_.webhooks.size(); ++i) {
      if (w.answered[i]) continue;
      const HttpResult r = transport_->Post(options_.webhooks[i], w.body, headers);
      if (r.ok()) {
        w.answered[i] = true;
      } else {
        calls_failed_->Add(1);
        detail += (detail.empty() ? "" : "; ") + options_.webhooks[i] + ": " + r.Describe();
      }
    }
  }
  if (std::all_of(w.answered.begin(), w.answered.end(), [](bool b) { return b; })) {
    spdlog::info("action for {} (rule {}): webhook delivered{} ({} round{})", id, w.record.rule(),
                 stacks, w.rounds, w.rounds == 1 ? "" : "s");
    w.record.set_detail("delivered");
    Finish(w, Record::DELIVERED, now_unix_ns);
    return true;
  }
  w.record.set_detail(detail);
  if (w.rounds >= options_.max_attempts) {
    spdlog::error("action for {} (rule {}): failed after {} rounds: {}", id, w.record.rule(),
                  w.rounds, detail);
    Finish(w, Record::FAILED, now_unix_ns);
    return true;
  }
  auto backoff = options_.first_backoff * (1LL << std::min(w.rounds - 1, 20));
  backoff = std::min<std::chrono::milliseconds>(backoff, options_.max_backoff);
  w.next_attempt = now + backoff;
  spdlog::warn("action for {} (rule {}): {}; retrying in {} ms", id, w.record.rule(), detail,
               backoff.count());
  return true;
}

void AlertActions::RunOnce(SteadyTime now, int64_t now_unix_ns) {
  // The alerts after the cursor, in batches; each batch's record changes and the new cursor go
  // into the store together.
  for (;;) {
    const uint64_t last = hub_->last_sequence();
    if (cursor_ >= last) break;
    const uint64_t upto = std::min<uint64_t>(last, cursor_ + 256);
    std::vector<std::shared_ptr<const v1::Alert>> batch;  // read first: Backlog holds the hub
    hub_->Backlog(cursor_, upto + 1, {},
                  [&](std::shared_ptr<const v1::Alert> a) { batch.push_back(std::move(a)); });
    std::vector<uint64_t> changed;
    for (const auto& a : batch) Apply(a, now, &changed);
    cursor_ = upto;
    Checkpoint c;
    outbound_state::PutActionCursor(cursor_, &c);
    std::lock_guard<std::mutex> lock(mu_);
    for (uint64_t seq : changed) {
      auto w = work_.find(seq);
      if (w == work_.end()) continue;
      outbound_state::PutAction(w->second.record, &c);
      if (w->second.record.resolved()) work_.erase(w);
    }
    if (cursor_ > options_.retention) outbound_state::TrimActions(cursor_ - options_.retention, &c);
    if (persist_) persist_(std::move(c));
  }
  // Firings that ended elsewhere, once the log was read to its end (a resolve read there first).
  if (now >= next_untracked_check_ && cursor_ >= hub_->last_sequence()) {
    next_untracked_check_ = now + options_.untracked_check;
    ReleaseUntracked();
  }
  // The actions due. The calls run without the lock: records() does not wait for them.
  std::vector<uint64_t> due;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [seq, w] : work_) {
      if (!w.done() && w.alert != nullptr && now >= w.ready_at && now >= w.next_attempt) {
        due.push_back(seq);
      }
    }
  }
  size_t waiting = 0;
  for (uint64_t seq : due) {
    Work w;
    {
      std::lock_guard<std::mutex> lock(mu_);
      w = work_.at(seq);
    }
    if (!Deliver(w, now, now_unix_ns)) continue;
    const bool release = Untracked(w);  // its firing ended elsewhere meanwhile
    Checkpoint c;
    outbound_state::PutAction(w.record, &c);
    if (persist_) persist_(std::move(c));
    std::lock_guard<std::mutex> lock(mu_);
    if (release) {
      work_.erase(seq);
    } else {
      work_[seq] = std::move(w);
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [seq, w] : work_) waiting += w.done() ? 0 : 1;
  }
  pending_->Set(static_cast<double>(waiting));
}

}  // namespace rankwatch
