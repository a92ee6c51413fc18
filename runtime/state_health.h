// StateHealth: whether rankwatchd's durable state is still being written. The first storage
// error (a failed checkpoint, alert log write, changelog adoption or offset read) fails it for
// good: checkpoints stop, `rankwatch_state_healthy` goes to 0, the error is logged once, and
// `on_failure` runs once (the daemon turns gRPC health NOT_SERVING there) — while the last good
// diagnoses keep being served.
//
// Thread-safe: the checkpoint writer thread and the ingest thread both report failures.
#pragma once

#include <spdlog/spdlog.h>

#include <atomic>
#include <functional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "metrics/daemon_metrics.h"

namespace rankwatch {

class StateHealth {
 public:
  // `metrics` may be null; `on_failure` may be empty and must be thread-safe.
  StateHealth(DaemonMetrics* metrics, std::function<void(const absl::Status&)> on_failure)
      : metrics_(metrics), on_failure_(std::move(on_failure)) {}

  // Reports a storage error; only the first one has an effect.
  void Fail(const absl::Status& status) {
    if (failed_.exchange(true)) return;
    if (metrics_ != nullptr) {
      metrics_->state_errors->Add(1);
      metrics_->state_healthy->Set(0);
    }
    spdlog::error("state checkpoint failed, checkpoints stop and health is NOT_SERVING: {}",
                  std::string(status.message()));
    if (on_failure_) on_failure_(status);
  }

  bool failed() const { return failed_.load(); }

 private:
  DaemonMetrics* const metrics_;
  const std::function<void(const absl::Status&)> on_failure_;
  std::atomic<bool> failed_{false};
};

}  // namespace rankwatch
