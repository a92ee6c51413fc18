// AlertActions: what the daemon does about an alert besides telling people — the action
// policy (docs/alerting.md). Each rule maps alerts of a kind (or any kind) at or above a
// severity to an action: `observe` (nothing: the default for every alert no rule names) or
// `webhook` (POST the alert and its evidence to the configured webhooks, so that a Kubernetes
// operator or a Slurm script can restart the job or cordon the node). The first rule that
// matches decides.
//
// Once per firing: an alert that fires is acted on once; its re-publications while it fires
// (the same id, with captures, stacks or a Flight Recorder verdict added) are not new firings.
// A hang alert is held until it carries its hang stacks — its re-publication with them — or
// `evidence_wait` passed, whichever comes first: observe, collect evidence, then act.
//
// Each webhook call carries `X-Rankwatch-Signature: sha256=<hex HMAC-SHA256 of the body keyed
// with the shared secret>` and `X-Rankwatch-Delivery: <alert id>@<firing sequence>` (the same
// on every retry: a receiver dedupes on it). Failed calls are retried with exponential backoff,
// up to `max_attempts` rounds; an alert that resolves before its action was delivered cancels
// it. Dry run: the action is logged, nothing is called.
//
// Once per firing also means that a firing ends where the daemon stops tracking its alert
// without a resolve in this instance's log (AlertHub::Firing no longer lists it: its job moved to
// another instance, which resolves it there, or was evicted; another instance resolved a node
// alert): at most every `untracked_check`, such a firing is released — its record marked
// resolved and untracked, and a later firing of the alert here is a new one. An action still
// pending then is delivered first (the firing happened), and released once done.
//
// Durable: each action is an ActionRecord in the state store beside the alert log
// (state/outbound_state.h), written as it changes (pending, delivered, failed, dry run,
// cancelled, resolved), with the position in the alert log the policy has read up to; after a
// restart the policy reads on from there and finishes the pending actions (a crash between a
// call and its record may repeat the call: at least once). Configured for the first time, the
// policy starts at the newest alert.
//
// One thread of its own (Start); the ingest thread never waits for it. RunOnce is for tests
// that do not Start(); records() from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "alerting/alert_hub.h"
#include "alerting/alert_presentation.h"
#include "alerting/outbound_http.h"
#include "metrics/prometheus_registry.h"
#include "rankwatch/state/v1/outbound.pb.h"
#include "rankwatch/v1/service.pb.h"
#include "state/state_store.h"

namespace rankwatch {

// One rule of the policy: "KIND[:SEVERITY]=ACTION", e.g. "hang:critical=webhook",
// "straggler=webhook", "*:critical=webhook", "memory_creep=observe". KIND is an alert kind
// (AlertKindLabel) or `*`; SEVERITY (`info`, `warning`, `critical`) the least severity it takes;
// ACTION `observe` or `webhook`.
struct ActionRule {
  enum class Action { kObserve, kWebhook };
  std::string text;                                      // as configured
  v1::AlertKind kind = v1::ALERT_KIND_UNSPECIFIED;       // unspecified: any kind
  v1::Severity min_severity = v1::SEVERITY_UNSPECIFIED;  // unspecified: any severity
  Action action = Action::kObserve;
  bool Matches(const v1::Alert& alert) const;
};
absl::StatusOr<ActionRule> ParseActionRule(std::string_view text);

struct AlertActionsOptions {
  std::vector<ActionRule> rules;  // in order; the first that matches decides
  std::vector<std::string> webhooks;
  std::string secret_file;  // the HMAC key, read at each delivery (required with webhooks)
  bool dry_run = false;
  OutboundHttpOptions http;
  AlertPresentationOptions presentation;
  // A hang alert without its stacks waits this long for its re-publication with them. 0: acts
  // at once. Default: 30 s (the stacks' answer deadline is 10 s).
  std::chrono::milliseconds evidence_wait{30'000};
  int max_attempts = 8;                           // rounds of calls before an action fails for good
  std::chrono::milliseconds first_backoff{1000};  // doubled after each failed round ...
  std::chrono::milliseconds max_backoff{60'000};  // ... up to this
  std::chrono::milliseconds poll{100};            // how often the log is read
  uint64_t retention = 100'000;  // records kept: firings within this many sequences
  // How often firings are checked against what the daemon tracks (AlertHub::Firing).
  std::chrono::milliseconds untracked_check{1000};
};

// The JSON a webhook receives for `record` (its rule, delivery id) about `alert`: the labels
// and annotations of the Alertmanager push, and the whole alert with its evidence (hang stacks,
// Flight Recorder verdict, capture) as protobuf JSON (proto field names).
std::string ActionPayload(const v1::Alert& alert, const state::v1::ActionRecord& record,
                          const AlertPresentationOptions& presentation);

// The stored records as the gRPC service answers them (ListActions): of `training_job` (the
// first part of the alert id; "" every job), by firing sequence, the newest `max` at most.
absl::StatusOr<std::vector<v1::AlertAction>> StoredActions(const StateStore& store,
                                                           const std::string& training_job,
                                                           size_t max);

class AlertActions {
 public:
  using Persist = std::function<void(Checkpoint)>;

  // Reads the stored records and position (`store` may be null). `transport` makes the calls
  // (default: cpp-httplib's). Unreadable state is DataLoss; bad URLs InvalidArgument.
  static absl::StatusOr<std::unique_ptr<AlertActions>> Create(
      AlertActionsOptions options, const AlertHub* hub, const StateStore* store, Persist persist,
      PrometheusRegistry* registry, std::unique_ptr<HttpTransport> transport = nullptr);
  ~AlertActions();  // Stop()

  void Start();
  void Stop();
  // Reads the new alerts and delivers what is due at `now` (tests, without Start()).
  void RunOnce(std::chrono::steady_clock::time_point now, int64_t now_unix_ns);

  // The records of the firings still open or acted on since the start, by firing sequence.
  std::vector<state::v1::ActionRecord> records() const;

 private:
  struct Work {
    state::v1::ActionRecord record;
    std::shared_ptr<const v1::Alert> alert;                // the newest publication of the firing
    std::chrono::steady_clock::time_point ready_at{};      // when it may be sent
    std::chrono::steady_clock::time_point next_attempt{};  // after a failed round
    std::vector<bool> answered;                            // per webhook: answered 2xx
    std::string body;  // fixed at the first call: retries send the same bytes
    int rounds = 0;
    bool untracked = false;  // its firing ended elsewhere: released once its action is done
    bool done() const { return record.outcome() != state::v1::ActionRecord::PENDING; }
  };

  AlertActions(AlertActionsOptions options, const AlertHub* hub, Persist persist);
  // Applies one alert of the log; records changed go into `changed`.
  void Apply(const std::shared_ptr<const v1::Alert>& alert,
             std::chrono::steady_clock::time_point now, std::vector<uint64_t>* changed);
  bool NeedsEvidence(const v1::Alert& alert) const;
  // Releases the firings whose alert the hub no longer tracks (the log read to its end).
  void ReleaseUntracked();
  // Marks a finished action of a firing that ended elsewhere resolved; true when it was.
  static bool Untracked(Work& w);
  // Calls the webhooks (or logs, dry run) for `w`; true when its record changed.
  bool Deliver(Work& w, std::chrono::steady_clock::time_point now, int64_t now_unix_ns);
  void Finish(Work& w, state::v1::ActionRecord::Outcome outcome, int64_t now_unix_ns);

  const AlertActionsOptions options_;
  const AlertHub* const hub_;
  const Persist persist_;
  std::unique_ptr<HttpTransport> transport_;
  uint64_t cursor_ = 0;  // the action thread only
  struct Open {
    uint64_t firing_sequence = 0;
    std::string training_job;  // as the hub tracks its firing alerts ("" for node alerts)
  };
  std::map<std::string, Open> open_;                              // firing alert id -> its firing
  std::chrono::steady_clock::time_point next_untracked_check_{};  // the action thread only
  mutable std::mutex mu_;                                         // guards work_ against records()
  std::map<uint64_t, Work> work_;     // acted firings not resolved, by firing sequence
  MetricFamily* outcomes_ = nullptr;  // {kind, outcome}
  MetricCell* calls_failed_ = nullptr;
  MetricCell* pending_ = nullptr;
  DeliveryLoop loop_;
};

}  // namespace rankwatch
