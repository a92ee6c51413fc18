// StateChangelog: a copy of the daemon's durable state in a Kafka topic, one changelog
// partition per telemetry partition, so that the state of a partition that moves to another
// daemon instance (rebalance, crash) comes back exactly there — as Kafka Streams does.
//
// Each checkpoint of a partition appends its writes and then a commit record carrying the next
// telemetry offset it covers and a sequence number. A reader applies only whole checkpoints
// (records after the last commit are an unfinished checkpoint and ignored), and only an
// unbroken sequence of them. Now and then a writer appends a full snapshot of the partition
// (a begin record, every key, a commit): readers start over at it, which keeps a log that is
// not compacted (librdkafka's mock broker keeps 5 MiB per partition) readable after its
// oldest records were deleted. On a compacted topic (what the daemon creates) the latest value
// of every key survives, so the log stays readable either way.
//
// Record keys: 'k' family key = put (a null value deletes), 'r' family begin = delete up to
// the value, 'b' = a full snapshot starts, 'c' = commit (value: 8-byte big-endian next offset,
// 8-byte sequence, 1 byte full flag).
//
// Not thread-safe: one thread at a time. In rankwatchd (runtime/task_manager.h) Append and
// NeedsSnapshot run on the checkpoint writer thread, right after the commit they cover; Read,
// Release and Flush run on the ingest thread, and only while the writer is drained.
#pragma once

#include <librdkafka/rdkafka.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kafka/handles.h"
#include "kafka/kafka_properties.h"
#include "state/state_store.h"

namespace rankwatch {

struct StateChangelogOptions {
  std::string brokers;  // bootstrap list (required)
  std::string topic;    // changelog topic, e.g. "rankwatch.telemetry.changelog" (required)
  // Must equal the telemetry topic's partition count; 0: read it from `source_topic`.
  int32_t partitions = 0;
  std::string source_topic;
  KafkaProperties properties;  // passed through to librdkafka (security settings)
  // A partition gets a full snapshot again once this many bytes of deltas followed the last
  // one. Default: 1 MiB (well under the mock broker's 5 MiB per partition).
  size_t snapshot_after_bytes = 1 << 20;
  // Bound on reading one changelog partition. Default: 30 s.
  std::chrono::milliseconds read_timeout{30'000};
};

// The state of one partition as the changelog has it.
struct ChangelogPartition {
  bool present = false;     // false: the changelog has no whole checkpoint of the partition
  int64_t next_offset = 0;  // telemetry offset the state covers (consume from here)
  uint64_t sequence = 0;    // of the last applied checkpoint
  std::map<std::pair<StateFamily, std::string>, std::string> values;
};

// One changelog record: a Kafka message's key and value (nullopt: a null value, a deletion).
struct ChangelogRecord {
  std::string key;
  std::optional<std::string> value;
};

// The records one checkpoint of a partition appends (a begin record when `full`, every write of
// the materialised `delta`, the commit record with `next_offset` and `sequence`).
std::vector<ChangelogRecord> ChangelogRecords(const Checkpoint& delta, int64_t next_offset,
                                              uint64_t sequence, bool full);

// Rebuilds a partition's state from its records, read in log order. The records are outside
// input (any producer can write to the topic): a record that is not whole, or that names a
// state family this build does not have, is ignored and counted in `ignored()`; only whole
// checkpoints in an unbroken sequence (or a full snapshot) are applied, so what comes out can
// be committed to the StateStore as it is.
class ChangelogReader {
 public:
  void Add(std::string_view key, std::optional<std::string_view> value);
  const ChangelogPartition& state() const { return state_; }
  uint64_t ignored() const { return ignored_; }

 private:
  struct Pending {  // (no member initialisers: clang then rejects optional<Pending>::emplace)
    bool full;
    std::vector<ChangelogRecord> records;
  };
  ChangelogPartition state_;
  std::optional<Pending> pending_;
  uint64_t ignored_ = 0;
};

class StateChangelog {
 public:
  // Connects, and creates the topic (compacted, `partitions` partitions) when it is missing.
  // A topic with another partition count is FailedPrecondition.
  static absl::StatusOr<std::unique_ptr<StateChangelog>> Open(const StateChangelogOptions& options);
  ~StateChangelog();
  StateChangelog(const StateChangelog&) = delete;
  StateChangelog& operator=(const StateChangelog&) = delete;

  // Appends one checkpoint of `partition`. `delta` holds its writes since the previous
  // checkpoint; when the partition needs a full snapshot (see NeedsSnapshot) the caller passes
  // the whole state instead, with `full` = true. Asynchronous: Flush waits for delivery.
  void Append(int32_t partition, const Checkpoint& delta, int64_t next_offset, bool full);

  // Whether the next Append for `partition` must be a full snapshot: first write since this
  // instance took the partition, enough delta bytes since the last one, or a failed delivery.
  bool NeedsSnapshot(int32_t partition) const;

  // Waits until everything appended is delivered. A failed delivery is an error (and forces a
  // full snapshot of that partition next time).
  absl::Status Flush(std::chrono::milliseconds timeout);

  // Reads `partition` from its oldest record to its end. Continues the sequence from there:
  // this instance's next Append of the partition will be a full snapshot.
  absl::StatusOr<ChangelogPartition> Read(int32_t partition);

  // Forgets what this instance wrote to `partition` (it moved away).
  void Release(int32_t partition);

  const std::string& topic() const { return options_.topic; }

 private:
  struct PartitionLog {
    uint64_t sequence = 0;
    size_t bytes_since_snapshot = 0;
    size_t last_snapshot_bytes = 0;
    bool needs_snapshot = true;
  };
  explicit StateChangelog(StateChangelogOptions options);
  void Produce(int32_t partition, std::string key, const std::string* value);
  static void OnDelivery(rd_kafka_t* rk, const rd_kafka_message_t* m, void* opaque);

  StateChangelogOptions options_;
  KafkaClient producer_;
  std::map<int32_t, PartitionLog> logs_;
  std::set<int32_t> failed_;  // partitions with a failed delivery since the last Flush
  std::string first_error_;
};

}  // namespace rankwatch
