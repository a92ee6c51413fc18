// PendingBatches: serialized telemetry batches waiting for room in the Kafka producer's
// queue, bounded in bytes. When a new batch would exceed the bound, the oldest batches are
// discarded and their records counted as dropped: while the broker is down the collector
// keeps the newest telemetry and a fixed amount of memory.
//
// Not thread-safe: owned by the collector's sender thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>

namespace rankwatch {

struct PendingBatch {
  std::string payload;   // a serialized v1::Batch
  uint64_t records = 0;  // step records + kernel events + samples it carries
};

class PendingBatches {
 public:
  // `max_bytes`: the bound on the payload bytes held (at least one batch is always kept).
  explicit PendingBatches(size_t max_bytes) : max_bytes_(max_bytes) {}

  // Appends `batch`, then discards the oldest batches while over the bound (never `batch`
  // itself). Returns the number of records discarded.
  uint64_t Push(PendingBatch batch);

  bool empty() const { return batches_.empty(); }
  const PendingBatch& front() const { return batches_.front(); }
  // Removes the oldest batch (requires !empty()).
  void PopFront();

  size_t bytes() const { return bytes_; }
  size_t size() const { return batches_.size(); }
  uint64_t dropped_batches() const { return dropped_batches_; }
  uint64_t dropped_records() const { return dropped_records_; }

 private:
  const size_t max_bytes_;
  std::deque<PendingBatch> batches_;
  size_t bytes_ = 0;
  uint64_t dropped_batches_ = 0;
  uint64_t dropped_records_ = 0;
};

}  // namespace rankwatch
