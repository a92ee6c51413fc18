// fuzz_ascend_csv: the Ascend iteration-trace CSV files through ReadIterationTrace. The first
// byte picks the format: 'T' a torch_npu rank0_ascend_pt/ASCEND_PROFILER_OUTPUT/
// step_trace_time.csv, anything else a MindSpore step_trace_raw_0_detail_time.csv; the rest is
// the file.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "fuzz/fuzz_support.h"
#include "traces/iteration_trace.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view csv(reinterpret_cast<const char*>(data) + 1, size - 1);
  const auto dir = rankwatch::fuzz::ScratchDir();
  const auto file = data[0] == 'T'
                        ? dir / "rank0_ascend_pt" / "ASCEND_PROFILER_OUTPUT" / "step_trace_time.csv"
                        : dir / "step_trace_raw_0_detail_time.csv";
  rankwatch::fuzz::WriteFile(file, csv);
  auto read = rankwatch::ReadIterationTrace(file);
  if (read.ok()) RANKWATCH_FUZZ_CHECK(!read->steps.empty());
  return 0;
}
