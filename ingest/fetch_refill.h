// FetchRefill: tells the consumer when to wake librdkafka's fetcher, which stopped filling a
// full consumer queue, so that a backlog is read at the daemon's speed through a small queue.
//
// librdkafka before 2.2 (Debian 12 has 2.0.2) stops fetching every partition once the consumer
// queue holds queued.max.messages.kbytes of payload (or queued.min.messages messages), and
// decides again only when its broker thread next wakes: on an op, on I/O from its broker, or
// after at most a second (rd_kafka_max_block_ms in rdkafka_broker.c). While the daemon reads a
// backlog it empties the queue in a fraction of that second and then waits for the rest of
// it: catching up goes at one queue a second. Waking the broker threads once the daemon has
// read the queue down lets them refill it at once; the queue stays as small as configured.
// (librdkafka 2.2 made the wait a setting, fetch.queue.backoff.ms, and a wake-up no longer
// shortens it there.)
//
// The consumer reports each batch it takes (Taken); FetchRefill says when a wake-up is due: the
// queue was seen at three quarters of a limit or more since the last wake-up (the fetcher may
// have stopped: it stops at the limit; the margin covers the estimate below), and it now holds
// at most half of each limit, so that the fetcher refills it while the daemon reads the rest.
// Each wake-up thus follows a quarter of a limit read at least. A queue that never fills (a
// daemon keeping up with its producers: the queue holds about one fetch answer) is never
// woken. The bytes left in the queue are estimated from its message count and the last batch's
// mean message size (librdkafka tells the count only).
//
// Not thread-safe: owned by the consumer, used on the ingest thread.
#pragma once

#include <librdkafka/rdkafka.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace rankwatch {

// librdkafka's limits on its consumer queue.
struct FetchQueueLimits {
  int64_t max_bytes = 0;     // queued.max.messages.kbytes, in bytes
  int64_t max_messages = 0;  // queued.min.messages
};

// The limits a client was configured with.
FetchQueueLimits FetchQueueLimitsOf(rd_kafka_t* rk);

class FetchRefill {
 public:
  explicit FetchRefill(FetchQueueLimits limits) : limits_(limits) {}

  // The consumer took `messages` messages with `bytes` payload bytes from the queue, which
  // holds `queued` messages now. Returns true when the fetcher should be woken now (counted).
  bool Taken(size_t messages, size_t bytes, size_t queued);

  uint64_t wakeups() const { return wakeups_; }

 private:
  FetchQueueLimits limits_;
  double mean_message_bytes_ = 0;  // of the last batch that had messages
  // The most the queue was seen to hold (a batch plus what it left) since the last wake-up.
  double peak_bytes_ = 0;
  double peak_messages_ = 0;
  uint64_t wakeups_ = 0;
};

// Makes the broker threads that lead `partitions` of `topic` decide at once what to fetch:
// rd_kafka_offsets_for_times with no wait enqueues one ListOffsets request (the log end) per
// leader on its broker thread, which wakes it, and returns without waiting for the answers
// (librdkafka drops them). Costs one small request per leader broker, no wait on this thread.
void WakeFetchers(rd_kafka_t* rk, const std::string& topic, const std::vector<int32_t>& partitions);

}  // namespace rankwatch
