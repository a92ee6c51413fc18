#include "metrics/job_export_gate.h"

namespace rankwatch {

void JobExportGate::ShowCountsIn(MetricCell* candidates, MetricCell* exported,
                                 MetricCell* over_limit) {
  std::lock_guard<std::mutex> lock(mu_);
  shown_[0] = candidates;
  shown_[1] = exported;
  shown_[2] = over_limit;
  Show();
}

void JobExportGate::Show() {
  const size_t values[3] = {counts_.candidates, counts_.exported, counts_.over_limit};
  for (int i = 0; i < 3; ++i) {
    if (shown_[i] != nullptr) shown_[i]->Set(static_cast<double>(values[i]));
  }
}

JobExportGate::State JobExportGate::Evaluate(const std::string& job, bool is_job) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = ids_.find(job);
  if (it == ids_.end()) {
    it = ids_.emplace(job, Entry{}).first;
    ++counts_.candidates;
    Show();
  }
  Entry& e = it->second;
  if (e.state != State::kCandidate || !is_job) return e.state;
  --counts_.candidates;
  e.became_job = next_sequence_++;
  if (counts_.exported < options_.max_exported) {
    e.state = State::kExported;
    ++counts_.exported;
  } else {
    e.state = State::kOverLimit;
    ++counts_.over_limit;
    waiting_.emplace(e.became_job, job);
  }
  Show();
  return e.state;
}

bool JobExportGate::IsJob(const std::string& job) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = ids_.find(job);
  return it != ids_.end() && it->second.state != State::kCandidate;
}

bool JobExportGate::Exported(const std::string& job) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = ids_.find(job);
  return it != ids_.end() && it->second.state == State::kExported;
}

bool JobExportGate::Remove(const std::string& job) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = ids_.find(job);
  if (it == ids_.end()) return false;
  const State state = it->second.state;
  switch (state) {
    case State::kCandidate: --counts_.candidates; break;
    case State::kOverLimit:
      --counts_.over_limit;
      waiting_.erase({it->second.became_job, job});
      break;
    case State::kExported: --counts_.exported; break;
  }
  ids_.erase(it);
  // The job that became one first among those waiting takes the freed place.
  while (counts_.exported < options_.max_exported && !waiting_.empty()) {
    auto next = ids_.find(waiting_.begin()->second);
    waiting_.erase(waiting_.begin());
    next->second.state = State::kExported;
    --counts_.over_limit;
    ++counts_.exported;
  }
  Show();
  return state == State::kExported;
}

JobExportGate::Counts JobExportGate::counts() const {
  std::lock_guard<std::mutex> lock(mu_);
  return counts_;
}

}  // namespace rankwatch
