// Setting: one row of rankwatchd's declaration table (daemon_settings.cc): a setting's key, its
// help, how its text is parsed and checked, and the DaemonConfig field it sets. The command-line
// flags (daemon_command_line.h), the config file's keys (LoadDaemonConfigFile), their checks,
// --help and the flag table of docs/operating.md all come from these rows; a setting is declared
// nowhere else. Its default is the DaemonConfig field's initializer (or the operator option's),
// beside the field's documentation.
//
// A row is declared with Declare() and the checks it needs:
//
//   Declare("capture-steps", &DaemonConfig::capture_steps).Within(1, 100)
//       .Help("steps a capture profiles on each rank"),
//
// Rows are immutable once built and may be read from any thread.
#pragma once

#include <concepts>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/listen_address.h"
#include "daemon/daemon_config.h"
#include "operators/time.h"

namespace rankwatch {

struct Setting {
  // The config file key and, with two dashes before it, the flag: "window-steps". A key in a
  // section of the file is "section.key" ("step-diagnosis.min-steps") and has no flag.
  std::string key;
  std::string value_name;    // what the value is, for --help: "DURATION", "INT", ...
  std::string help;          // one line, for --help and the docs
  std::string details;       // markdown the docs add after `help`; may be empty
  std::string default_note;  // said instead of the default value where set, e.g. "embedded"
  bool is_map = false;       // a map of names to text (`kafka:`): file only, set by `set_entry`
  // A list (SettingValue<std::vector<std::string>>): the flag may be repeated and the file's key
  // may be a YAML list; `set` and `get` take the items joined with commas.
  bool is_list = false;

  // Parses and checks `text` and stores it in `config`. On an error `config` is unchanged and
  // the message says what is wrong with the value; the caller says where it came from.
  std::function<absl::Status(std::string_view text, DaemonConfig* config)> set;
  // `config`'s value as text that `set` accepts ("" for a map).
  std::function<std::string(const DaemonConfig& config)> get;
  // Map settings only: stores the entry `name` = `value`.
  std::function<absl::Status(const std::string& name, const std::string& value,
                             DaemonConfig* config)>
      set_entry;

  bool file_only() const { return is_map || key.find('.') != std::string::npos; }
  std::string flag() const { return "--" + key; }
  // The section of the file the key is in ("step-diagnosis"), or "" at the top level.
  std::string section() const {
    const size_t dot = key.find('.');
    return dot == std::string::npos ? "" : key.substr(0, dot);
  }
  // The default as --help shows it: the default's text, or "(default_note)".
  std::string DefaultText() const {
    return default_note.empty() ? get(DaemonConfig{}) : "(" + default_note + ")";
  }
};

// How a value of type T reads and prints. Parse accepts exactly what Format prints.
template <typename T>
struct SettingValue;

template <>
struct SettingValue<std::string> {
  static constexpr std::string_view kName = "TEXT";
  static absl::StatusOr<std::string> Parse(std::string_view text) { return std::string(text); }
  static std::string Format(const std::string& value) { return value; }
};

template <>
struct SettingValue<bool> {
  static constexpr std::string_view kName = "BOOL";
  // true, yes, on, 1 / false, no, off, 0, in any case.
  static absl::StatusOr<bool> Parse(std::string_view text);
  static std::string Format(bool value) { return value ? "true" : "false"; }
};

// A whole number within the type's range.
absl::StatusOr<int64_t> ParseInteger(std::string_view text, int64_t min, int64_t max);

template <typename Int>
requires(std::integral<Int> && !std::same_as<Int, bool> &&
         sizeof(Int) <= sizeof(int64_t)) struct SettingValue<Int> {
  static constexpr std::string_view kName = "INT";
  static absl::StatusOr<Int> Parse(std::string_view text) {
    constexpr int64_t kMax = sizeof(Int) < sizeof(int64_t) || std::is_signed_v<Int>
                                 ? static_cast<int64_t>(std::numeric_limits<Int>::max())
                                 : std::numeric_limits<int64_t>::max();
    auto parsed = ParseInteger(text, static_cast<int64_t>(std::numeric_limits<Int>::min()), kMax);
    if (!parsed.ok()) return parsed.status();
    return static_cast<Int>(*parsed);
  }
  static std::string Format(Int value) { return std::to_string(value); }
};

template <>
struct SettingValue<double> {
  static constexpr std::string_view kName = "NUMBER";
  static absl::StatusOr<double> Parse(std::string_view text);  // finite numbers only
  static std::string Format(double value);                     // the shortest exact text
};

template <>
struct SettingValue<Duration> {
  static constexpr std::string_view kName = "DURATION";
  static absl::StatusOr<Duration> Parse(std::string_view text);  // ParseDuration
  static std::string Format(Duration value);  // "250ms", "10s", "2m", "1h", or "1.5" seconds
};

template <>
struct SettingValue<ListenAddress> {
  static constexpr std::string_view kName = "HOST:PORT";
  static absl::StatusOr<ListenAddress> Parse(std::string_view text);  // ParseListenAddress
  static std::string Format(const ListenAddress& value);
};

// Lists: items separated by commas ("" is none; spaces around items are dropped). The flag is
// repeatable and the file's key takes a YAML list (Setting::is_list).
template <>
struct SettingValue<std::vector<std::string>> {
  static constexpr std::string_view kName = "LIST";
  static absl::StatusOr<std::vector<std::string>> Parse(std::string_view text);
  static std::string Format(const std::vector<std::string>& value);
};

// Optional values: "" is none.
template <typename T>
struct SettingValue<std::optional<T>> {
  static constexpr std::string_view kName = SettingValue<T>::kName;
  static absl::StatusOr<std::optional<T>> Parse(std::string_view text) {
    if (text.empty()) return std::optional<T>();
    auto parsed = SettingValue<T>::Parse(text);
    if (!parsed.ok()) return parsed.status();
    return std::optional<T>(*std::move(parsed));
  }
  static std::string Format(const std::optional<T>& value) {
    return value ? SettingValue<T>::Format(*value) : "";
  }
};

// What the checks of a setting of type T look at: T, or for an optional the value when present.
template <typename T>
struct CheckedValue {
  using type = T;
};
template <typename T>
struct CheckedValue<std::optional<T>> {
  using type = T;
};
// ... and for a list each item.
template <>
struct CheckedValue<std::vector<std::string>> {
  using type = std::string;
};

// A row being declared; converts to a Setting. `Access` returns the field given a DaemonConfig
// (const or not).
template <typename T, typename Access>
class SettingDeclaration {
 public:
  using Value = typename CheckedValue<T>::type;
  using Check = std::function<absl::Status(const Value&)>;

  SettingDeclaration(std::string key, Access access) : key_(std::move(key)), access_(access) {}

  SettingDeclaration& Help(std::string text) {
    help_ = std::move(text);
    return *this;
  }
  SettingDeclaration& Details(std::string markdown) {
    details_ = std::move(markdown);
    return *this;
  }
  SettingDeclaration& DefaultNote(std::string text) {
    default_note_ = std::move(text);
    return *this;
  }
  // The value must be within lo..hi (both included).
  SettingDeclaration& Within(Value lo, Value hi) {
    checks_.push_back([lo, hi](const Value& v) {
      if (v >= lo && v <= hi) return absl::OkStatus();
      return absl::InvalidArgumentError("must be within " + SettingValue<Value>::Format(lo) + ".." +
                                        SettingValue<Value>::Format(hi) + ", not " +
                                        SettingValue<Value>::Format(v));
    });
    return *this;
  }
  SettingDeclaration& AtLeast(Value lo) {
    checks_.push_back([lo](const Value& v) {
      if (v >= lo) return absl::OkStatus();
      return absl::InvalidArgumentError("must be at least " + SettingValue<Value>::Format(lo) +
                                        ", not " + SettingValue<Value>::Format(v));
    });
    return *this;
  }
  // Any other check; its message says what is wrong with the value.
  SettingDeclaration& Require(Check check) {
    checks_.push_back(std::move(check));
    return *this;
  }

  operator Setting() const {  // NOLINT(google-explicit-constructor): rows of the table
    Setting s;
    s.key = key_;
    s.value_name = std::string(SettingValue<T>::kName);
    s.help = help_;
    s.details = details_;
    s.default_note = default_note_;
    s.is_list = std::is_same_v<T, std::vector<std::string>>;
    s.set = [access = access_, checks = checks_](std::string_view text,
                                                 DaemonConfig* config) -> absl::Status {
      auto parsed = SettingValue<T>::Parse(text);
      if (!parsed.ok()) return parsed.status();
      for (const Check& check : checks) {
        absl::Status s = absl::OkStatus();
        if constexpr (std::is_same_v<T, Value>) {
          s = check(*parsed);
        } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
          for (const std::string& item : *parsed) {
            if (s = check(item); !s.ok()) break;
          }
        } else if (parsed->has_value()) {
          s = check(**parsed);
        }
        if (!s.ok()) return s;
      }
      access(*config) = *std::move(parsed);
      return absl::OkStatus();
    };
    s.get = [access = access_](const DaemonConfig& config) {
      return SettingValue<T>::Format(access(config));
    };
    return s;
  }

 private:
  std::string key_;
  Access access_;
  std::string help_;
  std::string details_;
  std::string default_note_;
  std::vector<Check> checks_;
};

// Declares the setting `key` of the DaemonConfig field `field`.
template <typename T>
auto Declare(std::string key, T DaemonConfig::*field) {
  auto access = [field](auto& config) -> auto& { return config.*field; };
  return SettingDeclaration<T, decltype(access)>(std::move(key), access);
}

// Declares the setting `key` of the field `field` of the options struct `section` of DaemonConfig
// (the operators' options: StepDiagnosisOptions, ...; the parts' own: FleetPartOptions, ...).
template <typename Section, typename T>
auto Declare(std::string key, Section DaemonConfig::*section, T Section::*field) {
  auto access = [ section, field ](auto& config) -> auto& { return (config.*section).*field; };
  return SettingDeclaration<T, decltype(access)>(std::move(key), access);
}

// Declares a map setting (file only): every entry of the file's map under `key` is stored.
Setting DeclareMap(std::string key, KafkaProperties DaemonConfig::*field, std::string help);

}  // namespace rankwatch
