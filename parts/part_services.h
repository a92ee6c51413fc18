// PartServices: what the daemon's parts serve to the queries (serving/queries.h) and to the
// runtime — each service found by its type (the capture store, the fleet view of nodes, the
// state changelog), and what each part adds to a job's diagnosis. A part offers them from its
// Start (parts/daemon_part.h); the servers and the runtime find them, so neither names the parts
// nor enumerates what they serve. A service no part offers is off (its calls answer
// UNAVAILABLE).
//
// Filled on the main thread before the servers start, read-only after: then safe from any
// thread (the services themselves are thread-safe).
#pragma once

#include <map>
#include <typeindex>
#include <typeinfo>
#include <vector>

#include "operators/job_pipeline.h"
#include "rankwatch/v1/service.pb.h"

namespace rankwatch {

// What a part adds to a job's diagnosis (GetDiagnosis, the web UI's job page): a capture
// comparison, a hung job's stacks, a Flight Recorder verdict. Thread-safe.
class DiagnosisContributor {
 public:
  virtual ~DiagnosisContributor() = default;
  // Adds what the part knows of `job` (its latest snapshot) to `diagnosis`.
  virtual void AddTo(const JobSnapshot& job, v1::Diagnosis* diagnosis) const = 0;
};

class PartServices {
 public:
  // Offers `service` as the one T (replacing an earlier one). It outlives the servers.
  template <typename T>
  void Offer(T* service) {
    by_type_[std::type_index(typeid(T))] = service;
  }
  // The T a part offers, or null when none does.
  template <typename T>
  T* Find() const {
    auto it = by_type_.find(std::type_index(typeid(T)));
    return it == by_type_.end() ? nullptr : static_cast<T*>(it->second);
  }

  // Adds `contributor` to every diagnosis, after those added before it.
  void AddDiagnosis(const DiagnosisContributor* contributor) { diagnosis_.push_back(contributor); }
  const std::vector<const DiagnosisContributor*>& diagnosis() const { return diagnosis_; }

 private:
  std::map<std::type_index, void*> by_type_;
  std::vector<const DiagnosisContributor*> diagnosis_;
};

}  // namespace rankwatch
