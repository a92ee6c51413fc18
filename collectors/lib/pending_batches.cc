#include "collectors/lib/pending_batches.h"

#include <cassert>

namespace rankwatch {

uint64_t PendingBatches::Push(PendingBatch batch) {
  bytes_ += batch.payload.size();
  batches_.push_back(std::move(batch));
  uint64_t dropped = 0;
  while (bytes_ > max_bytes_ && batches_.size() > 1) {
    dropped += batches_.front().records;
    ++dropped_batches_;
    PopFront();
  }
  dropped_records_ += dropped;
  return dropped;
}

void PendingBatches::PopFront() {
  assert(!batches_.empty() && "PopFront on an empty PendingBatches");
  bytes_ -= batches_.front().payload.size();
  batches_.pop_front();
}

}  // namespace rankwatch
