#include "common/log_throttle.h"

namespace rankwatch {

std::optional<uint64_t> LogThrottle::Admit(TimePoint now, uint64_t events) {
  std::lock_guard<std::mutex> lock(mu_);
  since_ += events;
  if (reported_ && now - *reported_ < interval_) return std::nullopt;
  reported_ = now;
  const uint64_t count = since_;
  since_ = 0;
  return count;
}

}  // namespace rankwatch
