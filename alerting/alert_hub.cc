#include "alerting/alert_hub.h"

#include <spdlog/spdlog.h>

#include "state/job_state_store.h"

namespace rankwatch {

bool AlertFilter::Matches(const v1::Alert& alert) const {
  if (!training_job.empty() && alert.training_job() != training_job) return false;
  if (!kinds.empty() && !kinds.count(alert.kind())) return false;
  return alert.severity() >= min_severity;
}

AlertHub::AlertHub(const StateStore* store, CheckpointWriter* writer, AlertHubOptions options,
                   AlertHubMetrics metrics)
    : store_(store), writer_(writer), options_(options), metrics_(metrics) {
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
  auto last = job_state::LastAlertSequence(*store_);
  if (!last.ok()) {
    spdlog::error("reading the alert log: {}", std::string(last.status().message()));
  } else if (*last > 0) {
    std::lock_guard<std::mutex> lock(mu_);
    next_sequence_ = next_to_assign_ = *last + 1;
    spdlog::info("alert log: sequences continue at {}", next_sequence_);
  }
}

AlertHub::~AlertHub() {
  (void)Flush();  // no write queued by this hub may publish into it once it is gone
  Close();
  reaper_.join();
}

void AlertHub::Append(std::vector<v1::Alert> alerts, Checkpoint extra) {
  if (alerts.empty() && extra.empty()) return;
  const uint64_t first = next_to_assign_;
  Checkpoint c = std::move(extra);
  for (size_t i = 0; i < alerts.size(); ++i) {
    alerts[i].set_sequence(first + i);
    job_state::PutAlert(alerts[i], &c);
  }
  next_to_assign_ = first + alerts.size();
  if (next_to_assign_ > options_.log_retention + 1) {
    job_state::TrimAlertLog(next_to_assign_ - options_.log_retention, &c);
  }
  if (writer_ == nullptr) {
    Publish(std::move(alerts));
    return;
  }
  // Published whatever the outcome: a failed write loses the alerts to resumption only.
  writer_->EnqueueNoWait(std::move(c),
                         [this, alerts = std::move(alerts)](const absl::Status&) mutable {
                           Publish(std::move(alerts));
                         });
}

absl::Status AlertHub::Flush() { return writer_ != nullptr ? writer_->Drain() : absl::OkStatus(); }

void AlertHub::Publish(std::vector<v1::Alert> alerts) {
  if (alerts.empty()) return;
  std::lock_guard<std::mutex> lock(mu_);
  next_sequence_ = alerts.back().sequence() + 1;
  for (v1::Alert& a : alerts) {
    auto alert = std::make_shared<const v1::Alert>(std::move(a));
    std::set<std::string>& firing = firing_[alert->training_job()];
    if (alert->state() == v1::ALERT_FIRING) {
      firing.insert(alert->id());
    } else {
      firing.erase(alert->id());
    }
    if (firing.empty()) firing_.erase(alert->training_job());
    const size_t bytes = alert->SpaceUsedLong();
    ring_.push_back(alert);
    ring_sizes_.push_back(bytes);
    ring_bytes_ += bytes;
    while (ring_.size() > 1 &&
           (ring_.size() > options_.ring_capacity || ring_bytes_ > options_.ring_max_bytes)) {
      ring_bytes_ -= ring_sizes_.front();
      ring_.pop_front();
      ring_sizes_.pop_front();
    }
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

AlertHub::Subscription::Wait AlertHub::Subscription::Next(std::chrono::milliseconds timeout,
                                                          std::shared_ptr<const v1::Alert>* alert) {
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
  absl::Status s =
      job_state::ScanAlerts(*store_, after + 1, [&](uint64_t seq, std::string_view value) {
        if (seq >= before) return false;
        if (first && seq > after + 1) complete = false;
        first = false;
        auto alert = std::make_shared<v1::Alert>();
        if (!alert->ParseFromArray(value.data(), static_cast<int>(value.size()))) {
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
