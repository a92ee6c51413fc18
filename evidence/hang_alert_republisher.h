// HangAlertRepublisher: how a kind of evidence about hung jobs (hang stacks, a Flight Recorder
// verdict) reaches their hang alerts. Over each tick's alerts it fills what the kind has into
// every hang alert with evidence and keeps each job's newest hang alert (forgetting it once it
// resolves); evidence that arrives after the alert is published with the alert again: the same
// id and state, a new `at`. Both kinds run after one another on the tick (evidence/
// evidence_part.h), so an alert one of them publishes again is seen, and kept, by the next.
//
// Not thread-safe: its owner calls it under the owner's lock.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "rankwatch/v1/service.pb.h"

namespace rankwatch {

class HangAlertRepublisher {
 public:
  // Puts the kind's evidence of `job` into `alert`; returns whether it put anything.
  using Fill = std::function<bool(const std::string& job, v1::Alert* alert)>;

  // Each hang alert of `alerts` with evidence gets `fill`; each job's newest hang alert is kept
  // (a resolved one forgotten).
  void Attach(std::vector<v1::Alert>* alerts, const Fill& fill);

  // The newest hang alert of `job`, filled by `fill`, is appended to `alerts` again at
  // `now_unix_ns` (and kept as the newest). Nothing when the job has no hang alert with evidence
  // or `fill` puts nothing; returns whether it appended.
  bool Republish(const std::string& job, int64_t now_unix_ns, const Fill& fill,
                 std::vector<v1::Alert>* alerts);

  void Forget(const std::string& job) { newest_.erase(job); }

 private:
  std::map<std::string, v1::Alert> newest_;  // by job
};

}  // namespace rankwatch
