#include "ingest/kafka_consumer.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <vector>

#include "kafka/client_factory.h"
#include "kafka/cluster_requests.h"

namespace rankwatch {
namespace {

// A client's setting in milliseconds; `fallback` where it cannot be read.
std::chrono::milliseconds ConfMilliseconds(const rd_kafka_conf_t* conf, const char* name,
                                           std::chrono::milliseconds fallback) {
  char value[64];
  size_t size = sizeof(value);
  if (rd_kafka_conf_get(conf, name, value, &size) != RD_KAFKA_CONF_OK) return fallback;
  char* end = nullptr;
  const long long v = std::strtoll(value, &end, 10);
  return end != value && v >= 0 ? std::chrono::milliseconds(v) : fallback;
}

}  // namespace

absl::StatusOr<std::unique_ptr<KafkaConsumer>> KafkaConsumer::Create(
    const KafkaConsumerOptions& options) {
  if (options.brokers.empty()) return absl::InvalidArgumentError("no Kafka brokers given");
  // The rebalance callback needs the consumer object; it is created before the client.
  auto consumer = std::unique_ptr<KafkaConsumer>(new KafkaConsumer());
  consumer->options_ = options;
  KafkaClientConfig config;
  config.type = RD_KAFKA_CONSUMER;
  config.name = "kafka consumer";
  config.defaults = {
      {"bootstrap.servers", options.brokers},
      {"group.id", options.group},
      {"client.id", "rankwatchd"},
      // A position no longer in the log (retention deleted it): from the log start, as far as
      // librdkafka can tell (the start it saw in the failing fetch answer); the consumer jumps
      // further itself when producers move the start on meanwhile (CatchUpWithLogStarts).
      // Also where a partition assigned with neither a stored nor a committed offset begins
      // (StartPositions could not learn its log's end). Not "error": librdkafka 2.0 stops
      // fetching such a partition, and a seek cannot restart it (only an assignment can).
      {"auto.offset.reset", "earliest"},
      {"enable.auto.commit", "true"},
      {"enable.partition.eof", "false"},
      // A short fetch wait keeps diagnoses live, and librdkafka's mock broker (the development
      // broker) stalls fetching for seconds after idle periods with longer waits. Idle cost on
      // a real cluster: ~100 small fetch requests/s per broker. Override with kafka: in config.
      {"fetch.wait.max.ms", "10"},
      // After a failed fetch (an offset retention has deleted, a broker going away) librdkafka
      // waits this long before fetching that partition (or from that broker) again, whatever
      // its position meanwhile (default 500 ms; a seek does not shorten it). A position moved
      // past a log start that producers keep moving must be fetched before the start passes it
      // again: the development broker's 5 MiB a partition last ~50 ms at 2 M records/s, so a
      // jump must be fetched well within that (CatchUpWithLogStarts). The cost: a partition or
      // broker that keeps failing is retried up to 100 times a second.
      {"fetch.error.backoff.ms", "10"},
      // What a backlog (after a broker outage, a restart, a rebalance) may hold in memory before
      // the daemon takes it: librdkafka queues up to 64 MiB of messages ahead, and one fetch
      // answer may bring 50 MiB more (compressed) on top; 16 MiB ahead and 4 MiB a fetch here.
      // librdkafka 2.0 stops fetching when the queue is full and looks again only when its
      // broker thread wakes, up to 1 s later: a backlog went at one queue a second (0.43 M
      // records/s with 16 MiB in benchmarks/catchup.py). Poll wakes the broker threads once it
      // has read a full queue down to half (FetchRefill, ingest/fetch_refill.h): 16 MiB now
      // reads the backlog at about 2.2 M records/s. What then bounds the peak RSS is not the
      // queue but the state changes the daemon holds between checkpoints, which grow with the
      // rate it reads at: while behind, rankwatchd also checkpoints every 32 MiB read
      // (--checkpoint-input-mib; benchmarks/README.md, Catch-up; docs/operating.md, Memory).
      {"queued.max.messages.kbytes", "16384"},
      {"fetch.max.bytes", "4194304"},
      // A crashed instance's partitions move on after this long (librdkafka's default is 45 s).
      {"session.timeout.ms", std::to_string(options.session_timeout.count())},
      {"heartbeat.interval.ms",
       std::to_string(std::clamp<int64_t>(options.session_timeout.count() / 3, 100, 1000))},
      // Eager rebalancing: every rebalance revokes all partitions, which are checkpointed and
      // then restored from the local store or the changelog. With cooperative-sticky, Debian
      // 12's librdkafka (2.0.2) against the mock broker left the last messages of partitions
      // an instance kept through a rebalance unconsumed (tests/e2e/test_scale_out.py showed
      // it); the strategy can still be set under kafka: in the config.
      {"partition.assignment.strategy", "range,roundrobin"},
  };
  if (!options.instance_id.empty()) config.defaults["group.instance.id"] = options.instance_id;
  config.overrides = options.properties;
  config.opaque = consumer.get();
  config.on_rebalance = &KafkaConsumer::OnRebalance;
  auto client = NewKafkaClient(config);
  if (!client.ok()) return client.status();
  consumer->rk_ = std::move(*client);
  rd_kafka_t* rk = consumer->rk_.get();
  consumer->queue_.reset(rd_kafka_queue_get_consumer(rk));
  rd_kafka_poll_set_consumer(rk);
  consumer->refill_ = FetchRefill(FetchQueueLimitsOf(rk));
  consumer->fetch_error_backoff_ =
      ConfMilliseconds(rd_kafka_conf(rk), "fetch.error.backoff.ms", consumer->fetch_error_backoff_);
  consumer->fetch_wait_max_ =
      ConfMilliseconds(rd_kafka_conf(rk), "fetch.wait.max.ms", consumer->fetch_wait_max_);
  KafkaPartitionList topics(rd_kafka_topic_partition_list_new(1));
  rd_kafka_topic_partition_list_add(topics.get(), options.topic.c_str(), RD_KAFKA_PARTITION_UA);
  const rd_kafka_resp_err_t e = rd_kafka_subscribe(rk, topics.get());
  if (e != RD_KAFKA_RESP_ERR_NO_ERROR) {
    return absl::UnavailableError(std::string("subscribe to ") + options.topic + ": " +
                                  rd_kafka_err2str(e));
  }
  return consumer;
}

KafkaConsumer::~KafkaConsumer() {
  if (rk_ == nullptr) return;
  Close();
  // While every member is still alive: librdkafka may call back into this object until then.
  queue_.reset();
  rk_.reset();
}

void KafkaConsumer::OnRebalance(rd_kafka_t* rk, rd_kafka_resp_err_t err,
                                rd_kafka_topic_partition_list_t* partitions, void* opaque) {
  auto* self = static_cast<KafkaConsumer*>(opaque);
  const bool cooperative = std::string_view(rd_kafka_rebalance_protocol(rk)) == "COOPERATIVE";
  std::map<std::string, std::vector<int>> by_topic;  // element indexes
  for (int i = 0; i < partitions->cnt; ++i) by_topic[partitions->elems[i].topic].push_back(i);
  if (err == RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS) {
    // Offsets are state: start where the daemon's own checkpoint says, not where Kafka's
    // committed offsets (kept for lag monitoring) say.
    for (const auto& [topic, indexes] : by_topic) {
      std::vector<int32_t> ids;
      for (int i : indexes) ids.push_back(partitions->elems[i].partition);
      const std::vector<std::optional<int64_t>> offsets =
          self->options_.on_assigned ? self->options_.on_assigned(topic, ids)
                                     : std::vector<std::optional<int64_t>>();
      const bool telemetry = topic == self->options_.topic;
      for (int32_t id : ids) {
        if (telemetry) {
          self->next_offset_.erase(id);
          self->input_start_.erase(id);
          self->progress_.erase(id);
        }
      }
      std::vector<int32_t> unstored;
      for (size_t k = 0; k < indexes.size(); ++k) {
        rd_kafka_topic_partition_t& tp = partitions->elems[indexes[k]];
        if (k >= offsets.size() || !offsets[k]) {
          unstored.push_back(tp.partition);
          continue;
        }
        tp.offset = *offsets[k];
        if (telemetry) self->next_offset_[tp.partition] = *offsets[k];
        spdlog::info("kafka: {} [{}] resumes at stored offset {}", tp.topic, tp.partition,
                     *offsets[k]);
      }
      // Before the partitions are assigned, so before anything is fetched: a burst that moves a
      // log's start past where this member's input begins is a loss from the first read on.
      if (telemetry && !unstored.empty()) {
        for (const auto& [id, start] : self->StartPositions(unstored)) {
          self->next_offset_[id] = start;
          self->input_start_[id] = start;
          if (self->options_.on_start) self->options_.on_start(topic, id, start);
        }
      }
    }
    if (cooperative) {
      if (KafkaError e{rd_kafka_incremental_assign(rk, partitions)}) {
        spdlog::error("kafka incremental assign: {}", rd_kafka_error_string(e.get()));
      }
      self->assigned_partitions_ += partitions->cnt;
    } else {
      rd_kafka_assign(rk, partitions);
      self->assigned_partitions_ = partitions->cnt;
    }
    spdlog::info("kafka: assigned {} partitions (now {})", partitions->cnt,
                 self->assigned_partitions_);
  } else {
    for (const auto& [topic, indexes] : by_topic) {
      if (!self->options_.on_revoked) break;
      std::vector<int32_t> ids;
      for (int i : indexes) ids.push_back(partitions->elems[i].partition);
      for (int32_t id : ids) {
        if (topic == self->options_.topic) {
          self->next_offset_.erase(id);
          self->input_start_.erase(id);
          self->progress_.erase(id);
        }
      }
      self->options_.on_revoked(topic, ids);
    }
    if (cooperative) {
      if (KafkaError e{rd_kafka_incremental_unassign(rk, partitions)}) {
        spdlog::error("kafka incremental unassign: {}", rd_kafka_error_string(e.get()));
      }
      self->assigned_partitions_ -= partitions->cnt;
    } else {
      rd_kafka_assign(rk, nullptr);
      self->assigned_partitions_ = 0;
    }
    spdlog::info("kafka: revoked {} partitions (now {})", partitions->cnt,
                 self->assigned_partitions_);
  }
}

void KafkaConsumer::Close() {
  if (closed_) return;
  closed_ = true;
  if (rd_kafka_resp_err_t e = rd_kafka_consumer_close(rk_.get()); e != RD_KAFKA_RESP_ERR_NO_ERROR) {
    spdlog::warn("closing the Kafka consumer: {}", rd_kafka_err2str(e));
  }
}

std::map<int32_t, int64_t> KafkaConsumer::StartPositions(const std::vector<int32_t>& partitions) {
  std::map<int32_t, int64_t> out;
  const char* topic = options_.topic.c_str();
  const int timeout_ms = static_cast<int>(kStartQueryTimeout.count());
  // The group's committed offsets: where librdkafka starts reading when none is stored.
  KafkaPartitionList committed(
      rd_kafka_topic_partition_list_new(static_cast<int>(partitions.size())));
  for (int32_t p : partitions) rd_kafka_topic_partition_list_add(committed.get(), topic, p);
  const rd_kafka_resp_err_t committed_err =
      rd_kafka_committed(rk_.get(), committed.get(), timeout_ms);
  if (committed_err != RD_KAFKA_RESP_ERR_NO_ERROR) {
    spdlog::warn(
        "kafka: the group's committed offsets of {} could not be read ({}): input is taken to "
        "begin at the log's end",
        topic, rd_kafka_err2str(committed_err));
  }
  // The others begin where their logs end now: ListOffsets with the "latest" timestamp (-1).
  KafkaPartitionList ends(rd_kafka_topic_partition_list_new(static_cast<int>(partitions.size())));
  for (int i = 0; i < committed->cnt; ++i) {
    const rd_kafka_topic_partition_t& tp = committed->elems[i];
    if (committed_err == RD_KAFKA_RESP_ERR_NO_ERROR && tp.err == RD_KAFKA_RESP_ERR_NO_ERROR &&
        tp.offset >= 0) {
      out[tp.partition] = tp.offset;
    } else {
      rd_kafka_topic_partition_list_add(ends.get(), topic, tp.partition)->offset =
          RD_KAFKA_OFFSET_END;
    }
  }
  const size_t from_committed = out.size();
  if (ends->cnt > 0) {
    const rd_kafka_resp_err_t e = rd_kafka_offsets_for_times(rk_.get(), ends.get(), timeout_ms);
    std::vector<int32_t> unknown;
    for (int i = 0; i < ends->cnt; ++i) {
      const rd_kafka_topic_partition_t& tp = ends->elems[i];
      if (e == RD_KAFKA_RESP_ERR_NO_ERROR && tp.err == RD_KAFKA_RESP_ERR_NO_ERROR &&
          tp.offset >= 0) {
        out[tp.partition] = tp.offset;
      } else {
        unknown.push_back(tp.partition);
      }
    }
    if (!unknown.empty()) {
      spdlog::warn(
          "kafka: where the logs of {} partitions of {} end could not be read ({}): messages "
          "lost there before the first read go uncounted",
          unknown.size(), topic,
          rd_kafka_err2str(e != RD_KAFKA_RESP_ERR_NO_ERROR ? e : RD_KAFKA_RESP_ERR__TIMED_OUT));
    }
  }
  for (const auto& [partition, start] : out) {
    spdlog::debug("kafka: {} [{}] has no stored offset; its input begins at offset {}", topic,
                  partition, start);
  }
  spdlog::info(
      "kafka: {} partitions of {} without a stored offset: input begins at the group's committed "
      "offset in {}, at the log's end now in {}",
      partitions.size(), topic, from_committed, out.size() - from_committed);
  return out;
}

void KafkaConsumer::ReportLoss(const char* topic, int32_t partition, int64_t expected, int64_t got,
                               const std::string& where) {
  // Messages from before this member's input began (older history it reads from the log's
  // start) are not its loss.
  if (auto start = input_start_.find(partition); start != input_start_.end()) {
    expected = std::max(expected, start->second);
  }
  if (got <= expected) return;
  if (topic == options_.topic) progress_[partition].last_loss = std::chrono::steady_clock::now();
  spdlog::warn(
      "kafka: {} [{}] lost {} messages: the consumer should have read offset {} next, the "
      "broker's log {} (retention deleted them before they were read: a consumer lagging behind "
      "its producers, or a broker keeping too little); the diagnoses of the jobs on this "
      "partition miss their steps",
      topic, partition, got - expected, expected, where);
  const std::optional<Watermarks> bounds = CachedWatermarks(rk_.get(), topic, partition);
  if (options_.on_lost) {
    options_.on_lost(topic, partition, expected, got, bounds ? std::max(bounds->high, got) : got);
  }
}

void KafkaConsumer::CheckContinuity(const rd_kafka_message_t* m) {
  auto it = next_offset_.find(m->partition);
  if (it != next_offset_.end() && m->offset > it->second) {
    const int64_t expected = it->second;
    // A gap in the offsets is a loss when the broker no longer has the messages: its log now
    // starts past them. Offsets a log keeps but never hands out (transaction markers,
    // compacted keys) are not. When the log start is not known, the gap counts as lost.
    const std::optional<Watermarks> bounds =
        CachedWatermarks(rk_.get(), rd_kafka_topic_name(m->rkt), m->partition);
    if (!bounds || bounds->low > expected) {
      const int64_t got = bounds ? std::min(m->offset, bounds->low) : m->offset;
      ReportLoss(rd_kafka_topic_name(m->rkt), m->partition, expected, got,
                 bounds ? "now starts at offset " + std::to_string(bounds->low)
                        : "went on at offset " + std::to_string(m->offset));
    }
  }
  next_offset_[m->partition] = m->offset + 1;
}

void KafkaConsumer::CatchUpWithLogStarts(size_t taken, bool drained) {
  taken_ += taken;
  if (drained) ++drained_polls_;
  const auto now = std::chrono::steady_clock::now();
  const auto before = last_check_ == std::chrono::steady_clock::time_point{} ? now : last_check_;
  last_check_ = now;
  for (const auto& [partition, expected] : next_offset_) {
    // The bounds librdkafka last saw in a fetch answer (no request), read before the queue's
    // length below: the answer that set them came after every earlier answer's messages were
    // queued.
    const std::optional<Watermarks> bounds = CachedWatermarks(rk_.get(), options_.topic, partition);
    PartitionProgress& progress = progress_[partition];
    if (bounds && bounds->high >= bounds->low) {
      if (bounds->low != progress.seen_low) {
        progress.seen_low = bounds->low;
        progress.seen_after = before;
        progress.seen_at = now;
      }
      // The producers' rate, from the log end as first seen after each answer: an answer came
      // after the check before, so a sample taken long after that one is not used.
      if (bounds->high != progress.seen_high) {
        progress.seen_high = bounds->high;
        if (now - before > kSampleAge) {
          progress.rate_high = -1;  // the next answer starts a window
        } else if (progress.rate_high < 0 || bounds->high < progress.rate_high ||
                   now - progress.rate_since > kRateWindowMax) {
          // A new window: the first, after the log was replaced, or after the end stood still
          // (idle producers: an average over their pause would not be their rate now).
          progress.rate_high = bounds->high;
          progress.rate_since = now;
        } else if (now - progress.rate_since >= kRateWindow) {
          const double seconds = std::chrono::duration<double>(now - progress.rate_since).count();
          const double rate = static_cast<double>(bounds->high - progress.rate_high) / seconds;
          progress.rate = std::max(
              rate, progress.rate_at + kRateTrusted > now ? progress.last_window_rate : -1.0);
          progress.last_window_rate = rate;
          progress.rate_at = now;
          progress.rate_high = bounds->high;
          progress.rate_since = now;
        }
      }
    }
    if (!bounds || bounds->low <= expected || bounds->high < bounds->low) {
      progress.behind = false;
      continue;
    }
    // The log starts past the next offset: the message there is queued (fetched before it was
    // deleted), or lost, and then so is the position librdkafka fetches at.
    if (!progress.behind || progress.behind_at != expected) {
      progress.behind = true;
      progress.behind_at = expected;
      progress.behind_since = now;
      progress.behind_drained = drained_polls_;
      const auto queued = static_cast<uint64_t>(rd_kafka_queue_length(queue_.get()));
      progress.behind_taken = taken_ + queued;
      if (queued > 0) continue;
    } else if (taken_ < progress.behind_taken && drained_polls_ == progress.behind_drained &&
               now - progress.behind_since < kStuckAfter) {
      continue;  // it may still be in the queue
    }
    if (progress.RateNow(bounds->high, now) < 0 &&
        now - progress.behind_since < fetch_error_backoff_ + fetch_wait_max_ + kFetchSlack) {
      continue;  // librdkafka's own reset reads on if the start has stopped moving
    }
    JumpPastLogStart(partition, expected, *bounds, now);
  }
}

void KafkaConsumer::JumpPastLogStart(int32_t partition, int64_t expected, const Watermarks& cached,
                                     std::chrono::steady_clock::time_point now) {
  PartitionProgress& progress = progress_[partition];
  progress.behind = false;
  const double rate = progress.RateNow(cached.high, now);
  const bool rate_known = rate >= 0;
  // Until the fetch: the watermarks' age (at most), librdkafka's backoff after the fetch that
  // failed, the fetch the broker may be holding, the way there.
  const std::chrono::duration<double> until_fetch =
      (now - progress.seen_after) + fetch_error_backoff_ + fetch_wait_max_ + kFetchSlack;
  double margin = rate_known ? kMarginFactor * rate * until_fetch.count()
                             : kResetMargin * static_cast<double>(cached.high - cached.low);
  margin *= static_cast<double>(1 << std::min(progress.jumps, 8));
  // At most to where the log ends now: the cached end, moved on by the producers' rate over
  // the watermarks' age (at least).
  const double end =
      static_cast<double>(cached.high) +
      (rate_known ? rate * std::chrono::duration<double>(now - progress.seen_at).count() : 0.0);
  const int64_t target = static_cast<int64_t>(
      std::ceil(std::min(static_cast<double>(cached.low) + margin, std::floor(end))));
  // Synchronous: once it returns, librdkafka hands out nothing fetched before it (its
  // messages carry the old version and are dropped).
  KafkaPartitionList list(rd_kafka_topic_partition_list_new(1));
  rd_kafka_topic_partition_list_add(list.get(), options_.topic.c_str(), partition)->offset = target;
  KafkaError e{
      rd_kafka_seek_partitions(rk_.get(), list.get(), static_cast<int>(kSeekTimeout.count()))};
  const rd_kafka_resp_err_t err = e ? rd_kafka_error_code(e.get()) : list->elems[0].err;
  if (err != RD_KAFKA_RESP_ERR_NO_ERROR) {
    spdlog::error("kafka: {} [{}] seek to offset {}: {}", options_.topic, partition, target,
                  e ? rd_kafka_error_string(e.get()) : rd_kafka_err2str(err));
    // Tried again after kStuckAfter.
    progress.behind = true;
    progress.behind_at = expected;
    progress.behind_since = now;
    progress.behind_taken = UINT64_MAX;
    progress.behind_drained = UINT64_MAX;
    return;
  }
  spdlog::debug(
      "kafka: {} [{}] jumps to offset {}: the log was at {}-{} {:.0f} ms ago at most, producers "
      "add {:.0f} messages a second",
      options_.topic, partition, target, cached.low, cached.high,
      std::chrono::duration<double, std::milli>(now - progress.seen_after).count(), rate);
  ++progress.jumps;
  ReportLoss(options_.topic.c_str(), partition, expected, target,
             "now starts at offset " + std::to_string(cached.low) + "; reading resumes at offset " +
                 std::to_string(target));
  next_offset_[partition] = target;
}

std::vector<KafkaConsumer::PartitionLag> KafkaConsumer::PartitionLags(
    std::chrono::steady_clock::duration losing_window) const {
  const auto now = std::chrono::steady_clock::now();
  std::vector<PartitionLag> out;
  out.reserve(next_offset_.size());
  for (const auto& [partition, next] : next_offset_) {
    PartitionLag lag;
    lag.partition = partition;
    if (const std::optional<Watermarks> bounds =
            CachedWatermarks(rk_.get(), options_.topic, partition);
        bounds && bounds->high >= 0) {
      lag.messages = std::max<int64_t>(0, bounds->high - next);
    }
    if (auto p = progress_.find(partition); p != progress_.end()) {
      lag.losing = p->second.last_loss != std::chrono::steady_clock::time_point{} &&
                   now - p->second.last_loss < losing_window;
    }
    out.push_back(lag);
  }
  return out;
}

size_t KafkaConsumer::Poll(std::chrono::milliseconds timeout, size_t max_messages,
                           const std::function<void(const KafkaMessage&)>& on_message) {
  return PollBatch(timeout, max_messages, [&](const std::vector<KafkaMessage>& messages) {
    for (const KafkaMessage& m : messages) on_message(m);
  });
}

size_t KafkaConsumer::PollBatch(
    std::chrono::milliseconds timeout, size_t max_messages,
    const std::function<void(const std::vector<KafkaMessage>&)>& on_messages) {
  if (max_messages == 0) return 0;
  std::vector<rd_kafka_message_t*> messages(max_messages);
  // A batch read waits for a full batch or the timeout, which would hold messages that have
  // arrived for up to `timeout`: take what is there, and wait only when nothing is.
  ssize_t n = rd_kafka_consume_batch_queue(queue_.get(), 0, messages.data(), max_messages);
  if (n == 0) {
    if (rd_kafka_message_t* first =
            rd_kafka_consume_queue(queue_.get(), static_cast<int>(timeout.count()))) {
      messages[0] = first;
      const ssize_t more =
          max_messages > 1
              ? rd_kafka_consume_batch_queue(queue_.get(), 0, messages.data() + 1, max_messages - 1)
              : 0;
      n = 1 + std::max<ssize_t>(more, 0);
    }
  }
  if (n < 0) {
    spdlog::warn("kafka consume: {}", rd_kafka_err2str(rd_kafka_last_error()));
    return 0;
  }
  size_t handled = 0;
  size_t payload_bytes = 0;
  std::vector<KafkaMessagePtr> owned;  // the messages handed out, alive until they are handled
  owned.reserve(static_cast<size_t>(std::max<ssize_t>(n, 0)));
  std::vector<KafkaMessage> batch;
  auto hand_out = [&] {
    if (!batch.empty()) on_messages(batch);
    handled += batch.size();
    batch.clear();
  };
  for (ssize_t i = 0; i < n; ++i) {
    owned.emplace_back(messages[i]);
    const rd_kafka_message_t* m = owned.back().get();
    if (m->err == RD_KAFKA_RESP_ERR__FATAL) {
      char reason[512];
      const rd_kafka_resp_err_t e = rd_kafka_fatal_error(rk_.get(), reason, sizeof(reason));
      std::string text = std::string(rd_kafka_err2name(e)) + ": " + reason;
      if (e == RD_KAFKA_RESP_ERR_FENCED_INSTANCE_ID) {
        text += " (another member of group " + options_.group + " uses group.instance.id " +
                options_.instance_id + ": give each instance its own)";
      }
      if (fatal_error_.ok()) spdlog::critical("kafka consumer stopped by a fatal error: {}", text);
      fatal_error_ = absl::FailedPreconditionError("kafka consumer: " + text);
    } else if (m->err != RD_KAFKA_RESP_ERR_NO_ERROR) {
      spdlog::warn("kafka consumer: {}", rd_kafka_message_errstr(m));
    } else {
      KafkaMessage msg;
      msg.payload = std::string_view(static_cast<const char*>(m->payload), m->len);
      msg.key = std::string_view(static_cast<const char*>(m->key), m->key_len);
      msg.partition = m->partition;
      msg.offset = m->offset;
      payload_bytes += m->len;
      if (rd_kafka_topic_name(m->rkt) == options_.topic) {
        NoteFetchedPartition(m->partition);
        // A gap may be reported as a loss: what came before it is handled first.
        if (auto it = next_offset_.find(m->partition);
            it != next_offset_.end() && m->offset > it->second) {
          hand_out();
        }
        CheckContinuity(m);
        progress_[m->partition].jumps = 0;
      }
      batch.push_back(msg);
    }
  }
  hand_out();
  CatchUpWithLogStarts(static_cast<size_t>(std::max<ssize_t>(n, 0)),
                       n >= 0 && static_cast<size_t>(n) < max_messages);
  if (refill_.Taken(static_cast<size_t>(std::max<ssize_t>(n, 0)), payload_bytes,
                    static_cast<size_t>(rd_kafka_queue_length(queue_.get())))) {
    WakeFetchers(rk_.get(), options_.topic, fetched_partitions_);
    spdlog::debug("kafka: the consumer queue was full and is read down to half: fetcher wake-up {}",
                  refill_.wakeups());
  }
  return handled;
}

void KafkaConsumer::NoteFetchedPartition(int32_t partition) {
  if (partition < 0) return;
  const auto index = static_cast<size_t>(partition);
  if (index >= fetched_.size()) fetched_.resize(index + 1, false);
  if (fetched_[index]) return;
  fetched_[index] = true;
  fetched_partitions_.push_back(partition);
}

}  // namespace rankwatch
