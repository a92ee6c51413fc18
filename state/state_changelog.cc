#include "state/state_changelog.h"

#include <cstdlib>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <vector>

#include "kafka/client_factory.h"
#include "kafka/cluster_requests.h"

namespace rankwatch {
namespace {

void PutBigEndian(std::string* out, uint64_t v) {
  for (int shift = 56; shift >= 0; shift -= 8)
    out->push_back(static_cast<char>((v >> shift) & 0xff));
}

uint64_t GetBigEndian(const char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

std::string MarkerKey(char kind, uint64_t sequence) {
  std::string key(1, kind);
  PutBigEndian(&key, sequence);
  return key;
}

std::string FamilyKey(char kind, StateFamily family, const std::string& key) {
  std::string out(1, kind);
  out.push_back(static_cast<char>(family));
  out += key;
  return out;
}

// A client of the changelog: `defaults`, then the user's properties.
KafkaClientConfig ClientConfig(rd_kafka_type_t type, const StateChangelogOptions& options,
                               KafkaProperties defaults) {
  KafkaClientConfig config;
  config.type = type;
  config.name = "state changelog client";
  config.defaults = std::move(defaults);
  config.overrides = options.properties;
  return config;
}

// The partition count of `topic`, or -1 when it does not exist.
absl::StatusOr<int> PartitionCount(rd_kafka_t* rk, const std::string& topic) {
  // All topics' metadata: asking for one topic would make some brokers (the mock one among
  // them) create it with their default partition count.
  auto count =
      QueryPartitionCount(rk, topic, MetadataScope::kAllTopics, std::chrono::milliseconds(10'000));
  if (!count.ok()) {
    return absl::UnavailableError("state changelog: Kafka metadata for " + topic + ": " +
                                  std::string(count.status().message()));
  }
  return count;
}

// Creates the compacted topic, or checks the partition count of the existing one.
absl::Status EnsureTopic(rd_kafka_t* rk, const StateChangelogOptions& options) {
  auto count = PartitionCount(rk, options.topic);
  if (!count.ok()) return count.status();
  const int existing = *count;
  if (existing == options.partitions) return absl::OkStatus();
  if (existing > 0) {
    return absl::FailedPreconditionError(
        "state changelog topic " + options.topic + " has " + std::to_string(existing) +
        " partitions but the telemetry topic has " + std::to_string(options.partitions) +
        "; they must match (delete the changelog topic or name another one)");
  }
  const absl::Status created =
      CreateTopic(rk, options.topic, options.partitions, {{"cleanup.policy", "compact"}},
                  std::chrono::milliseconds(10'000));
  if (!created.ok()) {
    return absl::Status(created.code(), "state changelog: " + std::string(created.message()));
  }
  spdlog::info("state changelog: created topic {} ({} partitions, compacted)", options.topic,
               options.partitions);
  return absl::OkStatus();
}

void ApplyRecord(ChangelogPartition* state, const ChangelogRecord& record) {
  const auto family = static_cast<StateFamily>(record.key[1]);
  std::string state_key = record.key.substr(2);
  if (record.key[0] == 'k') {
    if (record.value) {
      state->values[{family, std::move(state_key)}] = *record.value;
    } else {
      state->values.erase({family, state_key});
    }
  } else if (record.value) {  // 'r': delete [state_key, *value)
    auto it = state->values.lower_bound({family, state_key});
    while (it != state->values.end() && it->first.first == family &&
           it->first.second < *record.value) {
      it = state->values.erase(it);
    }
  }
}

}  // namespace

std::vector<ChangelogRecord> ChangelogRecords(const Checkpoint& delta, int64_t next_offset,
                                              uint64_t sequence, bool full) {
  std::vector<ChangelogRecord> records;
  records.reserve(delta.ops().size() + 2);
  if (full) records.push_back({MarkerKey('b', sequence), std::nullopt});
  for (const Checkpoint::Op& op : delta.ops()) {
    if (op.deferred) {
      spdlog::critical("StateChangelog::Append: checkpoint not materialised");
      std::abort();
    }
    if (op.range_end) {
      records.push_back({FamilyKey('r', op.family, op.key), *op.range_end});
    } else {
      records.push_back({FamilyKey('k', op.family, op.key), op.value});
    }
  }
  std::string commit;
  PutBigEndian(&commit, static_cast<uint64_t>(next_offset));
  PutBigEndian(&commit, sequence);
  commit.push_back(full ? 1 : 0);
  records.push_back({MarkerKey('c', sequence), std::move(commit)});
  return records;
}

void ChangelogReader::Add(std::string_view key, std::optional<std::string_view> value) {
  if (key.empty()) {
    ++ignored_;
  } else if (key[0] == 'b') {
    pending_.emplace(Pending{true, {}});
  } else if (key[0] == 'c' && value && value->size() == 17) {
    const int64_t offset = static_cast<int64_t>(GetBigEndian(value->data()));
    const uint64_t sequence = GetBigEndian(value->data() + 8);
    const bool full = (*value)[16] != 0;
    if (pending_ && full && pending_->full) {
      state_.values.clear();
      state_.present = true;
    }
    if (pending_ && pending_->full == full && state_.present &&
        (full || sequence == state_.sequence + 1)) {
      for (const ChangelogRecord& r : pending_->records) ApplyRecord(&state_, r);
      state_.next_offset = offset;
      state_.sequence = sequence;
    }
    pending_.emplace(Pending{false, {}});  // deltas follow a commit directly
  } else if ((key[0] == 'k' || key[0] == 'r') && key.size() >= 2 &&
             static_cast<uint8_t>(key[1]) < kStateFamilyCount) {
    if (pending_) {
      pending_->records.push_back(
          {std::string(key), value ? std::optional<std::string>(*value) : std::nullopt});
    }
  } else {
    ++ignored_;  // not a record this build writes (an unknown family, a short commit)
  }
}

absl::StatusOr<std::unique_ptr<StateChangelog>> StateChangelog::Open(
    const StateChangelogOptions& options) {
  if (options.brokers.empty() || options.topic.empty() ||
      (options.partitions < 1 && options.source_topic.empty())) {
    return absl::InvalidArgumentError(
        "state changelog: brokers, topic and partitions (or a source topic) are required");
  }
  auto changelog = std::unique_ptr<StateChangelog>(new StateChangelog(options));
  KafkaClientConfig config = ClientConfig(
      RD_KAFKA_PRODUCER, options,
      {
          {"bootstrap.servers", options.brokers},
          {"client.id", "rankwatchd-changelog"},
          {"linger.ms", "2"},
          {"compression.codec", "lz4"},
          {"message.max.bytes", "16777216"},
          // Metadata requests must not create the topic with the broker's default partitions.
          {"allow.auto.create.topics", "false"},
      });
  SetIdempotentDelivery(&config.defaults);
  config.opaque = changelog.get();
  config.on_delivery = &StateChangelog::OnDelivery;
  auto producer = NewKafkaClient(config);
  if (!producer.ok()) return producer.status();
  changelog->producer_ = std::move(*producer);
  if (options.partitions < 1) {
    auto count = PartitionCount(changelog->producer_.get(), options.source_topic);
    if (!count.ok()) return count.status();
    if (*count < 1) {
      return absl::FailedPreconditionError("state changelog: the telemetry topic " +
                                           options.source_topic + " does not exist");
    }
    changelog->options_.partitions = *count;
  }
  if (absl::Status s = EnsureTopic(changelog->producer_.get(), changelog->options_); !s.ok()) {
    return s;
  }
  return changelog;
}

StateChangelog::StateChangelog(StateChangelogOptions options) : options_(std::move(options)) {}

StateChangelog::~StateChangelog() {
  if (producer_ == nullptr) return;
  rd_kafka_flush(producer_.get(), 5'000);
  producer_.reset();  // while failed_ and first_error_, which its delivery reports write, live
}

void StateChangelog::OnDelivery(rd_kafka_t*, const rd_kafka_message_t* m, void* opaque) {
  if (m->err == RD_KAFKA_RESP_ERR_NO_ERROR) return;
  auto* self = static_cast<StateChangelog*>(opaque);
  self->failed_.insert(m->partition);
  if (self->first_error_.empty()) self->first_error_ = rd_kafka_err2str(m->err);
}

void StateChangelog::Produce(int32_t partition, std::string key, const std::string* value) {
  void* payload = value != nullptr ? const_cast<char*>(value->data()) : nullptr;
  const size_t length = value != nullptr ? value->size() : 0;
  while (true) {
    const rd_kafka_resp_err_t e = rd_kafka_producev(
        producer_.get(), RD_KAFKA_V_TOPIC(options_.topic.c_str()), RD_KAFKA_V_PARTITION(partition),
        RD_KAFKA_V_KEY(key.data(), key.size()), RD_KAFKA_V_VALUE(payload, length),
        RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_END);
    if (e == RD_KAFKA_RESP_ERR_NO_ERROR) return;
    if (e != RD_KAFKA_RESP_ERR__QUEUE_FULL) {
      failed_.insert(partition);
      if (first_error_.empty()) first_error_ = rd_kafka_err2str(e);
      return;
    }
    rd_kafka_poll(producer_.get(), 10);  // the local queue is full: wait for deliveries
  }
}

void StateChangelog::Append(int32_t partition, const Checkpoint& delta, int64_t next_offset,
                            bool full) {
  PartitionLog& log = logs_[partition];
  const uint64_t sequence = ++log.sequence;
  size_t bytes = 0;
  for (const Checkpoint::Op& op : delta.ops()) {
    bytes += op.key.size() + (op.value ? op.value->size() : 0);
  }
  for (ChangelogRecord& r : ChangelogRecords(delta, next_offset, sequence, full)) {
    Produce(partition, std::move(r.key), r.value ? &*r.value : nullptr);
  }
  if (full) {
    log.needs_snapshot = false;
    log.bytes_since_snapshot = 0;
    log.last_snapshot_bytes = bytes;
  } else {
    log.bytes_since_snapshot += bytes;
  }
  rd_kafka_poll(producer_.get(), 0);
}

bool StateChangelog::NeedsSnapshot(int32_t partition) const {
  auto it = logs_.find(partition);
  if (it == logs_.end()) return true;
  const PartitionLog& log = it->second;
  return log.needs_snapshot || failed_.count(partition) != 0 ||
         log.bytes_since_snapshot >
             std::max(options_.snapshot_after_bytes, 2 * log.last_snapshot_bytes);
}

absl::Status StateChangelog::Flush(std::chrono::milliseconds timeout) {
  const rd_kafka_resp_err_t e = rd_kafka_flush(producer_.get(), static_cast<int>(timeout.count()));
  absl::Status status = absl::OkStatus();
  if (e != RD_KAFKA_RESP_ERR_NO_ERROR) {
    status = absl::UnavailableError(std::string("state changelog: flush: ") + rd_kafka_err2str(e));
  } else if (!failed_.empty()) {
    status = absl::UnavailableError("state changelog: delivery failed: " + first_error_);
  }
  for (int32_t p : failed_) logs_[p].needs_snapshot = true;
  failed_.clear();
  first_error_.clear();
  return status;
}

void StateChangelog::Release(int32_t partition) { logs_.erase(partition); }

absl::StatusOr<ChangelogPartition> StateChangelog::Read(int32_t partition) {
  auto client = NewKafkaClient(ClientConfig(
      RD_KAFKA_CONSUMER, options_,
      {
          {"bootstrap.servers", options_.brokers},
          {"client.id", "rankwatchd-changelog-reader"},
          {"group.id", "rankwatchd-changelog-reader"},  // required by librdkafka; never committed
          {"enable.auto.commit", "false"},
          {"enable.auto.offset.store", "false"},
          {"enable.partition.eof", "true"},
          {"fetch.wait.max.ms", "10"},
          {"allow.auto.create.topics", "false"},
      }));
  if (!client.ok()) return client.status();
  rd_kafka_t* rk = client->get();
  const std::string where =
      "state changelog " + options_.topic + " [" + std::to_string(partition) + "]";
  absl::Status status;
  ChangelogReader reader;
  auto bounds = QueryWatermarks(rk, options_.topic, partition, options_.read_timeout);
  if (!bounds.ok()) {
    status =
        absl::UnavailableError(where + ": watermarks: " + std::string(bounds.status().message()));
  } else if (bounds->high > bounds->low) {
    const int64_t high = bounds->high;
    KafkaPartitionList tps(rd_kafka_topic_partition_list_new(1));
    rd_kafka_topic_partition_list_add(tps.get(), options_.topic.c_str(), partition)->offset =
        bounds->low;
    rd_kafka_assign(rk, tps.get());
    const auto deadline = std::chrono::steady_clock::now() + options_.read_timeout;
    int64_t next = bounds->low;
    while (next < high && status.ok()) {
      if (std::chrono::steady_clock::now() > deadline) {
        status = absl::DeadlineExceededError(where + ": reading timed out at offset " +
                                             std::to_string(next) + " of " + std::to_string(high));
        break;
      }
      const KafkaMessagePtr m(rd_kafka_consumer_poll(rk, 100));
      if (m == nullptr) continue;
      if (m->err == RD_KAFKA_RESP_ERR__PARTITION_EOF) {
        next = std::max(next, m->offset);
      } else if (m->err != RD_KAFKA_RESP_ERR_NO_ERROR) {
        status = absl::UnavailableError(where + ": " + rd_kafka_message_errstr(m.get()));
      } else {
        next = m->offset + 1;
        std::optional<std::string_view> value;
        if (m->payload != nullptr) value.emplace(static_cast<const char*>(m->payload), m->len);
        reader.Add(std::string_view(static_cast<const char*>(m->key), m->key_len), value);
      }
    }
  }
  rd_kafka_consumer_close(rk);
  if (!status.ok()) return status;
  if (reader.ignored() > 0) {
    spdlog::warn("{}: {} records that this build does not write were ignored", where,
                 reader.ignored());
  }
  ChangelogPartition state = reader.state();
  PartitionLog& log = logs_[partition];
  log.sequence = std::max(log.sequence, state.sequence);
  log.needs_snapshot = true;
  return state;
}

}  // namespace rankwatch
