// fuzz_job_state: a damaged state store. The input's records (fuzz_support.h framing; flags
// bit 0: the `alerts` family, else `jobs`) are written into a StateStore, which is then read
// back as rankwatchd does when it starts: job_state::ReadJobs, JobPipeline::Restore of every
// job (metadata, aligner, memory trend, lost time and window steps) and a snapshot of it, the
// alert tracker's state, and the alert log. Whatever the bytes, the result is data or an
// error, never a crash.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz/fuzz_store.h"
#include "google/protobuf/stubs/logging.h"
#include "operators/alert_tracker.h"
#include "operators/job_pipeline.h"
#include "rankwatch/v1/service.pb.h"
#include "state/job_state_store.h"

namespace rankwatch {
namespace {

void RestoreAll(const std::vector<job_state::StoredJob>& jobs) {
  JobPipelineOptions options;
  options.record_changes = true;
  const TimePoint now{std::chrono::seconds(1000)};
  const int64_t wall_ns = 1'700'000'000'000'000'000;
  AlertTracker alerts;
  for (const job_state::StoredJob& job : jobs) {
    auto pipeline = JobPipeline::Restore(job.meta, job.steps, options, now, wall_ns);
    if (pipeline.ok()) {
      (void)(*pipeline)->Snapshot(now);
      (void)(*pipeline)->TakeCheckpoint(now, wall_ns);
    }
    if (job.alerts) alerts.RestoreJob(*job.alerts);
  }
}

}  // namespace
}  // namespace rankwatch

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // protobuf logs every string that is not UTF-8; that is the input, not news.
  static const bool quiet = (google::protobuf::SetLogHandler(nullptr), true);
  (void)quiet;
  using namespace rankwatch;
  // Never destroyed: RocksDB's own statics may be gone when exit() runs destructors.
  static fuzz::FuzzStore& fuzz_store = *new fuzz::FuzzStore;
  StateStore& store = fuzz_store.Fresh();
  Checkpoint c;
  fuzz::RecordReader reader(data, size);
  while (auto r = reader.Next()) {
    c.Put((r->flags & 1) ? StateFamily::kAlerts : StateFamily::kJobs, std::string(r->key),
          std::string(r->value));
  }
  RANKWATCH_FUZZ_CHECK(fuzz_store.Commit(c).ok());
  if (auto jobs = job_state::ReadJobs(store); jobs.ok()) RestoreAll(*jobs);
  if (auto jobs = job_state::ReadJobs(store, 0); jobs.ok()) RestoreAll(*jobs);
  (void)job_state::LastAlertSequence(store);
  (void)job_state::ScanAlerts(store, 0, [](uint64_t, std::string_view value) {
    v1::Alert alert;
    (void)alert.ParseFromArray(value.data(), static_cast<int>(value.size()));
    return true;
  });
  return 0;
}
