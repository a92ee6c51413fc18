// KafkaConsumer: a consumer-group member on the telemetry topic (librdkafka).
//
// Kafka's group protocol distributes partitions across daemon instances (eager range
// assignment by default; see the .cc for why not cooperative-sticky); this class joins the
// group, tells its owner about assignments and revocations, and hands out messages. Offsets
// are state (the owner says where to resume); Kafka's committed offsets, committed
// automatically, serve lag monitoring only.
//
// Not thread-safe: owned by the ingest thread.
#pragma once

#include <librdkafka/rdkafka.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "ingest/fetch_refill.h"
#include "kafka/cluster_requests.h"
#include "kafka/handles.h"
#include "kafka/kafka_properties.h"

namespace rankwatch {

struct KafkaConsumerOptions {
  std::string brokers;                        // bootstrap list "host:port,..." (required)
  std::string topic = "rankwatch.telemetry";  // default: rankwatch.telemetry
  std::string group = "rankwatch";            // default: rankwatch
  // Static group membership (Kafka's KIP-345, librdkafka's group.instance.id): a restarted
  // member with the same id takes its predecessor's place, and its partitions, without waiting
  // for the old session to time out and without a rebalance. Such a member sends no LeaveGroup
  // when it closes (its partitions wait for it for session_timeout). Empty (default): a
  // dynamic member, which leaves the group on Close().
  std::string instance_id;
  // A member that stops heartbeating (a crash, a SIGKILL) loses its partitions after this long;
  // heartbeats go every third of it, at most every second. Kafka brokers accept 6-300 s by
  // default (group.min/max.session.timeout.ms); the development broker accepts any.
  std::chrono::milliseconds session_timeout{10000};
  KafkaProperties properties;  // passed through to librdkafka; wins over the fields above
  // Partitions of `topic` were assigned to this member: returns, per partition, where to start
  // reading it — the next offset stored with the daemon's state, or nullopt for Kafka's
  // committed offset (then auto.offset.reset). Runs inside Poll. Default: committed offsets.
  std::function<std::vector<std::optional<int64_t>>(const std::string& topic,
                                                    const std::vector<int32_t>& partitions)>
      on_assigned;
  // Partitions were revoked (or lost): the member must hand them over. Runs inside Poll,
  // before they are unassigned.
  std::function<void(const std::string& topic, const std::vector<int32_t>& partitions)> on_revoked;
  // A partition of `topic` was assigned with no stored offset: this member's input there
  // begins at `offset` — the group's committed offset, or else the end of the partition's log
  // when it was assigned (what was produced before that was another's to read, or nobody's;
  // the consumer still reads what the log keeps of it, from its start). Messages from `offset`
  // on that are gone before they are read are reported to on_lost, even before the first
  // fetch. The owner keeps it as the partition's position until something is read there.
  // Runs inside Poll, after on_assigned.
  std::function<void(const std::string& topic, int32_t partition, int64_t offset)> on_start;
  // Messages of a partition were skipped: the consumer's position jumped from `expected` (the
  // next offset it should have read) to `got`, because the messages in between are gone from
  // the broker (retention, the log start moved past the position, an offset reset).
  // `log_end` is where the log ended when the loss was found (the lost messages were produced
  // before it; the end offset or `got` when unknown). Called once per event, inside Poll,
  // before the message at `got` is handed out; the consumer has logged one warning with the
  // offsets.
  std::function<void(const std::string& topic, int32_t partition, int64_t expected, int64_t got,
                     int64_t log_end)>
      on_lost;
};

struct KafkaMessage {
  std::string_view payload;
  std::string_view key;
  int32_t partition = 0;
  int64_t offset = 0;
};

class KafkaConsumer {
 public:
  static absl::StatusOr<std::unique_ptr<KafkaConsumer>> Create(const KafkaConsumerOptions& options);
  ~KafkaConsumer();
  KafkaConsumer(const KafkaConsumer&) = delete;
  KafkaConsumer& operator=(const KafkaConsumer&) = delete;

  // Takes up to `max_messages` messages that have arrived, waiting up to `timeout` only when
  // none has, and calls `on_message` for each,
  // in partition order. Consumer errors are logged, not returned. Returns messages handled.
  size_t Poll(std::chrono::milliseconds timeout, size_t max_messages,
              const std::function<void(const KafkaMessage&)>& on_message);
  // Poll, handing the messages over together: `on_messages` gets them in the order Poll would,
  // each payload valid until it returns (a batch ends early before a loss is reported, so that
  // on_lost still comes between the messages before the gap and those after it).
  size_t PollBatch(std::chrono::milliseconds timeout, size_t max_messages,
                   const std::function<void(const std::vector<KafkaMessage>&)>& on_messages);

  // Leaves the group (commits final offsets). Idempotent; the destructor calls it.
  void Close();

  // Partitions currently assigned to this member by the group (0 until the first join).
  int assigned_partitions() const { return assigned_partitions_; }

  // A fatal consumer error (librdkafka's: e.g. another member with this group.instance.id
  // fenced this one), after which the consumer reads nothing more; OK while there is none.
  const absl::Status& fatal_error() const { return fatal_error_; }

  // Times Poll woke librdkafka's fetcher after reading down a full queue (FetchRefill).
  uint64_t fetch_wakeups() const { return refill_.wakeups(); }

  // How far behind its producers this member is on one telemetry partition it reads.
  struct PartitionLag {
    int32_t partition = 0;
    // The log's end as librdkafka last saw it in a fetch answer (no request) less the next
    // offset to read: messages produced and not yet handed out, those fetched and queued
    // included. nullopt before the first fetch answer or while the next offset is unknown.
    std::optional<int64_t> messages;
    // Messages of the partition were lost (on_lost) within the window asked for.
    bool losing = false;
  };
  // Every telemetry partition assigned to this member whose next offset is known, in partition
  // order. `losing_window`: how recent a loss makes a partition `losing`.
  std::vector<PartitionLag> PartitionLags(std::chrono::steady_clock::duration losing_window) const;

 private:
  KafkaConsumer() = default;
  static void OnRebalance(rd_kafka_t* rk, rd_kafka_resp_err_t err,
                          rd_kafka_topic_partition_list_t* partitions, void* opaque);

  // Partitions of the telemetry topic assigned without a stored offset: where this member's
  // input begins in each (the group's committed offset, else the log's end; two requests for
  // all of them, at most kStartQueryTimeout each). Partitions it cannot learn are left out, with
  // a warning.
  std::map<int32_t, int64_t> StartPositions(const std::vector<int32_t>& partitions);
  // Checks message `m` against the next offset expected on its partition, and reports a loss.
  void CheckContinuity(const rd_kafka_message_t* m);
  // After each batch: a partition whose log the broker has started past its next offset (the
  // watermarks librdkafka last saw in a fetch answer), once the message at that offset cannot
  // be in the consumer queue any more, jumps at once to an offset still in the log when it is
  // fetched (JumpPastLogStart). librdkafka's own reset (auto.offset.reset=earliest) goes to the
  // log start it saw in the failing fetch answer, which it fetches only fetch.error.backoff.ms
  // later: producers that fill the log faster have moved the start on again by then, and the
  // partition reads nothing, reset after reset, until they stop. `taken`: messages this Poll
  // took; `drained`: it took all the queue held.
  void CatchUpWithLogStarts(size_t taken, bool drained);
  // Moves `partition` from `expected` (its next offset, gone from the log) past the log start
  // `cached` (librdkafka's; no request: a request waits behind the fetch the broker holds) by
  // kMarginFactor times what producers add before the partition is fetched: their rate times
  // the watermarks' age, fetch.error.backoff.ms, fetch.wait.max.ms and kFetchSlack (a tenth of
  // the log while their rate is not known; twice as far for each jump in a row that read
  // nothing; at most to where the log ends now). Reports the skipped messages.
  void JumpPastLogStart(int32_t partition, int64_t expected, const Watermarks& cached,
                        std::chrono::steady_clock::time_point now);
  // Logs one warning for a loss of [expected, got) and calls on_lost.
  void ReportLoss(const char* topic, int32_t partition, int64_t expected, int64_t got,
                  const std::string& where);

  static constexpr std::chrono::milliseconds kStartQueryTimeout{10000};
  // How long a jump waits for librdkafka's main thread to take its seek.
  static constexpr std::chrono::milliseconds kSeekTimeout{1000};
  // A partition behind its log start whose next message may still be queued (behind other
  // partitions' messages) jumps after this long at the latest.
  static constexpr std::chrono::milliseconds kStuckAfter{1000};
  // While the producers' rate is not known: the jump's margin, as a fraction of the log.
  static constexpr double kResetMargin = 0.1;
  // What a jump's margin covers besides the watermarks' age, fetch.error.backoff.ms and
  // fetch.wait.max.ms: the seek, the fetch request's way to the broker. The margin is
  // kMarginFactor times what producers add meanwhile at their measured rate (which varies, as
  // does the time to the fetch on a loaded machine); beyond the start it costs only messages
  // the consumer would otherwise read while its producers outrun it.
  static constexpr std::chrono::milliseconds kFetchSlack{5};
  static constexpr double kMarginFactor = 2;
  // The producers' rate on a partition: the log end's moves over at least kRateWindow (and at
  // most kRateWindowMax), trusted for kRateTrusted. While it is not known at all, a partition
  // behind its log start jumps only once librdkafka's own reset has had the time to read on
  // (where the start has stopped moving).
  static constexpr std::chrono::milliseconds kRateWindow{100};
  static constexpr std::chrono::milliseconds kRateWindowMax{1000};
  static constexpr std::chrono::seconds kRateTrusted{10};
  // Before a rate is measured, the end's move over this long at least serves instead.
  static constexpr std::chrono::milliseconds kRateProbe{20};
  // A log end seen more than this long after the check before (a consumer that did not poll)
  // may be that old: it neither opens nor closes a window.
  static constexpr std::chrono::milliseconds kSampleAge{25};

  KafkaClient rk_;    // outlives queue_
  KafkaQueue queue_;  // the consumer queue, read by Poll
  // Per partition: the next offset the consumer should read, once known (the stored offset it
  // resumes at, or the offset after the last message handed out). Written inside Poll.
  std::map<int32_t, int64_t> next_offset_;
  // Per partition assigned without a stored offset: where this member's input begins
  // (StartPositions). Gaps before it are not losses. Written inside Poll.
  std::map<int32_t, int64_t> input_start_;
  struct PartitionProgress {
    std::chrono::steady_clock::time_point last_loss;  // the last reported to on_lost
    // Behind the log start: set when the log was first seen starting past the next offset
    // `behind_at`. The message there may still be queued until Poll has taken `behind_taken`
    // messages in all (the queue's length then), or drained the queue after
    // `behind_drained` (drained_polls_ then).
    bool behind = false;
    int64_t behind_at = 0;
    std::chrono::steady_clock::time_point behind_since;
    uint64_t behind_taken = 0;
    uint64_t behind_drained = 0;
    int jumps = 0;  // JumpPastLogStart jumps since the last message
    // The log start librdkafka last saw, first seen at `seen_at`; the answer that brought it
    // came after `seen_after` (the check before).
    int64_t seen_low = -1;
    std::chrono::steady_clock::time_point seen_after, seen_at;
    // The producers' rate: the log end last seen (`seen_high`); the end `rate_high` seen at
    // `rate_since` (negative: no window open); messages a second, the higher of the last two
    // windows (it varies from one to the next), measured at `rate_at` (negative: not yet).
    int64_t seen_high = -1;
    int64_t rate_high = -1;
    std::chrono::steady_clock::time_point rate_since;
    double rate = -1;
    double last_window_rate = -1;
    std::chrono::steady_clock::time_point rate_at;
    // Messages a second: the measured rate while it is trusted, else the log end's move since
    // `rate_since` if that is at least kRateProbe ago (from `high`, the end seen now);
    // negative: not known.
    double RateNow(int64_t high, std::chrono::steady_clock::time_point now) const {
      if (rate >= 0 && now - rate_at < kRateTrusted) return rate;
      if (rate_high < 0 || high <= rate_high || now - rate_since < kRateProbe) return -1;
      return static_cast<double>(high - rate_high) /
             std::chrono::duration<double>(now - rate_since).count();
    }
  };
  std::map<int32_t, PartitionProgress> progress_;  // telemetry partitions; inside Poll
  uint64_t taken_ = 0;          // messages (and errors) Poll took from the queue, in all
  uint64_t drained_polls_ = 0;  // Polls that took all the queue held
  std::chrono::steady_clock::time_point last_check_;  // CatchUpWithLogStarts' last run
  // The consumer's fetch.error.backoff.ms: how long after an out-of-range fetch librdkafka
  // fetches the partition again, whatever its position meanwhile (a seek does not shorten it);
  // and fetch.wait.max.ms: how long the broker may hold a fetch that finds nothing, before the
  // next fetch request (one at a time per broker) can carry a new position.
  std::chrono::milliseconds fetch_error_backoff_{500};
  std::chrono::milliseconds fetch_wait_max_{500};
  bool closed_ = false;
  absl::Status fatal_error_;
  int assigned_partitions_ = 0;  // written by OnRebalance, which runs inside Poll
  KafkaConsumerOptions options_;

  // Adds a telemetry partition a message came from to fetched_partitions_.
  void NoteFetchedPartition(int32_t partition);
  // When to wake the fetcher after the queue was read down; set up by Create.
  FetchRefill refill_{FetchQueueLimits{}};
  // The telemetry partitions any message came from (each once; fetched_ by id): the partitions
  // whose leaders' broker threads a wake-up goes to.
  std::vector<int32_t> fetched_partitions_;
  std::vector<bool> fetched_;
};

}  // namespace rankwatch
