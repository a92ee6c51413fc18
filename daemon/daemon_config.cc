#include "daemon/daemon_config.h"

#include <yaml-cpp/yaml.h>

#include <cctype>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>

namespace rankwatch {

absl::StatusOr<Duration> ParseDuration(const std::string& text) {
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  const std::string unit(end);
  double seconds = 0;
  if (end == text.c_str() || !std::isfinite(value) || value < 0) {
    return absl::InvalidArgumentError("bad duration '" + text + "'");
  } else if (unit.empty() || unit == "s") {
    seconds = value;
  } else if (unit == "ms") {
    seconds = value / 1000;
  } else if (unit == "m") {
    seconds = value * 60;
  } else if (unit == "h") {
    seconds = value * 3600;
  } else {
    return absl::InvalidArgumentError("bad duration unit in '" + text + "' (ms, s, m, h)");
  }
  // Durations are int64 nanoseconds: about 292 years at most.
  if (seconds > 9e9) return absl::InvalidArgumentError("duration '" + text + "' is too long");
  return std::chrono::duration_cast<Duration>(std::chrono::duration<double>(seconds));
}

std::string DefaultInstanceId(std::string_view host, std::string_view state_dir) {
  uint64_t hash = 14695981039346656037ull;  // FNV-1a, 64 bits: stable across builds
  for (unsigned char ch : state_dir) {
    hash ^= ch;
    hash *= 1099511628211ull;
  }
  std::string id = "rankwatchd-";
  for (char ch : host.empty() ? std::string_view("unknown-host") : host) {
    const bool allowed =
        std::isalnum(static_cast<unsigned char>(ch)) || ch == '.' || ch == '_' || ch == '-';
    id += allowed ? ch : '_';
  }
  char suffix[16];
  std::snprintf(suffix, sizeof(suffix), "-%08x", static_cast<uint32_t>(hash ^ (hash >> 32)));
  return id + suffix;
}

namespace {

using Setter = std::function<void(const YAML::Node&)>;

// Applies the keys of a YAML map section through `setters`; an unknown key throws.
void ApplySection(const YAML::Node& section, const std::string& name,
                  const std::map<std::string, Setter>& setters) {
  if (!section.IsMap()) throw YAML::Exception(section.Mark(), name + " must be a map");
  for (const auto& kv : section) {
    const std::string key = kv.first.as<std::string>();
    auto it = setters.find(key);
    if (it == setters.end())
      throw YAML::Exception(kv.first.Mark(), "unknown key " + name + "." + key);
    it->second(kv.second);
  }
}

std::map<std::string, Setter> StepDiagnosisSetters(StepDiagnosisOptions* o) {
  auto d = [](double* field) { return [field](const YAML::Node& n) { *field = n.as<double>(); }; };
  return {
      {"min-steps", [o](const YAML::Node& n) { o->min_steps = n.as<uint32_t>(); }},
      {"straggler-warn", d(&o->straggler_warn)},
      {"straggler-crit", d(&o->straggler_crit)},
      {"input-share-warn", d(&o->input_share_warn)},
      {"input-share-crit", d(&o->input_share_crit)},
      {"wait-share-warn", d(&o->wait_share_warn)},
      {"wait-share-crit", d(&o->wait_share_crit)},
      {"compute-share-warn", d(&o->compute_share_warn)},
      {"compute-share-crit", d(&o->compute_share_crit)},
      {"bound-max-skew", d(&o->bound_max_skew)},
      {"onset-steps", [o](const YAML::Node& n) { o->onset_steps = n.as<uint32_t>(); }},
      {"sync-max-step-skew", d(&o->sync_max_step_skew)},
      {"node-fraction", d(&o->node_fraction)},
      {"hang-timeout-steps", d(&o->hang_timeout_steps)},
  };
}

std::map<std::string, Setter> MemoryDiagnosisSetters(DaemonConfig* c) {
  MemoryDiagnosisOptions* o = &c->memory_diagnosis;
  auto d = [](double* field) { return [field](const YAML::Node& n) { *field = n.as<double>(); }; };
  return {
      {"window-steps", [c](const YAML::Node& n) { c->memory_window_steps = n.as<int>(); }},
      {"min-steps", [o](const YAML::Node& n) { o->min_steps = n.as<uint32_t>(); }},
      {"pressure-warn", d(&o->pressure_warn)},
      {"pressure-crit", d(&o->pressure_crit)},
      {"imbalance-warn", d(&o->imbalance_warn)},
      {"imbalance-crit", d(&o->imbalance_crit)},
      {"imbalance-min-pressure", d(&o->imbalance_min_pressure)},
      {"trend", [o](const YAML::Node& n) { o->trend = n.as<bool>(); }},
      {"trend-min-steps", [o](const YAML::Node& n) { o->trend_min_steps = n.as<uint32_t>(); }},
      {"trend-min-points", [o](const YAML::Node& n) { o->trend_min_points = n.as<uint32_t>(); }},
      {"trend-steady-ratio", d(&o->trend_steady_ratio)},
      {"trend-noise", d(&o->trend_noise)},
      {"trend-min-growth-bytes", d(&o->trend_min_growth_bytes)},
      {"trend-early-growth", d(&o->trend_early_growth)},
      {"trend-confirmed-growth", d(&o->trend_confirmed_growth)},
      {"trend-last-half", [o](const YAML::Node& n) { o->trend_last_half = n.as<bool>(); }},
  };
}

}  // namespace

absl::Status LoadDaemonConfigFile(const std::string& path, DaemonConfig* c) {
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError("config " + path + ": " + e.what());
  }
  if (root.IsNull()) return absl::OkStatus();
  if (!root.IsMap()) return absl::InvalidArgumentError("config " + path + ": not a YAML map");

  const std::map<std::string, Setter> setters = {
      {"brokers", [&](const YAML::Node& n) { c->brokers = n.as<std::string>(); }},
      {"topic", [&](const YAML::Node& n) { c->topic = n.as<std::string>(); }},
      {"group", [&](const YAML::Node& n) { c->group = n.as<std::string>(); }},
      {"state-dir", [&](const YAML::Node& n) { c->state_dir = n.as<std::string>(); }},
      {"metrics-listen", [&](const YAML::Node& n) { c->metrics_listen = n.as<std::string>(); }},
      {"grpc-listen", [&](const YAML::Node& n) { c->grpc_listen = n.as<std::string>(); }},
      {"ui-listen", [&](const YAML::Node& n) { c->ui_listen = n.as<std::string>(); }},
      {"embedded-partitions", [&](const YAML::Node& n) { c->embedded_partitions = n.as<int>(); }},
      {"window-steps", [&](const YAML::Node& n) { c->window_steps = n.as<int>(); }},
      {"align-timeout", [&](const YAML::Node& n) { c->align_timeout = n.as<std::string>(); }},
      {"hang-timeout", [&](const YAML::Node& n) { c->hang_timeout = n.as<std::string>(); }},
      {"job-ttl", [&](const YAML::Node& n) { c->job_ttl = n.as<std::string>(); }},
      {"job-retention", [&](const YAML::Node& n) { c->job_retention = n.as<std::string>(); }},
      {"checkpoint-interval",
       [&](const YAML::Node& n) { c->checkpoint_interval = n.as<std::string>(); }},
      {"checkpoint-budget-mib",
       [&](const YAML::Node& n) { c->checkpoint_budget_mib = n.as<int>(); }},
      {"changelog-topic", [&](const YAML::Node& n) { c->changelog_topic = n.as<std::string>(); }},
      {"control-topic", [&](const YAML::Node& n) { c->control_topic = n.as<std::string>(); }},
      {"auto-capture", [&](const YAML::Node& n) { c->auto_capture = n.as<bool>(); }},
      {"capture-steps", [&](const YAML::Node& n) { c->capture_steps = n.as<int>(); }},
      {"capture-interval", [&](const YAML::Node& n) { c->capture_interval = n.as<std::string>(); }},
      {"capture-deadline", [&](const YAML::Node& n) { c->capture_deadline = n.as<std::string>(); }},
      {"hang-stacks", [&](const YAML::Node& n) { c->hang_stacks = n.as<bool>(); }},
      {"grpc-tls-cert", [&](const YAML::Node& n) { c->grpc_tls_cert = n.as<std::string>(); }},
      {"grpc-tls-key", [&](const YAML::Node& n) { c->grpc_tls_key = n.as<std::string>(); }},
      {"grpc-tls-client-ca",
       [&](const YAML::Node& n) { c->grpc_tls_client_ca = n.as<std::string>(); }},
      {"alert-subscriber-queue",
       [&](const YAML::Node& n) { c->alert_subscriber_queue = n.as<int>(); }},
      {"max-jobs", [&](const YAML::Node& n) { c->max_jobs = n.as<int64_t>(); }},
      {"max-ranks", [&](const YAML::Node& n) { c->max_ranks = n.as<int64_t>(); }},
      {"log-level", [&](const YAML::Node& n) { c->log_level = n.as<std::string>(); }},
      {"instance-id", [&](const YAML::Node& n) { c->instance_id = n.as<std::string>(); }},
      {"session-timeout", [&](const YAML::Node& n) { c->session_timeout = n.as<std::string>(); }},
      {"kafka",
       [&](const YAML::Node& n) {
         if (!n.IsMap()) throw YAML::Exception(n.Mark(), "kafka must be a map");
         for (const auto& kv : n)
           c->kafka[kv.first.as<std::string>()] = kv.second.as<std::string>();
       }},
      {"step-diagnosis",
       [&](const YAML::Node& n) {
         ApplySection(n, "step-diagnosis", StepDiagnosisSetters(&c->step_diagnosis));
       }},
      {"memory-diagnosis",
       [&](const YAML::Node& n) {
         ApplySection(n, "memory-diagnosis", MemoryDiagnosisSetters(c));
       }},
  };
  for (const auto& kv : root) {
    std::string key;
    try {
      key = kv.first.as<std::string>();  // a key that is a map or a list is not a string
    } catch (const YAML::Exception& e) {
      return absl::InvalidArgumentError("config " + path +
                                        ": a key that is not a name: " + e.what());
    }
    auto it = setters.find(key);
    if (it == setters.end()) {
      return absl::InvalidArgumentError("config " + path + ": unknown key '" + key + "'");
    }
    try {
      it->second(kv.second);
    } catch (const YAML::Exception& e) {
      return absl::InvalidArgumentError("config " + path + ": key '" + key + "': " + e.what());
    }
  }
  return absl::OkStatus();
}

}  // namespace rankwatch
