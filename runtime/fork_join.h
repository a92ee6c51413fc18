// ForkJoin: a fixed set of worker threads that run one function together with the caller.
// Run(fn) calls fn(0) on the calling thread and fn(1) ... fn(workers) on the workers, and
// returns when every call has returned; the workers sleep between runs. The ingest thread uses
// it to handle different partitions' messages at once (JobRouter::HandleMessages).
//
// Run is called from one thread at a time; fn must not throw.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace rankwatch {

class ForkJoin {
 public:
  // `workers` threads besides the caller's (0: Run calls fn(0) only).
  explicit ForkJoin(size_t workers);
  ~ForkJoin();
  ForkJoin(const ForkJoin&) = delete;
  ForkJoin& operator=(const ForkJoin&) = delete;

  // Lanes a run has: the workers and the caller.
  size_t lanes() const { return threads_.size() + 1; }
  void Run(const std::function<void(size_t lane)>& fn);

 private:
  void Work(size_t lane);

  std::mutex mu_;
  std::condition_variable start_, done_;
  const std::function<void(size_t)>* fn_ = nullptr;  // of the current run
  uint64_t run_ = 0;                                 // runs started
  size_t running_ = 0;                               // workers still in the current run
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace rankwatch
