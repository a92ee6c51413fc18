// AlertmanagerPush: sends every alert of the daemon's alert log (alerting/alert_hub.h) to one or
// more Alertmanagers through their API (POST /api/v2/alerts), as Prometheus does with its rule
// alerts: a firing alert with endsAt a few resend intervals ahead, re-sent every resend interval
// while it fires (so Alertmanager ends it by itself if the daemon goes away), a resolved one with
// endsAt its resolve time. Labels, annotations and the web UI link are
// alerting/alert_presentation.h's.
//
// Nothing is lost while an Alertmanager is away: each target has a cursor in the alert log
// (every alert up to it was delivered) and its firing alerts, both stored in the state store
// (state/outbound_state.h) once a POST succeeded. The target reads the log after its cursor
// (AlertHub::Backlog, from memory or the store) in batches, newest state per alert in a batch;
// a failed POST is retried with exponential backoff, and after a failure (and at start) the
// whole firing set is sent again at once (an Alertmanager that restarted forgot it). A target
// never configured before starts at the newest alert.
//
// Each target runs on a thread of its own: the ingest thread never waits for it. An alert the
// daemon stops tracking without resolving it (its job removed or moved to another instance) is
// ended (endsAt now) at the next resend.
//
// Thread-safety: RunOnce is for tests that do not Start(); status() from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "alerting/alert_hub.h"
#include "alerting/alert_presentation.h"
#include "alerting/outbound_http.h"
#include "metrics/prometheus_registry.h"
#include "rankwatch/v1/service.pb.h"
#include "state/state_store.h"

namespace rankwatch {

struct AlertmanagerPushOptions {
  std::vector<std::string> urls;  // Alertmanager base URLs; /api/v2/alerts is appended
  OutboundHttpOptions http;
  AlertPresentationOptions presentation;
  // A firing alert is sent again this often. Default: 1 min (Prometheus' resend delay).
  std::chrono::milliseconds resend_interval{60'000};
  // A firing alert's endsAt: this many resend intervals after it was sent. Default: 4.
  int lifetime_intervals = 4;
  size_t max_batch = 64;                          // alerts of the log a POST carries at most
  std::chrono::milliseconds max_backoff{30'000};  // between retries of a failing target
  std::chrono::milliseconds poll{100};            // how often a target looks for new alerts
};

// One alert as an Alertmanager is told.
struct PushedAlert {
  std::shared_ptr<const v1::Alert> alert;
  int64_t starts_unix_ns = 0;
  int64_t ends_unix_ns = 0;
};
// The JSON array POST /api/v2/alerts takes.
std::string AlertmanagerBody(const std::vector<PushedAlert>& alerts,
                             const AlertPresentationOptions& presentation);

class AlertmanagerPush {
 public:
  // Queues a write of the state store (the checkpoint writer's EnqueueNoWait).
  using Persist = std::function<void(Checkpoint)>;
  using TransportFactory = std::function<std::unique_ptr<HttpTransport>()>;

  // Reads each target's stored cursor and firing alerts from `store` (may be null: nothing
  // stored, nothing persisted). `transports` makes each target's client (default: cpp-httplib's).
  // Bad URLs are InvalidArgument; unreadable state DataLoss.
  static absl::StatusOr<std::unique_ptr<AlertmanagerPush>> Create(
      AlertmanagerPushOptions options, const AlertHub* hub, const StateStore* store,
      Persist persist, PrometheusRegistry* registry, TransportFactory transports = nullptr);
  ~AlertmanagerPush();  // Stop()

  void Start();  // a thread per target
  void Stop();

  // One round of every target's work at `now` (tests, without Start()).
  void RunOnce(std::chrono::steady_clock::time_point now, int64_t now_unix_ns);

  struct TargetStatus {
    std::string url;
    uint64_t cursor = 0;  // every alert up to this sequence was delivered
    size_t firing = 0;    // firing alerts it is re-sent
    bool failing = false;
  };
  std::vector<TargetStatus> status() const;

 private:
  struct Firing {
    std::shared_ptr<const v1::Alert> alert;
    int64_t starts_unix_ns = 0;
  };
  struct Target {
    std::string url;
    std::string endpoint;  // url + /api/v2/alerts
    std::unique_ptr<HttpTransport> transport;
    mutable std::mutex mu;  // guards the state below against status()
    uint64_t cursor = 0;
    std::map<std::string, Firing> firing;
    bool failing = false;
    std::chrono::steady_clock::time_point retry_at{};
    // The next resend of the firing set: one interval after the first round, then after each.
    std::optional<std::chrono::steady_clock::time_point> next_resend;
    bool resend_now = false;  // at start with a stored firing set, and after a failure
    std::chrono::milliseconds backoff{0};
    MetricCell* sent = nullptr;     // alerts delivered (each resend counts)
    MetricCell* failed = nullptr;   // POSTs that failed
    MetricCell* dropped = nullptr;  // alerts refused (HTTP 400) or gone from the log
    MetricCell* pending = nullptr;  // alerts of the log not delivered yet
    MetricCell* firing_gauge = nullptr;
    DeliveryLoop loop;
  };

  AlertmanagerPush(AlertmanagerPushOptions options, const AlertHub* hub, Persist persist);
  void Run(Target& t, std::chrono::steady_clock::time_point now, int64_t now_unix_ns);
  // Sends the log after the cursor; false when the target failed (retry later).
  bool SendLog(Target& t, std::chrono::steady_clock::time_point now, int64_t now_unix_ns);
  // Sends every firing alert again (and ends those the daemon no longer tracks).
  bool Resend(Target& t, std::chrono::steady_clock::time_point now, int64_t now_unix_ns);
  // A POST; on failure the target backs off.
  bool Post(Target& t, const std::vector<PushedAlert>& alerts,
            std::chrono::steady_clock::time_point now, bool* rejected);
  int64_t Lifetime() const;

  const AlertmanagerPushOptions options_;
  const AlertHub* const hub_;
  const Persist persist_;
  std::vector<std::unique_ptr<Target>> targets_;
};

}  // namespace rankwatch
