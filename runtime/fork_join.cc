#include "runtime/fork_join.h"

#include <pthread.h>

#include <string>

namespace rankwatch {

ForkJoin::ForkJoin(size_t workers) {
  for (size_t lane = 1; lane <= workers; ++lane) {
    threads_.emplace_back([this, lane] { Work(lane); });
    const std::string name = "rw-lane-" + std::to_string(lane);
    pthread_setname_np(threads_.back().native_handle(), name.c_str());
  }
}

ForkJoin::~ForkJoin() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  start_.notify_all();
  for (std::thread& t : threads_) t.join();
}

void ForkJoin::Run(const std::function<void(size_t)>& fn) {
  if (threads_.empty()) {
    fn(0);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    fn_ = &fn;
    ++run_;
    running_ = threads_.size();
  }
  start_.notify_all();
  fn(0);
  std::unique_lock<std::mutex> lock(mu_);
  done_.wait(lock, [this] { return running_ == 0; });
  fn_ = nullptr;
}

void ForkJoin::Work(size_t lane) {
  uint64_t seen = 0;
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    start_.wait(lock, [&] { return stop_ || run_ != seen; });
    if (stop_) return;
    seen = run_;
    const std::function<void(size_t)>* fn = fn_;
    lock.unlock();
    (*fn)(lane);
    lock.lock();
    if (--running_ == 0) done_.notify_one();
  }
}

}  // namespace rankwatch
