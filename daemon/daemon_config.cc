#include "daemon/daemon_config.h"

#include <yaml-cpp/yaml.h>

#include <cctype>
#include <cmath>
#include <cstdlib>

#include "daemon/daemon_settings.h"

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

namespace {

// The text of a single value: a scalar, or "" for a key without one (`key:`).
absl::StatusOr<std::string> ScalarText(const YAML::Node& node) {
  if (node.IsNull()) return std::string();
  if (node.IsScalar()) return node.Scalar();
  return absl::InvalidArgumentError("must be a single value, not a map or a list");
}

// A YAML list's items as a list setting's text: joined with commas.
absl::StatusOr<std::string> ListText(const YAML::Node& node) {
  std::string text;
  for (const auto& item : node) {
    auto one = ScalarText(item);
    if (!one.ok()) return one.status();
    if (one->find(',') != std::string::npos) {
      return absl::InvalidArgumentError("a list item may not hold a comma: '" + *one + "'");
    }
    text += (text.empty() ? "" : ",") + *one;
  }
  return text;
}

absl::StatusOr<std::string> KeyText(const YAML::Node& node) {
  if (node.IsScalar()) return node.Scalar();
  return absl::InvalidArgumentError("a key that is not a name (a map or a list)");
}

// Applies the value `node` of the setting `key`; errors say what is wrong, naming the key.
absl::Status Apply(const std::string& key, const YAML::Node& node, DaemonConfig* config) {
  const Setting* setting = FindDaemonSetting(key);
  if (setting == nullptr) return absl::InvalidArgumentError("unknown key '" + key + "'");
  if (setting->is_map) {
    if (!node.IsMap()) return absl::InvalidArgumentError("key '" + key + "': must be a map");
    for (const auto& kv : node) {
      auto name = KeyText(kv.first);
      auto value = ScalarText(kv.second);
      absl::Status s = !name.ok()    ? name.status()
                       : !value.ok() ? value.status()
                                     : setting->set_entry(*name, *value, config);
      if (!s.ok())
        return absl::InvalidArgumentError("key '" + key + "': " + std::string(s.message()));
    }
    return absl::OkStatus();
  }
  auto text = setting->is_list && node.IsSequence() ? ListText(node) : ScalarText(node);
  absl::Status s = text.ok() ? setting->set(*text, config) : text.status();
  if (!s.ok()) return absl::InvalidArgumentError("key '" + key + "': " + std::string(s.message()));
  return absl::OkStatus();
}

bool IsSection(const std::string& name) {
  for (const SettingSection& section : DaemonSettingSections()) {
    if (section.name == name) return true;
  }
  return false;
}

absl::Status ApplyRoot(const YAML::Node& root, DaemonConfig* config) {
  for (const auto& kv : root) {
    auto key = KeyText(kv.first);
    if (!key.ok()) return key.status();
    if (!IsSection(*key)) {
      if (absl::Status s = Apply(*key, kv.second, config); !s.ok()) return s;
      continue;
    }
    if (!kv.second.IsMap()) return absl::InvalidArgumentError("key '" + *key + "': must be a map");
    for (const auto& entry : kv.second) {
      auto name = KeyText(entry.first);
      if (!name.ok()) return name.status();
      if (absl::Status s = Apply(*key + "." + *name, entry.second, config); !s.ok()) return s;
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status LoadDaemonConfigFile(const std::string& path, DaemonConfig* config) {
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError("config " + path + ": " + e.what());
  }
  if (root.IsNull()) return absl::OkStatus();
  if (!root.IsMap()) return absl::InvalidArgumentError("config " + path + ": not a YAML map");
  // The file is applied to a copy: on an error `config` is left as it was.
  DaemonConfig loaded = *config;
  absl::Status s;
  try {
    s = ApplyRoot(root, &loaded);
  } catch (const YAML::Exception& e) {
    s = absl::InvalidArgumentError(e.what());
  }
  if (!s.ok()) {
    return absl::InvalidArgumentError("config " + path + ": " + std::string(s.message()));
  }
  *config = std::move(loaded);
  return absl::OkStatus();
}

}  // namespace rankwatch
