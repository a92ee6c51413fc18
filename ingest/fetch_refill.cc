#include "ingest/fetch_refill.h"

#include <algorithm>
#include <cstdlib>

#include "kafka/handles.h"

namespace rankwatch {
namespace {

int64_t ConfInt(const rd_kafka_conf_t* conf, const char* name, int64_t fallback) {
  char value[64];
  size_t size = sizeof(value);
  if (rd_kafka_conf_get(conf, name, value, &size) != RD_KAFKA_CONF_OK) return fallback;
  char* end = nullptr;
  const long long v = std::strtoll(value, &end, 10);
  return end != value && v > 0 ? v : fallback;
}

}  // namespace

FetchQueueLimits FetchQueueLimitsOf(rd_kafka_t* rk) {
  const rd_kafka_conf_t* conf = rd_kafka_conf(rk);
  FetchQueueLimits limits;
  // librdkafka's defaults where a value cannot be read.
  limits.max_bytes = ConfInt(conf, "queued.max.messages.kbytes", 65536) * 1024;
  limits.max_messages = ConfInt(conf, "queued.min.messages", 100000);
  return limits;
}

bool FetchRefill::Taken(size_t messages, size_t bytes, size_t queued) {
  if (messages > 0) mean_message_bytes_ = static_cast<double>(bytes) / messages;
  const double left_bytes = mean_message_bytes_ * static_cast<double>(queued);
  const double left_messages = static_cast<double>(queued);
  peak_bytes_ = std::max(peak_bytes_, static_cast<double>(bytes) + left_bytes);
  peak_messages_ = std::max(peak_messages_, static_cast<double>(messages) + left_messages);
  const double max_bytes = static_cast<double>(limits_.max_bytes);
  const double max_messages = static_cast<double>(limits_.max_messages);
  // The fetcher stops at a limit; the margin is for the estimate of the bytes left.
  const bool may_have_stopped =
      peak_bytes_ >= 0.75 * max_bytes || peak_messages_ >= 0.75 * max_messages;
  const bool room = left_bytes <= max_bytes / 2 && left_messages <= max_messages / 2;
  if (!(may_have_stopped && room)) return false;
  ++wakeups_;
  peak_bytes_ = left_bytes;
  peak_messages_ = left_messages;
  return true;
}

void WakeFetchers(rd_kafka_t* rk, const std::string& topic,
                  const std::vector<int32_t>& partitions) {
  if (partitions.empty()) return;
  KafkaPartitionList list(rd_kafka_topic_partition_list_new(static_cast<int>(partitions.size())));
  for (int32_t p : partitions) {
    rd_kafka_topic_partition_list_add(list.get(), topic.c_str(), p)->offset = RD_KAFKA_OFFSET_END;
  }
  // With a timeout of 0 this returns RD_KAFKA_RESP_ERR__TIMED_OUT once the requests are
  // enqueued (or an error when no leader is known: then there is no broker thread to wake).
  rd_kafka_offsets_for_times(rk, list.get(), 0);
}

}  // namespace rankwatch
