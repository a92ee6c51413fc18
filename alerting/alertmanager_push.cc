#include "alerting/alertmanager_push.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <optional>

#include "common/json_string.h"
#include "state/outbound_state.h"

namespace rankwatch {
namespace {

using SteadyTime = std::chrono::steady_clock::time_point;

// The alert as the store or the ring has it: the newest publication with this sequence.
std::shared_ptr<const v1::Alert> AlertAt(const AlertHub& hub, uint64_t sequence) {
  std::shared_ptr<const v1::Alert> found;
  if (sequence == 0) return found;
  hub.Backlog(sequence - 1, sequence + 1, {},
              [&](std::shared_ptr<const v1::Alert> a) { found = std::move(a); });
  return found;
}

}  // namespace

std::string AlertmanagerBody(const std::vector<PushedAlert>& alerts,
                             const AlertPresentationOptions& presentation) {
  std::string out = "[";
  for (size_t i = 0; i < alerts.size(); ++i) {
    const PushedAlert& p = alerts[i];
    const PresentedAlert shown = Present(*p.alert, presentation);
    if (i > 0) out += ',';
    out += "{\"labels\":";
    AppendJsonObject(shown.labels, &out);
    out += ",\"annotations\":";
    AppendJsonObject(shown.annotations, &out);
    out += ",\"startsAt\":" + JsonString(Rfc3339(p.starts_unix_ns));
    out += ",\"endsAt\":" + JsonString(Rfc3339(p.ends_unix_ns));
    if (!shown.generator_url.empty()) out += ",\"generatorURL\":" + JsonString(shown.generator_url);
    out += '}';
  }
  out += ']';
  return out;
}

AlertmanagerPush::AlertmanagerPush(AlertmanagerPushOptions options, const AlertHub* hub,
                                   Persist persist)
    : options_(std::move(options)), hub_(hub), persist_(std::move(persist)) {}

absl::StatusOr<std::unique_ptr<AlertmanagerPush>> AlertmanagerPush::Create(
    AlertmanagerPushOptions options, const AlertHub* hub, const StateStore* store, Persist persist,
    PrometheusRegistry* registry, TransportFactory transports) {
  auto push = std::unique_ptr<AlertmanagerPush>(
      new AlertmanagerPush(std::move(options), hub, std::move(persist)));
  MetricFamily* sent = registry->Counter(
      "rankwatch_alertmanager_alerts_sent_total",
      "Alerts delivered to an Alertmanager (each re-send of a firing alert counts)", {"target"});
  MetricFamily* failed =
      registry->Counter("rankwatch_alertmanager_posts_failed_total",
                        "POSTs to an Alertmanager that failed (retried)", {"target"});
  MetricFamily* dropped = registry->Counter(
      "rankwatch_alertmanager_alerts_dropped_total",
      "Alerts an Alertmanager refused (HTTP 400) or that left the alert log before delivery",
      {"target"});
  MetricFamily* pending =
      registry->Gauge("rankwatch_alertmanager_pending_alerts",
                      "Alerts of the alert log not delivered to an Alertmanager yet", {"target"});
  MetricFamily* firing = registry->Gauge("rankwatch_alertmanager_firing_alerts",
                                         "Firing alerts an Alertmanager is re-sent", {"target"});
  Checkpoint initial;
  for (const std::string& url : push->options_.urls) {
    auto parsed = ParseHttpUrl(url);
    if (!parsed.ok()) return parsed.status();
    auto t = std::make_unique<Target>();
    t->url = url;
    std::string base = url;
    while (!base.empty() && base.back() == '/') base.pop_back();
    t->endpoint = base + "/api/v2/alerts";
    t->transport = transports ? transports() : MakeHttpTransport(push->options_.http);
    t->sent = sent->WithLabels({url});
    t->failed = failed->WithLabels({url});
    t->dropped = dropped->WithLabels({url});
    t->pending = pending->WithLabels({url});
    t->firing_gauge = firing->WithLabels({url});
    outbound_state::StoredPush stored;
    if (store != nullptr) {
      auto read = outbound_state::ReadPush(*store, url);
      if (!read.ok()) return read.status();
      stored = std::move(*read);
    }
    if (!stored.cursor) {
      // A new target: alerts from now on (the log's history is not replayed to it).
      t->cursor = hub->last_sequence();
      outbound_state::PutPushCursor(url, t->cursor, &initial);
    } else {
      t->cursor = *stored.cursor;
    }
    for (auto& [id, f] : stored.firing) {
      auto alert = AlertAt(*hub, f.sequence());
      if (alert == nullptr || alert->id() != id) {
        outbound_state::DeletePushFiring(url, id, &initial);  // gone from the log
        continue;
      }
      t->firing[id] = {std::move(alert), f.starts_unix_ns()};
    }
    t->firing_gauge->Set(static_cast<double>(t->firing.size()));
    t->resend_now = !t->firing.empty();  // the Alertmanager may have forgotten them meanwhile
    spdlog::info("alertmanager {}: alerts after sequence {}, {} firing", url, t->cursor,
                 t->firing.size());
    push->targets_.push_back(std::move(t));
  }
  if (!initial.empty() && push->persist_) push->persist_(std::move(initial));
  return push;
}

AlertmanagerPush::~AlertmanagerPush() { Stop(); }

void AlertmanagerPush::Start() {
  for (auto& target : targets_) {
    Target* t = target.get();
    t->loop.Start(options_.poll,
                  [this, t](SteadyTime now, int64_t now_unix_ns) { Run(*t, now, now_unix_ns); });
  }
}

void AlertmanagerPush::Stop() {
  for (auto& t : targets_) t->loop.Stop();
}

void AlertmanagerPush::RunOnce(SteadyTime now, int64_t now_unix_ns) {
  for (auto& t : targets_) Run(*t, now, now_unix_ns);
}

std::vector<AlertmanagerPush::TargetStatus> AlertmanagerPush::status() const {
  std::vector<TargetStatus> out;
  for (const auto& t : targets_) {
    std::lock_guard<std::mutex> lock(t->mu);
    out.push_back({t->url, t->cursor, t->firing.size(), t->failing});
  }
  return out;
}

int64_t AlertmanagerPush::Lifetime() const {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(options_.resend_interval).count() *
         std::max(1, options_.lifetime_intervals);
}

void AlertmanagerPush::Run(Target& t, SteadyTime now, int64_t now_unix_ns) {
  if (now < t.retry_at) return;
  if (!SendLog(t, now, now_unix_ns)) return;
  if (!t.next_resend) t.next_resend = now + options_.resend_interval;
  if (t.resend_now || now >= *t.next_resend) Resend(t, now, now_unix_ns);
}

bool AlertmanagerPush::Post(Target& t, const std::vector<PushedAlert>& alerts, SteadyTime now,
                            bool* rejected) {
  *rejected = false;
  const HttpResult r =
      t.transport->Post(t.endpoint, AlertmanagerBody(alerts, options_.presentation), {});
  if (r.ok() || r.status == 400) {
    // 400: Alertmanager refuses these alerts as they are; sending them again would not help.
    *rejected = !r.ok();
    if (*rejected) {
      t.dropped->Add(static_cast<double>(alerts.size()));
      spdlog::error("alertmanager {}: {} alerts refused: {}", t.url, alerts.size(), r.Describe());
    } else {
      t.sent->Add(static_cast<double>(alerts.size()));
    }
    if (t.failing) {
      spdlog::info("alertmanager {}: delivering again", t.url);
      std::lock_guard<std::mutex> lock(t.mu);
      t.failing = false;
      t.resend_now = true;  // it may have restarted, forgetting every alert: all of them again
    }
    t.backoff = std::chrono::milliseconds(0);
    return true;
  }
  t.failed->Add(1);
  t.backoff =
      std::min(options_.max_backoff, std::max(std::chrono::milliseconds(1000), t.backoff * 2));
  t.retry_at = now + t.backoff;
  if (!t.failing) {
    spdlog::warn("alertmanager {}: {}; retrying (the alerts wait in the alert log)", t.url,
                 r.Describe());
    std::lock_guard<std::mutex> lock(t.mu);
    t.failing = true;
  }
  return false;
}

bool AlertmanagerPush::SendLog(Target& t, SteadyTime now, int64_t now_unix_ns) {
  for (;;) {
    const uint64_t last = hub_->last_sequence();
    t.pending->Set(last > t.cursor ? static_cast<double>(last - t.cursor) : 0.0);
    if (t.cursor >= last) return true;
    const uint64_t upto = std::min<uint64_t>(last, t.cursor + options_.max_batch);
    std::vector<std::shared_ptr<const v1::Alert>> batch;
    hub_->Backlog(t.cursor, upto + 1, {},
                  [&](std::shared_ptr<const v1::Alert> a) { batch.push_back(std::move(a)); });
    if (batch.size() < upto - t.cursor) {
      // Trimmed from the log before it was delivered (or unreadable): lost to this target.
      t.dropped->Add(static_cast<double>(upto - t.cursor - batch.size()));
    }
    // The newest state of each alert in the batch; the firing set as it will be.
    std::map<std::string, std::optional<Firing>> changes;
    std::map<std::string, PushedAlert> newest;
    for (auto& alert : batch) {
      const std::string& id = alert->id();
      const Firing* current = nullptr;
      if (auto c = changes.find(id); c != changes.end()) {
        current = c->second ? &*c->second : nullptr;
      } else if (auto f = t.firing.find(id); f != t.firing.end()) {
        current = &f->second;
      }
      const int64_t at = alert->at_unix_ns() > 0 ? alert->at_unix_ns() : now_unix_ns;
      const int64_t starts = current != nullptr ? current->starts_unix_ns : at;
      if (alert->state() == v1::ALERT_FIRING) {
        changes[id] = Firing{alert, starts};
        newest[id] = {alert, starts, now_unix_ns + Lifetime()};
      } else if (alert->state() == v1::ALERT_RESOLVED) {
        changes[id] = std::nullopt;
        newest[id] = {alert, starts, std::max(at, starts)};
      }
    }
    std::vector<PushedAlert> send;
    for (auto& [id, p] : newest) send.push_back(std::move(p));
    std::sort(send.begin(), send.end(), [](const PushedAlert& a, const PushedAlert& b) {
      return a.alert->sequence() < b.alert->sequence();
    });
    bool rejected = false;
    if (!send.empty() && !Post(t, send, now, &rejected)) return false;
    Checkpoint c;
    {
      std::lock_guard<std::mutex> lock(t.mu);
      for (auto& [id, change] : changes) {
        if (change) {
          state::v1::PushFiring f;
          f.set_sequence(change->alert->sequence());
          f.set_starts_unix_ns(change->starts_unix_ns);
          outbound_state::PutPushFiring(t.url, id, f, &c);
          t.firing[id] = std::move(*change);
        } else if (t.firing.erase(id) > 0) {
          outbound_state::DeletePushFiring(t.url, id, &c);
        }
      }
      t.cursor = upto;
    }
    outbound_state::PutPushCursor(t.url, upto, &c);
    if (persist_) persist_(std::move(c));
    t.firing_gauge->Set(static_cast<double>(t.firing.size()));
  }
}

bool AlertmanagerPush::Resend(Target& t, SteadyTime now, int64_t now_unix_ns) {
  std::vector<PushedAlert> send;
  std::vector<std::string> ended;
  std::map<std::string, std::vector<std::string>> tracked;  // by job: what the daemon tracks
  for (const auto& [id, f] : t.firing) {
    const std::string& job = f.alert->training_job();
    auto it = tracked.find(job);
    if (it == tracked.end()) it = tracked.emplace(job, hub_->Firing(job)).first;
    const bool still = std::find(it->second.begin(), it->second.end(), id) != it->second.end();
    send.push_back({f.alert, f.starts_unix_ns, still ? now_unix_ns + Lifetime() : now_unix_ns});
    if (!still) ended.push_back(id);
  }
  for (size_t from = 0; from < send.size(); from += options_.max_batch * 4) {
    const size_t to = std::min(send.size(), from + options_.max_batch * 4);
    bool rejected = false;
    const std::vector<PushedAlert> chunk(send.begin() + static_cast<std::ptrdiff_t>(from),
                                         send.begin() + static_cast<std::ptrdiff_t>(to));
    if (!Post(t, chunk, now, &rejected)) {
      return false;
    }
  }
  t.next_resend = now + options_.resend_interval;
  t.resend_now = false;
  if (!ended.empty()) {
    Checkpoint c;
    std::lock_guard<std::mutex> lock(t.mu);
    for (const std::string& id : ended) {
      spdlog::info("alertmanager {}: {} ended (the daemon no longer tracks it)", t.url, id);
      t.firing.erase(id);
      outbound_state::DeletePushFiring(t.url, id, &c);
    }
    if (persist_) persist_(std::move(c));
  }
  t.firing_gauge->Set(static_cast<double>(t.firing.size()));
  return true;
}

}  // namespace rankwatch
