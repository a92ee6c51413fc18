// fuzz_whatif_trace: a what-if study Chrome trace through ParseWhatifChromeTrace, and every
// step it yields through the what-if analyzer (AddStep, then Window): the reader and the
// analyzer's checks of its input. The bytes before a line "@TRACE@" (when present) are the
// meta yaml beside the trace.
#include <simdjson.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "fuzz/fuzz_support.h"
#include "operators/whatif/whatif.h"
#include "traces/whatif_chrome_trace.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  constexpr std::string_view kTrace = "\n@TRACE@\n";
  const size_t split = input.find(kTrace);
  const std::string_view meta = split == std::string_view::npos ? "" : input.substr(0, split);
  const std::string_view json =
      split == std::string_view::npos ? input : input.substr(split + kTrace.size());
  const simdjson::padded_string padded(json);
  auto trace = rankwatch::ParseWhatifChromeTrace(std::string_view(padded.data(), padded.size()),
                                                 meta, "timeline-fuzz.json");
  if (!trace.ok()) return 0;
  const rankwatch::whatif::Layout layout = trace->layout;
  rankwatch::whatif::Analyzer analyzer(layout, {});
  for (auto& step : trace->steps) {
    RANKWATCH_FUZZ_CHECK(step.workers.size() == layout.workers());
    for (const auto& ops : step.workers) {
      RANKWATCH_FUZZ_CHECK(!ops.empty());
      for (size_t i = 1; i < ops.size(); ++i) {
        RANKWATCH_FUZZ_CHECK(ops[i - 1].start_us <= ops[i].start_us);
      }
    }
    (void)analyzer.AddStep(std::move(step));
  }
  const auto r = analyzer.Window();
  RANKWATCH_FUZZ_CHECK(r.steps == analyzer.steps());
  if (r.steps > 0) RANKWATCH_FUZZ_CHECK(!std::isnan(r.actual_us) && !std::isnan(r.ideal_us));
  return 0;
}
