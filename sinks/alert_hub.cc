#include "sinks/alert_hub.h"

#include <spdlog/spdlog.h>

namespace rankwatch {

std::string AlertKey(uint64_t sequence) {
  std::string key;
  for (int shift = 56; shift >= 0; shift -= 8) key.push_back(static_cast<char>((sequence >> shift) & 0xff));
  return key;
}

namespace {

uint64_t SequenceOf(std::string_view key) {
  uint64_t v = 0;
  for (size_t i = 0; i < 8 && i < key.size(); ++i) v = (v << 8) | static_cast<uint8_t>(key[i]);
  return v;
}

}  // namespace

bool AlertFilter::Matches(const v1::Alert& alert) const {
  if (!training_job.empty() && alert.training_job() != training_job) return false;
  if (!kinds.empty() && !kinds.count(alert.kind())) return false;
  return alert.severity() >= min_severity;
}

AlertHub::AlertHub(StateStore* store, AlertHubOptions options, AlertHubMetrics metrics)
    : store_(store), options_(options), metrics_(metrics) {
  reaper_ = std::thread([this] {
    std::unique_lock<std::mutex> lock(mu_);
    while (!closed_) {
      changed_.wait_for(lock, std::chrono::milliseconds(250));
      const auto now = std::chrono::steady_clock::now();
      for (Subscription* s : subscribers_) {
        if (s->overflowed_ && !s->cancelled_ && s->cancel_ &&
            now - s->overflowed_at >= options_.stuck_after) {
          s->cancelled_ = true;
          s->cancel_();
        }
      }
    }
  });
  if (store_ == nullptr) return;
  auto last = store_->LastKey(StateFamily::kAlerts);
  if (!last.ok()) {
    spdlog::error("reading the alert log: {}", std::string(last.status().message()));
  } else if (*last) {
    next_sequence_ = SequenceOf(**last) + 1;
    spdlog::info("alert log: sequences continue at {}", next_sequence_);
  }
}

AlertHub::~AlertHub() {
  Close();
  reaper_.join();
}

absl::Status AlertHub::Append(std::vector<v1::Alert> alerts, const Checkpoint& extra) {
  if (alerts.empty() && extra.empty()) return absl::OkStatus();
  uint64_t first;
  {
    std::lock_guard<std::mutex> lock(mu_);
    first = next_sequence_;
  }
  // Only the ingest thread appends, so the sequences read above stay ours.
  Checkpoint c;
  c.Append(extra);
  for (size_t i = 0; i < alerts.size(); ++i) {
    alerts[i].set_sequence(first + i);
    c.Put(StateFamily::kAlerts, AlertKey(first + i), alerts[i].SerializeAsString());
  }
  const uint64_t end = first + alerts.size();
  if (end > options_.log_retention + 1) {
    c.DeleteRange(StateFamily::kAlerts, AlertKey(0), AlertKey(end - options_.log_retention));
  }
  absl::Status status = store_ != nullptr ? store_->Commit(c) : absl::OkStatus();
  std::lock_guard<std::mutex> lock(mu_);
  next_sequence_ = end;
  for (v1::Alert& a : alerts) {
    auto alert = std::make_shared<const v1::Alert>(std::move(a));
    std::set<std::string>& firing = firing_[alert->training_job()];
    if (alert->state() == v1::ALERT_FIRING) {
      firing.insert(alert->id());
    } else {
      firing.erase(alert->id());
    }
    if (firing.empty()) firing_.erase(alert->training_job());
    ring_.push_back(alert);
    if (ring_.size() > options_.ring_capacity) ring_.pop_front();
    for (Subscription* s : subscribers_) {
      if (s->overflowed_ || !s->filter_.Matches(*alert)) continue;
      if (s->queue_.size() >= options_.subscriber_queue) {
        s->overflowed_ = true;
        s->overflowed_at = std::chrono::steady_clock::now();
        s->queue_.clear();
        if (metrics_.subscribers_dropped) metrics_.subscribers_dropped->Add(1);
        continue;
      }
      s->queue_.push_back(alert);
    }
  }
  changed_.notify_all();
  return status;
}

std::vector<std::string> AlertHub::Firing(const std::string& training_job) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = firing_.find(training_job);
  if (it == firing_.end()) return {};
  return {it->second.begin(), it->second.end()};
}

void AlertHub::SetFiring(const std::string& training_job, std::vector<std::string> ids) {
  std::lock_guard<std::mutex> lock(mu_);
  if (ids.empty()) {
    firing_.erase(training_job);
  } else {
    firing_[training_job] = std::set<std::string>(ids.begin(), ids.end());
  }
}

uint64_t AlertHub::last_sequence() const {
  std::lock_guard<std::mutex> lock(mu_);
  return next_sequence_ - 1;
}

std::unique_ptr<AlertHub::Subscription> AlertHub::Subscribe(const AlertFilter& filter,
                                                           std::function<void()> cancel) {
  auto s = std::unique_ptr<Subscription>(new Subscription());
  s->hub_ = this;
  s->filter_ = filter;
  s->cancel_ = std::move(cancel);
  std::lock_guard<std::mutex> lock(mu_);
  s->live_from_ = next_sequence_;
  s->overflowed_ = closed_;
  subscribers_.insert(s.get());
  if (metrics_.subscribers) metrics_.subscribers->Set(static_cast<double>(subscribers_.size()));
  return s;
}

AlertHub::Subscription::~Subscription() {
  std::lock_guard<std::mutex> lock(hub_->mu_);
  hub_->subscribers_.erase(this);
  if (hub_->metrics_.subscribers) {
    hub_->metrics_.subscribers->Set(static_cast<double>(hub_->subscribers_.size()));
  }
}

AlertHub::Subscription::Wait AlertHub::Subscription::Next(
    std::chrono::milliseconds timeout, std::shared_ptr<const v1::Alert>* alert) {
  std::unique_lock<std::mutex> lock(hub_->mu_);
  hub_->changed_.wait_for(lock, timeout,
                          [&] { return !queue_.empty() || overflowed_ || hub_->closed_; });
  if (hub_->closed_) return Wait::kClosed;
  if (overflowed_) return Wait::kOverflow;
  if (queue_.empty()) return Wait::kTimeout;
  *alert = std::move(queue_.front());
  queue_.pop_front();
  if (hub_->metrics_.delivered) hub_->metrics_.delivered->Add(1);
  return Wait::kAlert;
}

bool AlertHub::Backlog(uint64_t after, uint64_t before, const AlertFilter& filter,
                       const std::function<void(std::shared_ptr<const v1::Alert>)>& fn) const {
  if (after + 1 >= before) return true;
  std::vector<std::shared_ptr<const v1::Alert>> from_ring;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!ring_.empty() && ring_.front()->sequence() <= after + 1) {
      for (const auto& a : ring_) {
        if (a->sequence() > after && a->sequence() < before && filter.Matches(*a)) {
          from_ring.push_back(a);
        }
      }
      for (auto& a : from_ring) fn(std::move(a));
      return true;
    }
  }
  if (store_ == nullptr) return false;
  bool complete = true;
  bool first = true;
  absl::Status s = store_->Scan(StateFamily::kAlerts, AlertKey(after + 1),
                                [&](std::string_view key, std::string_view value) {
                                  const uint64_t seq = SequenceOf(key);
                                  if (seq >= before) return false;
                                  if (first && seq > after + 1) complete = false;
                                  first = false;
                                  auto alert = std::make_shared<v1::Alert>();
                                  if (!alert->ParseFromArray(value.data(),
                                                             static_cast<int>(value.size()))) {
                                    complete = false;
                                    return true;
                                  }
                                  if (filter.Matches(*alert)) fn(std::move(alert));
                                  return true;
                                });
  if (first && after + 1 < before) complete = false;  // nothing stored in the range at all
  return s.ok() && complete;
}

void AlertHub::Close() {
  std::lock_guard<std::mutex> lock(mu_);
  closed_ = true;
  changed_.notify_all();
}

}  // namespace rankwatch
