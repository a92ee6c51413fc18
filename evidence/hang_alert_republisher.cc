#include "evidence/hang_alert_republisher.h"

#include <utility>

namespace rankwatch {

void HangAlertRepublisher::Attach(std::vector<v1::Alert>* alerts, const Fill& fill) {
  for (v1::Alert& a : *alerts) {
    if (a.kind() != v1::ALERT_HANG) continue;
    if (a.state() == v1::ALERT_RESOLVED) {
      newest_.erase(a.training_job());
      continue;
    }
    if (a.has_evidence()) fill(a.training_job(), &a);
    newest_[a.training_job()] = a;
  }
}

bool HangAlertRepublisher::Republish(const std::string& job, int64_t now_unix_ns, const Fill& fill,
                                     std::vector<v1::Alert>* alerts) {
  auto it = newest_.find(job);
  if (it == newest_.end() || !it->second.has_evidence()) return false;
  v1::Alert again = it->second;
  if (!fill(job, &again)) return false;
  again.set_at_unix_ns(now_unix_ns);
  it->second = again;
  alerts->push_back(std::move(again));
  return true;
}

}  // namespace rankwatch
