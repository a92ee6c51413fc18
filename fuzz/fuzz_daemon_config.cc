// fuzz_daemon_config: a rankwatchd YAML config file through LoadDaemonConfigFile, which parses
// and checks every value through the settings table as rankwatchd reads it at start; then each
// setting's value printed and read back, as --help and the docs print the defaults.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "daemon/daemon_config.h"
#include "daemon/daemon_settings.h"
#include "fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto file = rankwatch::fuzz::ScratchDir() / "rankwatchd.yaml";
  rankwatch::fuzz::WriteFile(file, std::string_view(reinterpret_cast<const char*>(data), size));
  rankwatch::DaemonConfig config;
  if (!rankwatch::LoadDaemonConfigFile(file.string(), &config).ok()) return 0;
  RANKWATCH_FUZZ_CHECK(config.align_timeout.count() >= 0 && config.job_ttl.count() >= 0 &&
                       config.job_retention.count() >= 0 &&
                       config.checkpoint_interval.count() >= 0);
  for (const rankwatch::Setting& setting : rankwatch::DaemonSettings()) {
    if (setting.is_map) continue;
    rankwatch::DaemonConfig copy;
    RANKWATCH_FUZZ_CHECK(setting.set(setting.get(config), &copy).ok());
  }
  return 0;
}
