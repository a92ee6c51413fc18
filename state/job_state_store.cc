#include "state/job_state_store.h"

#include <functional>

#include <memory>
#include <utility>

namespace rankwatch::job_state {
namespace {

constexpr char kMetaPrefix = 'm';
constexpr char kStepPrefix = 's';
constexpr char kAlertsPrefix = 'a';
constexpr char kWhatIfPrefix = 'w';

void AppendBigEndian(uint64_t v, std::string* out) {
  for (int shift = 56; shift >= 0; shift -= 8)
    out->push_back(static_cast<char>((v >> shift) & 0xff));
}

uint64_t ReadBigEndian(std::string_view bytes) {
  uint64_t v = 0;
  for (size_t i = 0; i < 8 && i < bytes.size(); ++i) v = (v << 8) | static_cast<uint8_t>(bytes[i]);
  return v;
}

std::string MetaKey(const std::string& job) { return kMetaPrefix + job; }
std::string AlertsKey(const std::string& job) { return kAlertsPrefix + job; }
std::string StepPrefix(const std::string& job) { return kStepPrefix + job + '\0'; }
std::string StepKey(const std::string& job, uint64_t step) {
  std::string key = StepPrefix(job);
  AppendBigEndian(step, &key);
  return key;
}
std::string WhatIfPrefix(const std::string& job) { return kWhatIfPrefix + job + '\0'; }
std::string WhatIfKey(const std::string& job, uint64_t step) {
  std::string key = WhatIfPrefix(job);
  AppendBigEndian(step, &key);
  return key;
}
std::string AlertKey(uint64_t sequence) {
  std::string key;
  AppendBigEndian(sequence, &key);
  return key;
}

// A stored value that the checkpoint writer serialises (off the thread that collects it).
template <typename Message>
class DeferredMessage : public DeferredValue {
 public:
  DeferredMessage(Message message, size_t estimated_bytes)
      : message_(std::move(message)), estimated_bytes_(estimated_bytes) {}
  void SerializeTo(std::string* out) const override { message_.SerializeToString(out); }
  size_t EstimatedBytes() const override { return estimated_bytes_; }

 private:
  const Message message_;
  const size_t estimated_bytes_;
};

// Reads the metadata of every stored job `accept` selects.
absl::StatusOr<std::vector<state::v1::JobMeta>> ReadMetas(
    const StateStore& store, const std::function<bool(const state::v1::JobMeta&)>& accept) {
  std::vector<state::v1::JobMeta> metas;
  absl::Status bad;
  absl::Status s = store.ForEach(StateFamily::kJobs, std::string_view(&kMetaPrefix, 1),
                                 [&](std::string_view, std::string_view v) {
                                   state::v1::JobMeta meta;
                                   if (!meta.ParseFromArray(v.data(), static_cast<int>(v.size()))) {
                                     bad = absl::DataLossError("unreadable stored job metadata");
                                     return;
                                   }
                                   if (accept(meta)) metas.push_back(std::move(meta));
                                 });
  if (!s.ok()) return s;
  if (!bad.ok()) return bad;
  return metas;
}

bool InPartition(const state::v1::JobMeta& meta, int32_t partition) {
  return meta.has_kafka_partition() && meta.kafka_partition() == partition;
}

}  // namespace

void PutJob(const std::string& job, state::v1::JobMeta meta,
            std::vector<state::v1::StoredStep> new_steps, uint64_t keep_from_step,
            Checkpoint* out) {
  const size_t meta_bytes = meta.ByteSizeLong();
  out->PutDeferred(
      StateFamily::kJobs, MetaKey(job),
      std::make_shared<DeferredMessage<state::v1::JobMeta>>(std::move(meta), meta_bytes));
  // Steps of one job are about the same size: one measured step estimates them all.
  const size_t step_bytes = new_steps.empty() ? 0 : new_steps.front().ByteSizeLong();
  for (state::v1::StoredStep& step : new_steps) {
    std::string key = StepKey(job, step.step());
    out->PutDeferred(
        StateFamily::kJobs, std::move(key),
        std::make_shared<DeferredMessage<state::v1::StoredStep>>(std::move(step), step_bytes));
  }
  out->DeleteRange(StateFamily::kJobs, StepKey(job, 0), StepKey(job, keep_from_step));
}

void PutWhatIfSteps(const std::string& job, std::vector<state::v1::WhatIfStepOps> new_steps,
                    uint64_t keep_from_step, Checkpoint* out) {
  // The steps of a window are about the same size: one measured step estimates them all.
  const size_t step_bytes = new_steps.empty() ? 0 : new_steps.front().ByteSizeLong();
  for (state::v1::WhatIfStepOps& step : new_steps) {
    std::string key = WhatIfKey(job, step.step());
    out->PutDeferred(
        StateFamily::kJobs, std::move(key),
        std::make_shared<DeferredMessage<state::v1::WhatIfStepOps>>(std::move(step), step_bytes));
  }
  if (keep_from_step > 0) {
    out->DeleteRange(StateFamily::kJobs, WhatIfKey(job, 0), WhatIfKey(job, keep_from_step));
  }
}

void PutJobAlerts(const std::string& job, const state::v1::AlertTrackerState& alerts,
                  Checkpoint* out) {
  out->Put(StateFamily::kJobs, AlertsKey(job), alerts.SerializeAsString());
}

void DeleteJob(const std::string& job, Checkpoint* out) {
  out->Delete(StateFamily::kJobs, MetaKey(job));
  out->Delete(StateFamily::kJobs, AlertsKey(job));
  out->DeleteRange(StateFamily::kJobs, StepKey(job, 0), StepKey(job, UINT64_MAX));
  out->DeleteRange(StateFamily::kJobs, WhatIfKey(job, 0), WhatIfKey(job, UINT64_MAX));
}

absl::StatusOr<std::vector<StoredJob>> ReadJobs(const StateStore& store,
                                                std::optional<int32_t> partition) {
  auto metas = ReadMetas(store, [&](const state::v1::JobMeta& meta) {
    return !partition || InPartition(meta, *partition);
  });
  if (!metas.ok()) return metas.status();
  std::vector<StoredJob> jobs;
  jobs.reserve(metas->size());
  for (state::v1::JobMeta& meta : *metas) {
    StoredJob job;
    const std::string name = meta.training_job();
    job.meta = std::move(meta);
    absl::Status bad;
    absl::Status s = store.ForEach(
        StateFamily::kJobs, StepPrefix(name), [&](std::string_view, std::string_view v) {
          job.steps.emplace_back();
          if (!job.steps.back().ParseFromArray(v.data(), static_cast<int>(v.size()))) {
            bad = absl::DataLossError("unreadable stored step of job '" + name + "'");
          }
        });
    if (!s.ok()) return s;
    if (!bad.ok()) return bad;
    s = store.ForEach(
        StateFamily::kJobs, WhatIfPrefix(name), [&](std::string_view, std::string_view v) {
          job.whatif_steps.emplace_back();
          if (!job.whatif_steps.back().ParseFromArray(v.data(), static_cast<int>(v.size()))) {
            bad = absl::DataLossError("unreadable stored what-if step of job '" + name + "'");
          }
        });
    if (!s.ok()) return s;
    if (!bad.ok()) return bad;
    auto alerts = store.Get(StateFamily::kJobs, AlertsKey(name));
    if (!alerts.ok()) return alerts.status();
    if (*alerts) {
      job.alerts.emplace();
      if (!job.alerts->ParseFromString(**alerts)) {
        return absl::DataLossError("unreadable stored alerts of job '" + name + "'");
      }
    }
    jobs.push_back(std::move(job));
  }
  return jobs;
}

namespace {

// Calls `fn(step, stored step)` for each stored step of `job` from step `from` on, in step
// order, while it returns true. An unreadable step is DataLoss naming the job.
absl::Status ScanSteps(const StateStore& store, const std::string& job, uint64_t from,
                       const std::function<bool(uint64_t, state::v1::StoredStep&&)>& fn) {
  const std::string prefix = StepPrefix(job);
  absl::Status bad;
  absl::Status s = store.Scan(
      StateFamily::kJobs, StepKey(job, from), [&](std::string_view key, std::string_view value) {
        if (key.size() != prefix.size() + 8 || key.substr(0, prefix.size()) != prefix) {
          return false;  // past the job's steps
        }
        const uint64_t step = ReadBigEndian(key.substr(prefix.size()));
        state::v1::StoredStep stored;
        if (!stored.ParseFromArray(value.data(), static_cast<int>(value.size()))) {
          bad = absl::DataLossError("unreadable stored step " + std::to_string(step) + " of job '" +
                                    job + "'");
          return false;
        }
        return fn(step, std::move(stored));
      });
  return s.ok() ? bad : s;
}

}  // namespace

absl::StatusOr<StoredSteps> ReadSteps(const StateStore& store, const std::string& job,
                                      uint64_t first, uint64_t last) {
  StoredSteps out;
  bool any = false;
  absl::Status s = ScanSteps(store, job, 0, [&](uint64_t step, state::v1::StoredStep&& stored) {
    if (!any) out.stored_first = step;
    any = true;
    out.stored_last = step;
    if (step >= first && step <= last) out.steps.push_back(std::move(stored));
    return true;
  });
  if (!s.ok()) return s;
  return out;
}

absl::StatusOr<std::vector<state::v1::StoredStep>> ReadStepRange(const StateStore& store,
                                                                 const std::string& job,
                                                                 uint64_t first, uint64_t last) {
  std::vector<state::v1::StoredStep> out;
  absl::Status s = ScanSteps(store, job, first, [&](uint64_t step, state::v1::StoredStep&& stored) {
    if (step > last) return false;
    out.push_back(std::move(stored));
    return true;
  });
  if (!s.ok()) return s;
  return out;
}

absl::Status CopyJobs(const StateStore& store, const std::vector<std::string>& jobs,
                      Checkpoint* out) {
  for (const std::string& job : jobs) {
    auto meta = store.Get(StateFamily::kJobs, MetaKey(job));
    if (!meta.ok()) return meta.status();
    if (!*meta) continue;
    out->Put(StateFamily::kJobs, MetaKey(job), **meta);
    auto alerts = store.Get(StateFamily::kJobs, AlertsKey(job));
    if (!alerts.ok()) return alerts.status();
    if (*alerts) out->Put(StateFamily::kJobs, AlertsKey(job), **alerts);
    for (const std::string& prefix : {StepPrefix(job), WhatIfPrefix(job)}) {
      absl::Status s =
          store.ForEach(StateFamily::kJobs, prefix, [&](std::string_view k, std::string_view v) {
            out->Put(StateFamily::kJobs, std::string(k), std::string(v));
          });
      if (!s.ok()) return s;
    }
  }
  return absl::OkStatus();
}

absl::Status DeletePartition(const StateStore& store, int32_t partition, Checkpoint* out) {
  auto metas = ReadMetas(
      store, [&](const state::v1::JobMeta& meta) { return InPartition(meta, partition); });
  if (!metas.ok()) return metas.status();
  for (const state::v1::JobMeta& meta : *metas) DeleteJob(meta.training_job(), out);
  return absl::OkStatus();
}

void PutAlert(const v1::Alert& alert, Checkpoint* out) {
  out->Put(StateFamily::kAlerts, AlertKey(alert.sequence()), alert.SerializeAsString());
}

void TrimAlertLog(uint64_t first_kept, Checkpoint* out) {
  out->DeleteRange(StateFamily::kAlerts, AlertKey(0), AlertKey(first_kept));
}

absl::StatusOr<uint64_t> LastAlertSequence(const StateStore& store) {
  auto last = store.LastKey(StateFamily::kAlerts);
  if (!last.ok()) return last.status();
  return *last ? ReadBigEndian(**last) : 0;
}

absl::Status ScanAlerts(const StateStore& store, uint64_t from,
                        const std::function<bool(uint64_t, std::string_view)>& fn) {
  return store.Scan(
      StateFamily::kAlerts, AlertKey(from),
      [&](std::string_view key, std::string_view value) { return fn(ReadBigEndian(key), value); });
}

}  // namespace rankwatch::job_state
