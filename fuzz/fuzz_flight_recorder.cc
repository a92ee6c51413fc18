// fuzz_flight_recorder: a Flight Recorder dump through ParseFrDump (flight_recorder/
// fr_reader.h): the pickle form (first byte 0x80) through the safe pickle loader, the JSON form
// through simdjson, then the walk into an FrDump. Also pickle::Load directly: a loaded document
// is acyclic and within the depth limit (walked with a budget, shared nodes counted each time).
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "flight_recorder/fr_reader.h"
#include "flight_recorder/safe_pickle.h"
#include "fuzz/fuzz_support.h"

namespace {

// The depth of `v`, walking at most `*budget` nodes; -1 when the budget ran out.
int Depth(const rankwatch::fr::pickle::Value& v, size_t* budget, int limit) {
  RANKWATCH_FUZZ_CHECK(limit >= 1);  // deeper than the loader's limit: a bug
  if (*budget == 0) return -1;
  --*budget;
  int depth = 1;
  for (const auto* item : v.items()) {
    const int d = Depth(*item, budget, limit - 1);
    if (d < 0) return -1;
    if (d + 1 > depth) depth = d + 1;
  }
  return depth;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);

  rankwatch::fr::pickle::PickleLimits limits;
  limits.max_depth = 32;
  limits.max_values = 1 << 20;
  auto doc = rankwatch::fr::pickle::Load(bytes, limits);
  if (doc.ok()) {
    size_t budget = 100000;
    (void)Depth(doc->root(), &budget, static_cast<int>(limits.max_depth));
    RANKWATCH_FUZZ_CHECK(doc->values() <= limits.max_values);
  }

  rankwatch::fr::FrReadOptions options;
  options.max_entries = 4096;
  options.max_frames = 8;
  options.max_values = 1 << 20;
  options.max_expanded_bytes = 64 << 20;
  auto dump = rankwatch::fr::ParseFrDump(bytes, options);
  if (!dump.ok()) {
    RANKWATCH_FUZZ_CHECK(!dump.status().message().empty());
    return 0;
  }
  RANKWATCH_FUZZ_CHECK(dump->entries.size() <= options.max_entries);
  for (const auto& e : dump->entries) {
    RANKWATCH_FUZZ_CHECK(e.frames.size() <= options.max_frames);
    RANKWATCH_FUZZ_CHECK(e.time_started_ns != 0 && e.time_completed_ns != 0);
    (void)rankwatch::fr::FrStateName(e.state);
  }
  return 0;
}
