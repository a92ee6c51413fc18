// fuzz_msprof: an msprof timeline step_trace_<dev>_<model>_<iter>.json through
// ReadIterationTrace. The bytes after a line "@INFO@" (when present) are the device's
// info.json.<dev> beside it.
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <system_error>

#include "fuzz/fuzz_support.h"
#include "traces/iteration_trace.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const auto device = rankwatch::fuzz::ScratchDir() / "PROF_000001" / "device_0";
  const auto trace = device / "timeline" / "step_trace_0_1_1.json";
  const auto info = device / "info.json.0";
  constexpr std::string_view kInfo = "\n@INFO@\n";
  const size_t split = input.find(kInfo);
  rankwatch::fuzz::WriteFile(trace, input.substr(0, split));
  std::error_code ec;
  if (split == std::string_view::npos) {
    std::filesystem::remove(info, ec);
  } else {
    rankwatch::fuzz::WriteFile(info, input.substr(split + kInfo.size()));
  }
  auto read = rankwatch::ReadIterationTrace(trace);
  if (read.ok()) {
    RANKWATCH_FUZZ_CHECK(!read->steps.empty());
    for (size_t i = 1; i < read->steps.size(); ++i) {
      RANKWATCH_FUZZ_CHECK(static_cast<int64_t>(read->steps[i - 1].step()) <
                           static_cast<int64_t>(read->steps[i].step()));
    }
  }
  return 0;
}
