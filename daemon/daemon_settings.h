// The declaration table of rankwatchd's settings: one row per setting (setting.h), from which the
// command-line flags, the config file's keys, their checks, --help and the flag table of
// docs/operating.md come. Adding a setting is a DaemonConfig field with its default (a part's: a
// field of its options struct, parts/daemon_part.h) and one row in daemon_settings.cc.
//
// The table is built once, on first use, and is immutable after: safe from any thread.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "daemon/daemon_config.h"
#include "daemon/setting.h"

namespace rankwatch {

// A section of the config file: a map whose keys are settings ("section.key" rows).
struct SettingSection {
  std::string name;  // "step-diagnosis"
  std::string help;  // one line (markdown) for the docs
};

// Every setting, in the order --help and the docs list them: top-level keys first, then the
// sections' keys.
const std::vector<Setting>& DaemonSettings();

// The sections of the file, in order.
const std::vector<SettingSection>& DaemonSettingSections();

// The row of `key` ("window-steps", "memory-diagnosis.window-steps"), or nullptr.
const Setting* FindDaemonSetting(std::string_view key);

// Checks between settings, once the file and the flags are read (each value was checked on its
// own as it was read): e.g. a gRPC TLS key needs its certificate. The message names the
// settings.
absl::Status CheckDaemonConfig(const DaemonConfig& config);

// The flag table of docs/operating.md ("Flags and config file"), in markdown: the table of
// flags, then one table per section of the file. `rankwatchd --help-markdown` prints it, and
// daemon_settings_test checks the docs against it.
std::string DaemonSettingsMarkdown();

}  // namespace rankwatch
