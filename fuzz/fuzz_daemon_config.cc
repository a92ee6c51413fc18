// fuzz_daemon_config: a rankwatchd YAML config file through LoadDaemonConfigFile, then the
// duration settings through ParseDuration, as rankwatchd reads them at start.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "daemon/daemon_config.h"
#include "fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto file = rankwatch::fuzz::ScratchDir() / "rankwatchd.yaml";
  rankwatch::fuzz::WriteFile(file, std::string_view(reinterpret_cast<const char*>(data), size));
  rankwatch::DaemonConfig config;
  if (!rankwatch::LoadDaemonConfigFile(file.string(), &config).ok()) return 0;
  for (const std::string* d : {&config.align_timeout, &config.hang_timeout, &config.job_ttl,
                               &config.job_retention, &config.checkpoint_interval}) {
    auto parsed = rankwatch::ParseDuration(*d);
    if (parsed.ok()) RANKWATCH_FUZZ_CHECK(parsed->count() >= 0);
  }
  return 0;
}
