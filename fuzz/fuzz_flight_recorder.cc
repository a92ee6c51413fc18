// fuzz_flight_recorder: a Flight Recorder dump through ParseFrDump (flight_recorder/
// fr_reader.h): the pickle form (first byte 0x80) through the safe pickle loader, the JSON form
// through simdjson, then the walk into an FrDump. Also pickle::Load directly: a loaded document
// is acyclic and within the depth limit (walked with a budget, shared nodes counted each time).
// A dump that parses is parsed again through a rank-list interner (the same groups), then
// analyzed as two ranks of a job (AnalyzeFlightRecorder, MatchCollectives, the reports).
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "flight_recorder/fr_analysis.h"
#include "flight_recorder/fr_reader.h"
#include "flight_recorder/fr_report.h"
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

  rankwatch::fr::FrRanksInterner interner;
  options.interner = &interner;
  auto shared = rankwatch::fr::ParseFrDump(bytes, options);
  RANKWATCH_FUZZ_CHECK(shared.ok());
  RANKWATCH_FUZZ_CHECK(shared->groups.size() == dump->groups.size());
  for (size_t i = 0; i < dump->groups.size(); ++i)
    RANKWATCH_FUZZ_CHECK(shared->groups[i].ranks == dump->groups[i].ranks);

  std::vector<rankwatch::fr::RankDump> job(2);
  for (uint32_t r = 0; r < 2; ++r) {
    job[r].rank = r;
    job[r].dump = r == 0 ? *dump : *shared;
    job[r].state = job[r].dump.entries.empty() ? rankwatch::fr::DumpState::kEmpty
                                               : rankwatch::fr::DumpState::kRead;
  }
  rankwatch::fr::FrAnalysisOptions analysis;
  analysis.world_size = 4;  // rank lists name whatever they like: bound the per-rank arrays
  const rankwatch::fr::FrVerdict v = rankwatch::fr::AnalyzeFlightRecorder(job, analysis);
  RANKWATCH_FUZZ_CHECK(v.ranks.size() == 4);
  for (const auto& c : v.culprits) RANKWATCH_FUZZ_CHECK(c.rank < 4);
  (void)rankwatch::fr::VerdictText(v, {});
  (void)rankwatch::fr::VerdictJson(v);
  (void)rankwatch::fr::CollectivesJson(rankwatch::fr::MatchCollectives(job));
  return 0;
}
