// ControlRequestTracker: the lifecycle of the control requests one kind of evidence sends to the
// ranks of a job (proto/rankwatch/v1/control.proto), written once for captures, hang stacks and
// Flight Recorder dumps.
//
// A request gets an id, "<prefix>-<milliseconds>-<sequence>" (unique within a tracker: the
// sequence grows with each request), a deadline (`answer_deadline` after it is issued; a
// collector that reads it later refuses it) and a reply state for each rank it addresses.
// Replies come back in the job's telemetry batches and are routed by request id. A reply to a
// request the tracker does not know (another daemon's, or one it closed), of another job, from a
// rank the request did not address, or without a state is ignored. A rank's state only moves
// forward — nothing, then ACCEPTED, then its last word (DONE, REFUSED or FAILED) — so an
// ACCEPTED redelivered after DONE never undoes it.
//
// Not thread-safe: owned by one evidence class, used under that class's lock.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "rankwatch/v1/control.pb.h"

namespace rankwatch {

class ControlRequestTracker {
 public:
  // One open request.
  struct Request {
    std::string id;
    std::string training_job;
    int64_t issued_unix_ns = 0;
    int64_t deadline_unix_ns = 0;
    std::vector<uint32_t> ranks;           // the ranks addressed, ascending
    std::vector<v1::ControlState> states;  // the state of each of `ranks`
    uint32_t final_replies = 0;            // ranks whose state is final

    // The state of `rank` (UNSPECIFIED for a rank not addressed).
    v1::ControlState StateOf(uint32_t rank) const;
    // Every rank addressed has given its last word.
    bool AllFinal() const { return final_replies == ranks.size(); }
    // From its deadline on, a rank that has not answered will not.
    bool PastDeadline(int64_t now_unix_ns) const { return now_unix_ns >= deadline_unix_ns; }
    // The ranks whose state is `state`, ascending.
    std::vector<uint32_t> RanksIn(v1::ControlState state) const;
  };

  // `id_prefix` names the kind of request ("cap", "stk"); `answer_deadline` is how long the
  // ranks have to answer.
  ControlRequestTracker(std::string id_prefix, std::chrono::seconds answer_deadline);

  // Opens a request to `ranks` of `job` (ascending, distinct, at least one), issued at
  // `now_unix_ns`. Returns the request to send: id, training job, ranks and times set; the
  // caller adds `requested_by` and the action.
  v1::ControlRequest Open(const std::string& job, const std::vector<uint32_t>& ranks,
                          int64_t now_unix_ns);
  // Opens a request to every rank of `job`, ranks 0 to `world_size` - 1; the request sent names
  // no rank (the collectors read that as every rank).
  v1::ControlRequest OpenToEveryRank(const std::string& job, uint32_t world_size,
                                     int64_t now_unix_ns);
  // Forgets a request: replies to it are ignored from now on. A no-op for an unknown id.
  void Close(const std::string& id);

  // Routes one reply that `rank` of `job` sent. Returns its request when the reply was taken
  // (the rank's state is now the reply's); nullptr when it was ignored (see above). The pointer
  // is valid until the next call that opens or closes a request.
  const Request* Apply(const std::string& job, uint32_t rank, const v1::ControlReply& reply);

  // The open request `id`, or nullptr.
  const Request* Find(const std::string& id) const;
  size_t open_requests() const { return requests_.size(); }

  // DONE, REFUSED and FAILED: a rank's last word.
  static bool Final(v1::ControlState state) {
    return state == v1::CONTROL_DONE || state == v1::CONTROL_REFUSED || state == v1::CONTROL_FAILED;
  }

 private:
  v1::ControlRequest Register(const std::string& job, std::vector<uint32_t> ranks,
                              int64_t now_unix_ns);

  const std::string id_prefix_;
  const std::chrono::seconds answer_deadline_;
  std::map<std::string, Request> requests_;  // by id
  uint64_t sequence_ = 0;
};

}  // namespace rankwatch
