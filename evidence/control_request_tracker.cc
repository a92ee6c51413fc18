#include "evidence/control_request_tracker.h"

#include <algorithm>
#include <utility>

namespace rankwatch {
namespace {

constexpr int64_t kSecond = 1'000'000'000;

}  // namespace

v1::ControlState ControlRequestTracker::Request::StateOf(uint32_t rank) const {
  auto it = std::lower_bound(ranks.begin(), ranks.end(), rank);
  if (it == ranks.end() || *it != rank) return v1::CONTROL_STATE_UNSPECIFIED;
  return states[it - ranks.begin()];
}

std::vector<uint32_t> ControlRequestTracker::Request::RanksIn(v1::ControlState state) const {
  std::vector<uint32_t> out;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (states[i] == state) out.push_back(ranks[i]);
  }
  return out;
}

ControlRequestTracker::ControlRequestTracker(std::string id_prefix,
                                             std::chrono::seconds answer_deadline)
    : id_prefix_(std::move(id_prefix)), answer_deadline_(answer_deadline) {}

v1::ControlRequest ControlRequestTracker::Register(const std::string& job,
                                                   std::vector<uint32_t> ranks,
                                                   int64_t now_unix_ns) {
  Request r;
  r.id = id_prefix_ + "-" + std::to_string(now_unix_ns / 1'000'000) + "-" +
         std::to_string(++sequence_);
  r.training_job = job;
  r.issued_unix_ns = now_unix_ns;
  r.deadline_unix_ns = now_unix_ns + answer_deadline_.count() * kSecond;
  r.states.assign(ranks.size(), v1::CONTROL_STATE_UNSPECIFIED);
  r.ranks = std::move(ranks);
  v1::ControlRequest request;
  request.set_id(r.id);
  request.set_training_job(job);
  request.set_issued_unix_ns(r.issued_unix_ns);
  request.set_deadline_unix_ns(r.deadline_unix_ns);
  requests_.insert_or_assign(r.id, std::move(r));
  return request;
}

v1::ControlRequest ControlRequestTracker::Open(const std::string& job,
                                               const std::vector<uint32_t>& ranks,
                                               int64_t now_unix_ns) {
  v1::ControlRequest request = Register(job, ranks, now_unix_ns);
  for (uint32_t r : ranks) request.add_ranks(r);
  return request;
}

v1::ControlRequest ControlRequestTracker::OpenToEveryRank(const std::string& job,
                                                          uint32_t world_size,
                                                          int64_t now_unix_ns) {
  std::vector<uint32_t> ranks(world_size);
  for (uint32_t r = 0; r < world_size; ++r) ranks[r] = r;
  return Register(job, std::move(ranks), now_unix_ns);
}

void ControlRequestTracker::Close(const std::string& id) { requests_.erase(id); }

const ControlRequestTracker::Request* ControlRequestTracker::Apply(const std::string& job,
                                                                   uint32_t rank,
                                                                   const v1::ControlReply& reply) {
  if (reply.state() == v1::CONTROL_STATE_UNSPECIFIED) return nullptr;
  auto it = requests_.find(reply.request_id());
  if (it == requests_.end() || it->second.training_job != job) return nullptr;
  Request& r = it->second;
  auto at = std::lower_bound(r.ranks.begin(), r.ranks.end(), rank);
  if (at == r.ranks.end() || *at != rank) return nullptr;
  v1::ControlState& state = r.states[at - r.ranks.begin()];
  if (Final(state)) return nullptr;  // one last word a rank
  state = reply.state();
  if (Final(state)) ++r.final_replies;
  return &r;
}

const ControlRequestTracker::Request* ControlRequestTracker::Find(const std::string& id) const {
  auto it = requests_.find(id);
  return it == requests_.end() ? nullptr : &it->second;
}

}  // namespace rankwatch
