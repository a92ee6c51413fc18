#include "collectors/lib/control_listener.h"

#include <librdkafka/rdkafka.h>
#include <pthread.h>
#include <spdlog/spdlog.h>

#include <algorithm>

#include "common/wall_clock.h"
#include "kafka/client_factory.h"
#include "kafka/cluster_requests.h"

namespace rankwatch {
namespace {

constexpr size_t kRecentIds = 256;  // request ids remembered for duplicate detection

ControlCheck Refusal(ControlRefusal why, std::string detail) {
  ControlCheck c;
  c.kind = ControlCheck::Kind::kRefuse;
  c.refusal = why;
  c.detail = std::move(detail);
  return c;
}

}  // namespace

const char* ControlRefusalName(ControlRefusal r) {
  switch (r) {
    case ControlRefusal::kMalformed: return "malformed";
    case ControlRefusal::kOversized: return "oversized";
    case ControlRefusal::kExpired: return "expired";
    case ControlRefusal::kBadRequest: return "bad_request";
    case ControlRefusal::kUnsupported: return "unsupported";
    case ControlRefusal::kBusy: return "busy";
  }
  return "unknown";
}

ControlCheck CheckControlRequest(std::string_view key, std::string_view payload,
                                 const std::string& job, uint32_t rank, int64_t now_unix_ns,
                                 const ControlLimits& limits, v1::ControlRequest* out) {
  out->Clear();
  if (key != job) return ControlCheck{};  // another job's: not even parsed
  if (payload.size() > limits.max_bytes) {
    return Refusal(ControlRefusal::kOversized, std::to_string(payload.size()) +
                                                   " bytes, over the limit of " +
                                                   std::to_string(limits.max_bytes));
  }
  if (!out->ParseFromArray(payload.data(), static_cast<int>(payload.size()))) {
    out->Clear();
    return Refusal(ControlRefusal::kMalformed, "not a ControlRequest");
  }
  if (out->training_job() != job) {
    return Refusal(ControlRefusal::kMalformed, "keyed to this job but names another one");
  }
  // Addressed to this rank? (An empty list addresses every rank.)
  if (rank != kEveryRank && out->ranks_size() > 0 &&
      std::find(out->ranks().begin(), out->ranks().end(), rank) == out->ranks().end()) {
    if (static_cast<size_t>(out->ranks_size()) <= limits.max_ranks) return ControlCheck{};
  }
  if (out->id().empty()) return Refusal(ControlRefusal::kBadRequest, "no request id");
  if (out->id().size() > limits.max_id_bytes) {
    return Refusal(ControlRefusal::kBadRequest,
                   "request id of " + std::to_string(out->id().size()) + " bytes");
  }
  if (static_cast<size_t>(out->ranks_size()) > limits.max_ranks) {
    return Refusal(ControlRefusal::kBadRequest, std::to_string(out->ranks_size()) +
                                                    " ranks listed, over the limit of " +
                                                    std::to_string(limits.max_ranks));
  }
  if (out->deadline_unix_ns() <= now_unix_ns) {
    return Refusal(ControlRefusal::kExpired, "its deadline has passed");
  }
  if (out->deadline_unix_ns() - now_unix_ns > limits.max_deadline_ahead_ns) {
    return Refusal(ControlRefusal::kExpired, "its deadline is more than an hour away");
  }
  switch (out->action_case()) {
    case v1::ControlRequest::kCapture: {
      const uint32_t steps = out->capture().steps();
      if (limits.max_capture_steps == 0) {
        return Refusal(ControlRefusal::kUnsupported, "this collector takes no captures");
      }
      if (steps == 0 || steps > limits.max_capture_steps) {
        return Refusal(ControlRefusal::kBadRequest,
                       "a capture of " + std::to_string(steps) + " steps (1 to " +
                           std::to_string(limits.max_capture_steps) + ")");
      }
      break;
    }
    case v1::ControlRequest::kStacks: {
      // A node agent has no stacks to give; each rank's own collector answers for itself.
      if (limits.max_stack_frames == 0 && rank == kEveryRank) return ControlCheck{};
      if (limits.max_stack_frames == 0) {
        return Refusal(ControlRefusal::kUnsupported, "this collector takes no stacks");
      }
      if (out->stacks().max_frames() > limits.max_stack_frames) {
        return Refusal(ControlRefusal::kBadRequest,
                       "stacks of " + std::to_string(out->stacks().max_frames()) +
                           " frames a thread (at most " + std::to_string(limits.max_stack_frames) +
                           ")");
      }
      break;
    }
    case v1::ControlRequest::kFlightRecorder:
      // A node agent answers for the ranks whose dump trigger pipe it finds; a rank's own
      // collector answers from the thread that answers stacks, and only with one.
      if (rank != kEveryRank && limits.max_stack_frames == 0) {
        return Refusal(ControlRefusal::kUnsupported, "this collector takes no dump requests");
      }
      break;
    case v1::ControlRequest::ACTION_NOT_SET:
      return Refusal(ControlRefusal::kUnsupported, "no action this collector knows");
  }
  ControlCheck accept;
  accept.kind = ControlCheck::Kind::kAccept;
  return accept;
}

absl::StatusOr<std::unique_ptr<ControlListener>> ControlListener::Start(
    ControlListenerOptions options, ReplySink reply) {
  if (options.brokers.empty()) return absl::InvalidArgumentError("control channel: no brokers");
  if (options.training_job.empty()) {
    return absl::InvalidArgumentError("control channel: no training job");
  }
  if (options.topic.empty()) return absl::InvalidArgumentError("control channel: no topic");
  if (options.max_queued == 0) options.max_queued = 1;
  KafkaClientConfig config;
  config.type = RD_KAFKA_CONSUMER;
  config.name = "control channel";
  config.defaults = {
      {"bootstrap.servers", options.brokers},
      {"client.id", "rankwatch-collector-control"},
      // librdkafka wants a group id for a consumer; this one never joins it (assign, no
      // subscribe) and never commits.
      {"group.id", "rankwatch-collector-control"},
      {"enable.auto.commit", "false"},
      {"enable.auto.offset.store", "false"},
      {"allow.auto.create.topics", "false"},
      {"fetch.wait.max.ms", "100"},
      {"reconnect.backoff.max.ms", "2000"},
  };
  config.overrides = options.properties;
  auto rk = NewKafkaClient(config);
  if (!rk.ok()) return rk.status();
  return std::unique_ptr<ControlListener>(
      new ControlListener(std::move(options), std::move(reply), std::move(*rk)));
}

ControlListener::ControlListener(ControlListenerOptions options, ReplySink reply, KafkaClient rk)
    : options_(std::move(options)),
      reply_(std::move(reply)),
      rk_(std::move(rk)),
      started_unix_ns_(WallNowUnixNs()) {
  thread_ = std::thread([this] { Run(); });
}

ControlListener::~ControlListener() {
  stop_.store(true);
  WakeStacks();
  thread_.join();
  rd_kafka_consumer_close(rk_.get());
}

std::vector<v1::ControlRequest> ControlListener::Take() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<v1::ControlRequest> out(std::make_move_iterator(queue_.begin()),
                                      std::make_move_iterator(queue_.end()));
  queue_.clear();
  pending_.store(false, std::memory_order_release);
  return out;
}

std::vector<v1::ControlRequest> ControlListener::WaitStacks(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  const uint64_t wakeups = stacks_wakeups_;
  stacks_ready_.wait_for(lock, timeout, [&] {
    return !stacks_queue_.empty() || stacks_wakeups_ != wakeups || stop_.load();
  });
  std::vector<v1::ControlRequest> out(std::make_move_iterator(stacks_queue_.begin()),
                                      std::make_move_iterator(stacks_queue_.end()));
  stacks_queue_.clear();
  return out;
}

void ControlListener::WakeStacks() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++stacks_wakeups_;
  }
  stacks_ready_.notify_all();
}

ControlListenerStats ControlListener::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

bool ControlListener::AssignPartitions() {
  rd_kafka_t* rk = rk_.get();
  auto partitions = QueryPartitionCount(rk, options_.topic, MetadataScope::kTopic,
                                        std::chrono::milliseconds(2000));
  if (!partitions.ok() || *partitions <= 0) return false;  // no broker, or not created yet
  // Start `lookback_messages` before each partition's end.
  KafkaPartitionList tps(rd_kafka_topic_partition_list_new(*partitions));
  for (int p = 0; p < *partitions; ++p) {
    auto bounds = QueryWatermarks(rk, options_.topic, p, std::chrono::milliseconds(5000));
    if (!bounds.ok()) return false;
    rd_kafka_topic_partition_list_add(tps.get(), options_.topic.c_str(), p)->offset =
        std::max(bounds->low, bounds->high - std::max<int64_t>(0, options_.lookback_messages));
  }
  return rd_kafka_assign(rk, tps.get()) == RD_KAFKA_RESP_ERR_NO_ERROR;
}

void ControlListener::Run() {
  pthread_setname_np(pthread_self(), "rw:control");
  auto next_lookup = std::chrono::steady_clock::now();
  bool reading = false;
  while (!stop_.load()) {
    if (!reading) {
      if (std::chrono::steady_clock::now() < next_lookup) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        continue;
      }
      reading = AssignPartitions();
      next_lookup = std::chrono::steady_clock::now() + options_.metadata_retry;
      if (reading) {
        std::lock_guard<std::mutex> lock(mu_);
        stats_.reading = true;
      }
      continue;
    }
    const KafkaMessagePtr m(rd_kafka_consumer_poll(rk_.get(), 100));
    if (m == nullptr) continue;
    if (m->err == RD_KAFKA_RESP_ERR_NO_ERROR) {
      std::string_view key(static_cast<const char*>(m->key), m->key == nullptr ? 0 : m->key_len);
      std::string_view payload(static_cast<const char*>(m->payload),
                               m->payload == nullptr ? 0 : m->len);
      Handle(key, payload);
    }
  }
}

void ControlListener::Handle(std::string_view key, std::string_view payload) {
  v1::ControlRequest request;
  const ControlCheck check = CheckControlRequest(key, payload, options_.training_job, options_.rank,
                                                 WallNowUnixNs(), options_.limits, &request);
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.messages;
    if (check.kind == ControlCheck::Kind::kIgnore) {
      ++(key == options_.training_job ? stats_.other_ranks : stats_.other_jobs);
      return;
    }
  }
  if (!request.id().empty()) {
    if (std::find(recent_ids_.begin(), recent_ids_.end(), request.id()) != recent_ids_.end()) {
      std::lock_guard<std::mutex> lock(mu_);
      ++stats_.duplicates;
      return;
    }
    recent_ids_.push_back(request.id());
    if (recent_ids_.size() > kRecentIds) recent_ids_.pop_front();
  }
  if (check.kind == ControlCheck::Kind::kRefuse) {
    if (check.refusal == ControlRefusal::kExpired && request.issued_unix_ns() < started_unix_ns_) {
      std::lock_guard<std::mutex> lock(mu_);
      ++stats_.stale;  // an old request read back at start: nobody waits for its answer
      return;
    }
    Refuse(request, check.refusal, check.detail);
    return;
  }
  // Only this thread adds to the queues: room seen here is still there below.
  // Requests the training thread must not be waited for (it may be stuck: the job is hung).
  const bool stacks = request.action_case() == v1::ControlRequest::kStacks ||
                      request.action_case() == v1::ControlRequest::kFlightRecorder;
  bool room;
  {
    std::lock_guard<std::mutex> lock(mu_);
    room = (stacks ? stacks_queue_.size() : queue_.size()) < options_.max_queued;
  }
  if (!room) {
    Refuse(request, ControlRefusal::kBusy,
           std::to_string(options_.max_queued) +
               (stacks ? " stacks requests are waiting to be answered"
                       : " requests are waiting for the training loop"));
    return;
  }
  // ACCEPTED goes out before the training side can see the request, so that it always comes
  // before the request's DONE or FAILED. Outside mu_: the sink takes the collector's lock,
  // under which the collector reads stats() (and so mu_).
  if (reply_) {
    v1::ControlReply r;
    r.set_request_id(request.id());
    r.set_state(v1::CONTROL_ACCEPTED);
    r.set_first_step(-1);
    reply_(std::move(r));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.accepted;
    if (stacks) {
      stacks_queue_.push_back(std::move(request));
    } else {
      queue_.push_back(std::move(request));
      pending_.store(true, std::memory_order_release);
    }
  }
  if (stacks) stacks_ready_.notify_all();
}

void ControlListener::Refuse(const v1::ControlRequest& request, ControlRefusal why,
                             const std::string& detail) {
  const int i = static_cast<int>(why);
  bool first;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.refused[i];
    first = !logged_refusal_[i];
    logged_refusal_[i] = true;
  }
  if (first) {
    spdlog::warn(
        "rankwatch collector: control request {} refused ({}): {} (logged once per reason)",
        request.id().empty() ? "without an id" : "'" + request.id().substr(0, 128) + "'",
        ControlRefusalName(why), detail);
  }
  // A request without an id cannot be answered: it is only counted.
  if (request.id().empty() || !reply_) return;
  v1::ControlReply r;
  r.set_request_id(request.id().substr(0, options_.limits.max_id_bytes));
  r.set_state(v1::CONTROL_REFUSED);
  r.set_reason(std::string(ControlRefusalName(why)) + ": " + detail);
  r.set_first_step(-1);
  reply_(std::move(r));
}

}  // namespace rankwatch
