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

  // Leaves the group (commits final offsets). Idempotent; the destructor calls it.
  void Close();

  // Partitions currently assigned to this member by the group (0 until the first join).
  int assigned_partitions() const { return assigned_partitions_; }

  // A fatal consumer error (librdkafka's: e.g. another member with this group.instance.id
  // fenced this one), after which the consumer reads nothing more; OK while there is none.
  const absl::Status& fatal_error() const { return fatal_error_; }

  // Times Poll woke librdkafka's fetcher after reading down a full queue (FetchRefill).
  uint64_t fetch_wakeups() const { return refill_.wakeups(); }

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
  // Every kStuckCheckInterval: a partition whose position the broker's log has started past
  // for kStuckAfter, with no message read meanwhile, is moved a little past the log start
  // (librdkafka's own reset to the log start it cached can repeat for minutes while producers
  // move the start on); the messages skipped are reported as lost.
  void RecoverStuckPartitions();
  // Logs one warning for a loss of [expected, got) and calls on_lost.
  void ReportLoss(const char* topic, int32_t partition, int64_t expected, int64_t got,
                  const std::string& where);

  static constexpr std::chrono::milliseconds kStartQueryTimeout{10000};
  static constexpr std::chrono::milliseconds kStuckCheckInterval{250};
  static constexpr std::chrono::milliseconds kStuckAfter{1000};
  // A stuck partition resumes this fraction of the retained log past its start (doubled for
  // each seek in a row that read nothing).
  static constexpr double kResetMargin = 0.1;

  KafkaClient rk_;    // outlives queue_
  KafkaQueue queue_;  // the consumer queue, read by Poll
  // Per partition: the next offset the consumer should read, once known (the stored offset it
  // resumes at, or the offset after the last message handed out). Written inside Poll.
  std::map<int32_t, int64_t> next_offset_;
  // Per partition assigned without a stored offset: where this member's input begins
  // (StartPositions). Gaps before it are not losses. Written inside Poll.
  std::map<int32_t, int64_t> input_start_;
  struct PartitionProgress {
    std::chrono::steady_clock::time_point last_message;  // the last handed out
    std::chrono::steady_clock::time_point behind_since;  // the log start past the position
    int seeks = 0;  // RecoverStuckPartitions seeks since the last message
  };
  std::map<int32_t, PartitionProgress> progress_;  // telemetry partitions; inside Poll
  std::chrono::steady_clock::time_point next_stuck_check_;
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
