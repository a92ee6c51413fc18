#include "common/logging.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

namespace rankwatch {

bool SetupLogging(const std::string& level) {
  static auto logger = spdlog::stderr_color_mt("rankwatch");
  spdlog::set_default_logger(logger);
  spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ %v");
  const auto parsed = spdlog::level::from_str(level);
  const bool known = parsed != spdlog::level::off || level == "off";
  spdlog::set_level(known ? parsed : spdlog::level::info);
  return known;
}

}  // namespace rankwatch
