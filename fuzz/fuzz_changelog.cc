// fuzz_changelog: a hostile state changelog partition. The input's records (fuzz_support.h
// framing; flags bit 0: a null value) are the Kafka messages' keys and values, read in order
// by ChangelogReader; the state it yields is then adopted as rankwatchd does (committed to the
// StateStore with the partition's offset) and read back (offsets, jobs).
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "fuzz/fuzz_store.h"
#include "google/protobuf/stubs/logging.h"
#include "state/job_state_store.h"
#include "state/state_changelog.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // protobuf logs every string that is not UTF-8; that is the input, not news.
  static const bool quiet = (google::protobuf::SetLogHandler(nullptr), true);
  (void)quiet;
  using namespace rankwatch;
  // Never destroyed: RocksDB's own statics may be gone when exit() runs destructors.
  static fuzz::FuzzStore& fuzz_store = *new fuzz::FuzzStore;
  ChangelogReader reader;
  fuzz::RecordReader records(data, size);
  while (auto r = records.Next()) {
    reader.Add(r->key, (r->flags & 1) ? std::nullopt : std::optional<std::string_view>(r->value));
  }
  const ChangelogPartition& state = reader.state();
  if (!state.present) return 0;
  StateStore& store = fuzz_store.Fresh();
  Checkpoint c;  // TaskManager::Adopt
  for (const auto& [key, value] : state.values) {
    RANKWATCH_FUZZ_CHECK(static_cast<int>(key.first) < kStateFamilyCount);
    c.Put(key.first, key.second, value);
  }
  c.SetOffset("telemetry", 0, state.next_offset);
  RANKWATCH_FUZZ_CHECK(fuzz_store.Commit(c).ok());
  (void)store.Offsets();
  (void)job_state::ReadJobs(store, 0);
  return 0;
}
