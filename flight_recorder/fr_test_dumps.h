// Test helper: Flight Recorder dumps made in code (flight_recorder/fr_dump.h), as PyTorch's
// NCCL process groups record them, for the tests of the wire form, the node agent and the
// daemon's inspector.
//
// HungJobDumps(): a 4-rank job with a default group, two tensor-parallel groups {0,1} {2,3} and
// two data-parallel groups {0,2} {1,3}. Every rank completed 4 tensor-parallel and 2
// data-parallel all_reduces. Rank 3 then stopped (its Python thread is stuck): it never
// enqueued the 5th tensor-parallel all_reduce, in which rank 2 waits; ranks 0 and 1 completed
// theirs and wait in the 3rd data-parallel all_reduce, for ranks 2 and 3. Rank 3 holds the job.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "flight_recorder/fr_dump.h"

namespace rankwatch::fr::testing {

// A rank's recorder, entries added in record order.
class DumpBuilder {
 public:
  explicit DumpBuilder(int64_t rank) {
    dump_.version = "2.9";
    dump_.rank = rank;
    dump_.nccl_version = "2.21.5";
  }
  // A group the rank belongs to; its uid is its position.
  DumpBuilder& Group(std::string name, std::string desc, std::vector<uint32_t> ranks) {
    dump_.status.push_back({std::to_string(dump_.groups.size()), -1, -1, -1});
    dump_.groups.push_back({std::move(name), std::move(desc), std::move(ranks)});
    return *this;
  }
  // Collectives `first`..`last` of group `uid`, in `state` (`frames` frames each).
  DumpBuilder& Ops(size_t uid, int64_t first, int64_t last, FrState state,
                   const std::string& op = "nccl:all_reduce", size_t frames = 2) {
    for (int64_t seq = first; seq <= last; ++seq) {
      FrEntry e;
      e.record_id = static_cast<int64_t>(dump_.entries.size());
      e.pg_uid = static_cast<int64_t>(uid);
      e.pg_name = dump_.groups[uid].name;
      e.pg_desc = dump_.groups[uid].desc;
      e.collective_seq_id = seq;
      e.p2p_seq_id = 0;
      e.op_id = seq;
      e.profiling_name = op;
      e.input_sizes = {{1024, 4}};
      e.output_sizes = {{1024, 4}};
      e.input_dtypes = {"Float"};
      e.output_dtypes = {"Float"};
      e.state = state;
      e.time_created_ns = 1'700'000'000'000'000'000 + e.record_id * 1'000'000;
      e.time_started_ns = state == FrState::kScheduled ? -1 : e.time_created_ns + 10;
      e.time_completed_ns = state == FrState::kCompleted ? e.time_created_ns + 100 : -1;
      e.timeout_ms = 600'000;
      e.retired = state == FrState::kCompleted;
      for (size_t f = 0; f < frames; ++f) {
        e.frames.push_back({"fn" + std::to_string(f), "train.py", static_cast<int64_t>(10 + f)});
      }
      FrGroupStatus& s = dump_.status[uid];
      s.last_enqueued = std::max(s.last_enqueued, seq);
      if (state != FrState::kScheduled) s.last_started = std::max(s.last_started, seq);
      if (state == FrState::kCompleted) s.last_completed = std::max(s.last_completed, seq);
      dump_.entries.push_back(std::move(e));
    }
    return *this;
  }
  // Drops the entries (an empty dump: pg_config and pg_status stay).
  DumpBuilder& NoEntries() {
    dump_.entries.clear();
    return *this;
  }
  FrDump Build() const { return dump_; }

 private:
  FrDump dump_;
};

inline FrDump HungJobDump(uint32_t rank) {
  const uint32_t tp_peer = rank ^ 1u, dp_peer = rank ^ 2u;
  DumpBuilder b(rank);
  b.Group("0", "default_pg", {0, 1, 2, 3});
  b.Group("1", "TENSOR_MODEL_PARALLEL_GROUP", {std::min(rank, tp_peer), std::max(rank, tp_peer)});
  b.Group("2", "DATA_PARALLEL_GROUP", {std::min(rank, dp_peer), std::max(rank, dp_peer)});
  b.Ops(0, 1, 1, FrState::kCompleted, "nccl:broadcast");
  b.Ops(1, 1, 4, FrState::kCompleted);
  b.Ops(2, 1, 2, FrState::kCompleted);
  if (rank == 0 || rank == 1) {
    b.Ops(1, 5, 5, FrState::kCompleted);
    b.Ops(2, 3, 3, FrState::kStarted);
  } else if (rank == 2) {
    b.Ops(1, 5, 5, FrState::kStarted);
  }
  return b.Build();
}

inline std::vector<FrDump> HungJobDumps() {
  std::vector<FrDump> out;
  for (uint32_t r = 0; r < 4; ++r) out.push_back(HungJobDump(r));
  return out;
}

}  // namespace rankwatch::fr::testing
