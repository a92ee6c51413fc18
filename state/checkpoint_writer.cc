#include "state/checkpoint_writer.h"

#include <chrono>
#include <utility>

namespace rankwatch {

CheckpointWriter::CheckpointWriter(StateStore* store, CheckpointWriterOptions options,
                                   std::function<void(const CheckpointCommitStats&)> on_commit,
                                   std::function<void(const absl::Status&)> on_error)
    : store_(store),
      options_(options),
      on_commit_(std::move(on_commit)),
      on_error_(std::move(on_error)),
      thread_([this] { Run(); }) {}

CheckpointWriter::~CheckpointWriter() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  changed_.notify_all();
  thread_.join();
}

absl::Status CheckpointWriter::Enqueue(Checkpoint checkpoint,
                                       std::function<absl::Status()> after_commit) {
  std::unique_lock<std::mutex> lock(mu_);
  changed_.wait(lock, [&] { return !sticky_.ok() || queue_.size() < options_.max_queued; });
  if (!sticky_.ok()) return sticky_;
  queue_.push_back({std::move(checkpoint), std::move(after_commit), nullptr});
  lock.unlock();
  changed_.notify_all();
  return absl::OkStatus();
}

void CheckpointWriter::EnqueueNoWait(Checkpoint checkpoint,
                                     std::function<void(const absl::Status&)> then) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!sticky_.ok()) {
    const absl::Status sticky = sticky_;
    lock.unlock();
    if (then) then(sticky);
    return;
  }
  queue_.push_back({std::move(checkpoint), nullptr, std::move(then)});
  lock.unlock();
  changed_.notify_all();
}

absl::Status CheckpointWriter::Drain() {
  std::unique_lock<std::mutex> lock(mu_);
  changed_.wait(lock, [&] { return queue_.empty() && !busy_; });
  return sticky_;
}

absl::Status CheckpointWriter::health() const {
  std::lock_guard<std::mutex> lock(mu_);
  return sticky_;
}

size_t CheckpointWriter::pending() const {
  std::lock_guard<std::mutex> lock(mu_);
  return queue_.size() + (busy_ ? 1 : 0);
}

void CheckpointWriter::Run() {
  for (;;) {
    Item item;
    {
      std::unique_lock<std::mutex> lock(mu_);
      changed_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and everything was written
      item = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
      if (!sticky_.ok()) {
        busy_ = false;  // dropped: nothing may land after a failed checkpoint
        const absl::Status sticky = sticky_;
        lock.unlock();
        if (item.then) item.then(sticky);
        changed_.notify_all();
        continue;
      }
    }
    changed_.notify_all();  // a slot is free
    CheckpointCommitStats stats;
    const absl::Status s = Write(item, &stats);
    std::function<void(const absl::Status&)> then = std::move(item.then);
    item = Item();  // free the checkpoint's memory before reporting
    std::deque<Item> dropped;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!s.ok()) {
        sticky_ = s;
        dropped.swap(queue_);
      }
    }
    if (s.ok() && on_commit_) on_commit_(stats);
    if (!s.ok() && on_error_) on_error_(s);
    if (then) then(s);
    for (Item& d : dropped) {
      if (d.then) d.then(s);
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      busy_ = false;
    }
    changed_.notify_all();
  }
}

absl::Status CheckpointWriter::Write(Item& item, CheckpointCommitStats* stats) {
  const auto start = std::chrono::steady_clock::now();
  item.checkpoint.Materialize();
  stats->bytes = item.checkpoint.bytes();
  if (absl::Status s = store_->Commit(item.checkpoint); !s.ok()) return s;
  if (item.after_commit) {
    if (absl::Status s = item.after_commit(); !s.ok()) return s;
  }
  bytes_since_flush_ += stats->bytes;
  if (options_.flush_after_bytes > 0 && bytes_since_flush_ >= options_.flush_after_bytes) {
    if (absl::Status s = store_->Flush(); !s.ok()) return s;
    bytes_since_flush_ = 0;
    stats->flushed = true;
  }
  stats->seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return absl::OkStatus();
}

}  // namespace rankwatch
