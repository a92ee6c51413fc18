#include "daemon/setting.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>

namespace rankwatch {
namespace {

std::string Lower(std::string_view text) {
  std::string out(text);
  for (char& ch : out) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return out;
}

}  // namespace

absl::StatusOr<bool> SettingValue<bool>::Parse(std::string_view text) {
  const std::string word = Lower(text);
  if (word == "true" || word == "yes" || word == "on" || word == "1") return true;
  if (word == "false" || word == "no" || word == "off" || word == "0") return false;
  return absl::InvalidArgumentError("'" + std::string(text) + "' is not true or false");
}

absl::StatusOr<int64_t> ParseInteger(std::string_view text, int64_t min, int64_t max) {
  int64_t value = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (text.empty() || ptr != end || ec == std::errc::invalid_argument) {
    return absl::InvalidArgumentError("'" + std::string(text) + "' is not a whole number");
  }
  if (ec == std::errc::result_out_of_range || value < min || value > max) {
    return absl::InvalidArgumentError("'" + std::string(text) + "' is out of range (" +
                                      std::to_string(min) + ".." + std::to_string(max) + ")");
  }
  return value;
}

absl::StatusOr<double> SettingValue<double>::Parse(std::string_view text) {
  const std::string copy(text);
  char* end = nullptr;
  const double value = std::strtod(copy.c_str(), &end);
  if (copy.empty() || end != copy.c_str() + copy.size() ||
      std::isspace(static_cast<unsigned char>(copy[0]))) {
    return absl::InvalidArgumentError("'" + copy + "' is not a number");
  }
  if (!std::isfinite(value)) return absl::InvalidArgumentError("'" + copy + "' is not finite");
  return value;
}

std::string SettingValue<double>::Format(double value) {
  char buffer[64];
  const auto [ptr, ec] = std::to_chars(buffer, buffer + sizeof(buffer), value);
  return std::string(buffer, ec == std::errc() ? ptr : buffer);
}

absl::StatusOr<Duration> SettingValue<Duration>::Parse(std::string_view text) {
  return ParseDuration(std::string(text));
}

std::string SettingValue<Duration>::Format(Duration value) {
  using namespace std::chrono;
  if (value == Duration::zero()) return "0s";
  if (value % hours(1) == Duration::zero()) return std::to_string(value / hours(1)) + "h";
  if (value % minutes(1) == Duration::zero()) return std::to_string(value / minutes(1)) + "m";
  if (value % seconds(1) == Duration::zero()) return std::to_string(value / seconds(1)) + "s";
  if (value % milliseconds(1) == Duration::zero()) {
    return std::to_string(value / milliseconds(1)) + "ms";
  }
  return SettingValue<double>::Format(duration<double>(value).count());
}

absl::StatusOr<std::vector<std::string>> SettingValue<std::vector<std::string>>::Parse(
    std::string_view text) {
  std::vector<std::string> items;
  size_t from = 0;
  while (from <= text.size()) {
    const size_t comma = std::min(text.find(',', from), text.size());
    std::string_view item = text.substr(from, comma - from);
    while (!item.empty() && std::isspace(static_cast<unsigned char>(item.front()))) {
      item.remove_prefix(1);
    }
    while (!item.empty() && std::isspace(static_cast<unsigned char>(item.back()))) {
      item.remove_suffix(1);
    }
    if (!item.empty()) items.emplace_back(item);
    from = comma + 1;
  }
  return items;
}

std::string SettingValue<std::vector<std::string>>::Format(const std::vector<std::string>& value) {
  std::string out;
  for (const std::string& item : value) out += (out.empty() ? "" : ",") + item;
  return out;
}

absl::StatusOr<ListenAddress> SettingValue<ListenAddress>::Parse(std::string_view text) {
  return ParseListenAddress(text);
}

std::string SettingValue<ListenAddress>::Format(const ListenAddress& value) {
  if (value.host.find(':') != std::string::npos) {
    return "[" + value.host + "]:" + std::to_string(value.port);
  }
  return value.ToString();
}

Setting DeclareMap(std::string key, KafkaProperties DaemonConfig::*field, std::string help) {
  Setting s;
  s.key = std::move(key);
  s.value_name = "MAP";
  s.help = std::move(help);
  s.is_map = true;
  s.set = [key = s.key](std::string_view, DaemonConfig*) {
    return absl::InvalidArgumentError(key + " is a map of names to values");
  };
  s.get = [](const DaemonConfig&) { return std::string(); };
  s.set_entry = [field](const std::string& name, const std::string& value, DaemonConfig* config) {
    if (name.empty()) return absl::InvalidArgumentError("an empty name");
    (config->*field)[name] = value;
    return absl::OkStatus();
  };
  return s;
}

}  // namespace rankwatch
