// The keys of a job's durable state in the `windows` column family:
//   "m" job                        -> state::v1::JobMeta
//   "s" job '\0' big-endian step   -> state::v1::StoredStep (in step order)
//   "a" job                        -> state::v1::AlertTrackerState
#pragma once

#include <cstdint>
#include <string>

namespace rankwatch {

inline std::string JobMetaKey(const std::string& job) { return "m" + job; }

inline std::string JobAlertsKey(const std::string& job) { return "a" + job; }

inline std::string JobStepPrefix(const std::string& job) { return "s" + job + '\0'; }

inline std::string JobStepKey(const std::string& job, uint64_t step) {
  std::string key = JobStepPrefix(job);
  for (int shift = 56; shift >= 0; shift -= 8) key.push_back(static_cast<char>((step >> shift) & 0xff));
  return key;
}

}  // namespace rankwatch
