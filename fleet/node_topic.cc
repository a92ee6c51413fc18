#include "fleet/node_topic.h"

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <map>

#include "kafka/client_factory.h"
#include "kafka/cluster_requests.h"
#include "spdlog/spdlog.h"

namespace rankwatch {
namespace {

KafkaClientConfig ClientConfig(rd_kafka_type_t type, const NodeTopicOptions& options,
                               KafkaProperties defaults) {
  KafkaClientConfig config;
  config.type = type;
  config.name = "nodes topic client";
  config.defaults = std::move(defaults);
  config.overrides = options.properties;
  return config;
}

}  // namespace

NodeTopic::NodeTopic(NodeTopicOptions options, NodeLedger* ledger)
    : options_(std::move(options)), ledger_(ledger) {}

absl::StatusOr<std::unique_ptr<NodeTopic>> NodeTopic::Open(const NodeTopicOptions& options,
                                                           NodeLedger* ledger) {
  if (options.brokers.empty() || options.topic.empty() || ledger == nullptr) {
    return absl::InvalidArgumentError("nodes topic: brokers, topic and a ledger are required");
  }
  auto topic = std::unique_ptr<NodeTopic>(new NodeTopic(options, ledger));
  KafkaClientConfig config = ClientConfig(RD_KAFKA_PRODUCER, options,
                                          {
                                              {"bootstrap.servers", options.brokers},
                                              {"client.id", "rankwatchd-nodes"},
                                              {"linger.ms", "50"},
                                              {"queue.buffering.max.messages", "100000"},
                                              {"allow.auto.create.topics", "false"},
                                          });
  SetIdempotentDelivery(&config.defaults);
  config.opaque = topic.get();
  config.on_delivery = &NodeTopic::OnDelivery;
  auto producer = NewKafkaClient(config);
  if (!producer.ok()) return producer.status();
  topic->producer_ = std::move(*producer);
  rd_kafka_t* rk = topic->producer_.get();
  // All topics' metadata: asking for one would make some brokers create it with their default.
  auto count =
      QueryPartitionCount(rk, options.topic, MetadataScope::kAllTopics, options.request_timeout);
  if (!count.ok()) {
    return absl::UnavailableError("nodes topic: Kafka metadata for " + options.topic + ": " +
                                  std::string(count.status().message()));
  }
  if (*count < 1) {
    absl::Status created = CreateTopic(rk, options.topic, std::max(1, options.partitions),
                                       {{"cleanup.policy", "compact"}}, options.request_timeout);
    if (!created.ok()) {
      return absl::Status(created.code(), "nodes topic: " + std::string(created.message()));
    }
    spdlog::info("nodes topic: created {} ({} partitions, compacted)", options.topic,
                 std::max(1, options.partitions));
  }
  if (!options.telemetry_topic.empty()) {
    auto telemetry = QueryPartitionCount(rk, options.telemetry_topic, MetadataScope::kAllTopics,
                                         options.request_timeout);
    if (telemetry.ok() && *telemetry > 0) topic->telemetry_partitions_ = *telemetry;
  }
  ledger->EnableOutbox();
  topic->reader_ = std::thread([t = topic.get()] { t->ReadLoop(); });
  return topic;
}

NodeTopic::~NodeTopic() {
  stop_ = true;
  if (reader_.joinable()) reader_.join();
  if (producer_ != nullptr) rd_kafka_flush(producer_.get(), 5000);
}

void NodeTopic::OnDelivery(rd_kafka_t*, const rd_kafka_message_t* m, void* opaque) {
  auto* self = static_cast<NodeTopic*>(opaque);
  const auto generation = static_cast<uint64_t>(reinterpret_cast<uintptr_t>(m->_private));
  const std::string key(static_cast<const char*>(m->key), m->key_len);
  std::string node, job;
  int64_t last_unix_ns = 0;
  {
    std::lock_guard lock(self->mu_);
    auto it = self->outstanding_.find(key);
    const bool newest = it != self->outstanding_.end() && it->second.generation == generation;
    if (m->err == RD_KAFKA_RESP_ERR_NO_ERROR) {
      self->published_.fetch_add(1, std::memory_order_relaxed);
      if (!newest) return;  // a newer record of the key is on its way
      node = std::move(it->second.node);
      job = std::move(it->second.job);
      last_unix_ns = it->second.last_unix_ns;
      self->outstanding_.erase(it);
    } else {
      if (!newest) return;  // superseded: the newer record replaces it
      it->second.in_flight = false;
      self->FailedLocked(key, it->second, rd_kafka_err2str(m->err));
      if (it->second.given_up) self->outstanding_.erase(it);
      return;
    }
  }
  if (!job.empty()) self->ledger_->Delivered(node, job, last_unix_ns);
}

void NodeTopic::ProduceLocked(const std::string& key, Outstanding& o) {
  ++o.attempts;
  const rd_kafka_resp_err_t e = rd_kafka_producev(
      producer_.get(), RD_KAFKA_V_TOPIC(options_.topic.c_str()),
      RD_KAFKA_V_KEY(const_cast<char*>(key.data()), key.size()),
      RD_KAFKA_V_VALUE(const_cast<char*>(o.value.data()), o.value.size()),
      RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
      RD_KAFKA_V_OPAQUE(reinterpret_cast<void*>(static_cast<uintptr_t>(o.generation))),
      RD_KAFKA_V_END);
  if (e == RD_KAFKA_RESP_ERR_NO_ERROR) {
    o.in_flight = true;
  } else {
    FailedLocked(key, o, rd_kafka_err2str(e));
  }
}

void NodeTopic::FailedLocked(const std::string& key, Outstanding& o, const char* why) {
  if (o.attempts >= options_.max_delivery_attempts) {
    failed_.fetch_add(1, std::memory_order_relaxed);
    spdlog::warn(
        "nodes topic: a record of node {} was not delivered after {} attempts ({}); it is "
        "published again with the node's next change in the job, or after a restart",
        o.node, o.attempts, why);
    o.given_up = true;
    return;
  }
  retried_.fetch_add(1, std::memory_order_relaxed);
  auto backoff = options_.first_retry_backoff * (int64_t{1} << std::min(o.attempts - 1, 20));
  backoff = std::min<std::chrono::milliseconds>(backoff, options_.max_retry_backoff);
  o.retry_at = std::chrono::steady_clock::now() + backoff;
  if (!warned_) {
    warned_ = true;
    spdlog::warn("nodes topic: a record was not delivered ({}); retrying in {} ms", why,
                 backoff.count());
  }
}

void NodeTopic::RetryDue() {
  std::lock_guard lock(mu_);
  const auto now = std::chrono::steady_clock::now();
  for (auto it = outstanding_.begin(); it != outstanding_.end();) {
    Outstanding& o = it->second;
    if (!o.in_flight && !o.given_up && o.retry_at <= now) ProduceLocked(it->first, o);
    it = o.given_up ? outstanding_.erase(it) : std::next(it);
  }
}

size_t NodeTopic::undelivered() const {
  std::lock_guard lock(mu_);
  return outstanding_.size();
}

void NodeTopic::Publish(const std::vector<v1::NodeRecord>& records) {
  {
    std::lock_guard lock(mu_);
    for (const v1::NodeRecord& r : records) {
      if (!NodeLedger::Valid(r)) continue;
      // One key per (node, job), and one per node for its alert's transitions.
      std::string key = r.node();
      key += '\0';
      Outstanding o;
      o.node = r.node();
      if (r.by_job_size() == 1) {
        key += r.by_job(0).training_job();
        o.job = r.by_job(0).training_job();
        o.last_unix_ns = r.by_job(0).last_unix_ns();
      }
      o.generation = ++generation_;
      o.value = r.SerializeAsString();
      auto [it, inserted] = outstanding_.insert_or_assign(key, std::move(o));
      ProduceLocked(it->first, it->second);
      if (it->second.given_up) outstanding_.erase(it);
    }
    // Bounded: the records published longest ago go first.
    while (outstanding_.size() > options_.max_undelivered) {
      auto oldest = std::min_element(
          outstanding_.begin(), outstanding_.end(),
          [](const auto& a, const auto& b) { return a.second.generation < b.second.generation; });
      failed_.fetch_add(1, std::memory_order_relaxed);
      outstanding_.erase(oldest);
    }
  }
  RetryDue();
}

void NodeTopic::ReadLoop() {
  auto client = NewKafkaClient(ClientConfig(RD_KAFKA_CONSUMER, options_,
                                            {
                                                {"bootstrap.servers", options_.brokers},
                                                {"client.id", "rankwatchd-nodes-reader"},
                                                // Required by librdkafka; never committed.
                                                {"group.id", "rankwatchd-nodes-reader"},
                                                {"enable.auto.commit", "false"},
                                                {"enable.auto.offset.store", "false"},
                                                {"enable.partition.eof", "true"},
                                                {"fetch.wait.max.ms", "200"},
                                                {"allow.auto.create.topics", "false"},
                                            }));
  if (!client.ok()) {
    spdlog::error("nodes topic: reader: {}", std::string(client.status().message()));
    return;
  }
  rd_kafka_t* rk = client->get();
  // The end of each partition as the reader starts: once reached, the view is complete.
  std::map<int32_t, int64_t> ends;
  while (!stop_) {
    auto count = QueryPartitionCount(rk, options_.topic, MetadataScope::kAllTopics,
                                     options_.request_timeout);
    if (count.ok() && *count > 0) {
      bool all = true;
      for (int32_t p = 0; p < *count && all; ++p) {
        auto w = QueryWatermarks(rk, options_.topic, p, options_.request_timeout);
        if (!w.ok()) {
          all = false;
        } else {
          ends[p] = w->high;
        }
      }
      if (all) break;
    }
    spdlog::warn("nodes topic: {} not readable yet; trying again", options_.topic);
    ends.clear();
    for (int i = 0; i < 20 && !stop_; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (stop_) return;
  KafkaPartitionList tps(rd_kafka_topic_partition_list_new(static_cast<int>(ends.size())));
  for (const auto& [p, end] : ends) {
    rd_kafka_topic_partition_list_add(tps.get(), options_.topic.c_str(), p)->offset =
        RD_KAFKA_OFFSET_BEGINNING;
  }
  rd_kafka_assign(rk, tps.get());
  std::map<int32_t, int64_t> behind = ends;  // partitions not yet read to their start end
  for (auto it = behind.begin(); it != behind.end();) {
    it = it->second <= 0 ? behind.erase(it) : std::next(it);
  }
  const auto started = std::chrono::steady_clock::now();
  auto reached = [&](int32_t partition, int64_t next) {
    auto it = behind.find(partition);
    if (it == behind.end() || next < it->second) return;
    behind.erase(it);
    if (behind.empty()) {
      ledger_->SetComplete(true);
      spdlog::info(
          "nodes topic: {} read to its end ({} records, {:.1f} s): the fleet view of "
          "nodes is complete",
          options_.topic, read_.load(),
          std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
    }
  };
  if (behind.empty()) ledger_->SetComplete(true);
  while (!stop_) {
    rd_kafka_poll(producer_.get(), 0);  // the publisher's delivery reports
    RetryDue();
    const KafkaMessagePtr m(rd_kafka_consumer_poll(rk, 200));
    if (m == nullptr) continue;
    if (m->err == RD_KAFKA_RESP_ERR__PARTITION_EOF) {
      reached(m->partition, m->offset);
      continue;
    }
    if (m->err != RD_KAFKA_RESP_ERR_NO_ERROR) {
      spdlog::debug("nodes topic: {}", rd_kafka_message_errstr(m.get()));
      continue;
    }
    read_.fetch_add(1, std::memory_order_relaxed);
    v1::NodeRecord r;
    if (m->payload == nullptr || !r.ParseFromArray(m->payload, static_cast<int>(m->len)) ||
        !NodeLedger::Valid(r)) {
      ignored_.fetch_add(1, std::memory_order_relaxed);  // not a record this build writes
    } else {
      ledger_->Apply(r);
    }
    reached(m->partition, m->offset + 1);
  }
  rd_kafka_consumer_close(rk);
}

}  // namespace rankwatch
