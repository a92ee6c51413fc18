// fuzz_kineto: a Kineto trace file's bytes, plain JSON or gzip (detected by magic, as the
// reader does), through ReadKinetoTrace (streamed, 4 MiB pieces), TraceFileBuffer::Read and
// ParseKinetoTrace, and the same JSON fed in small pieces: the result must not depend on where
// the pieces end.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "fuzz/fuzz_support.h"
#include "traces/kineto_trace_reader.h"
#include "traces/trace_file_buffer.h"

using rankwatch::fuzz::ScratchDir;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto file = ScratchDir() / "trace.json";
  rankwatch::fuzz::WriteFile(file, std::string_view(reinterpret_cast<const char*>(data), size));
  auto streamed = rankwatch::ReadKinetoTrace(file);
  if (streamed.ok()) {
    for (const auto& e : streamed->events) (void)streamed->str(e.name);
  }
  auto buffer = rankwatch::TraceFileBuffer::Read(file);
  if (!buffer.ok()) return 0;
  auto whole = rankwatch::ParseKinetoTrace(buffer->view(), file);
  const size_t piece = 1 + size % 1021;
  auto pieces = rankwatch::ParseKinetoTraceInPieces(buffer->view(), piece, file);
  RANKWATCH_FUZZ_CHECK(whole.ok() == pieces.ok());
  if (whole.ok()) {
    RANKWATCH_FUZZ_CHECK(whole->events.size() == pieces->events.size());
    RANKWATCH_FUZZ_CHECK(whole->raw_events == pieces->raw_events);
    RANKWATCH_FUZZ_CHECK(whole->strings == pieces->strings);
    RANKWATCH_FUZZ_CHECK(whole->json_rank == pieces->json_rank);
    RANKWATCH_FUZZ_CHECK(whole->hta_rank == pieces->hta_rank);
    for (size_t i = 0; i < whole->events.size(); ++i) {
      RANKWATCH_FUZZ_CHECK(whole->events[i].ts_ns == pieces->events[i].ts_ns);
      RANKWATCH_FUZZ_CHECK(whole->events[i].dur_ns == pieces->events[i].dur_ns);
      RANKWATCH_FUZZ_CHECK(whole->events[i].name < whole->strings.size());
      RANKWATCH_FUZZ_CHECK(whole->events[i].category < whole->strings.size());
    }
  }
  return 0;
}
