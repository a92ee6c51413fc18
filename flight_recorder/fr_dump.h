// FrDump: one rank's PyTorch Flight Recorder dump, as rankwatch keeps it. PyTorch's NCCL
// process groups record their last collectives and point-to-point operations in a ring buffer
// and write it on a watchdog timeout (TORCH_NCCL_DUMP_ON_TIMEOUT) to
// `${TORCH_NCCL_DEBUG_INFO_TEMP_FILE}${rank}`, as a pickle of plain dicts, lists, strings and
// numbers (dump versions 2.x), or as JSON when asked. Readers: flight_recorder/fr_reader.h.
// Analysis across ranks: flight_recorder/fr_analysis.h.
//
// A rank's group names are its own: the same name on two ranks can name two groups (their
// ranks differ), so groups are matched across ranks by their ranks and description.
//
// Plain values; no thread-safety concerns.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

namespace rankwatch::fr {

// A group's member ranks: an immutable list shared by every dump that names the same list (a
// 16,384-rank job's dumps each list the whole job in several groups; read through one
// FrRanksInterner they share one copy). Reads like a const std::vector<uint32_t>.
class FrRanks {
 public:
  using value_type = uint32_t;
  using const_iterator = std::vector<uint32_t>::const_iterator;
  using iterator = const_iterator;
  using size_type = size_t;

  FrRanks() = default;
  FrRanks(std::vector<uint32_t> ranks)  // NOLINT: implicit, as a vector
      : list_(std::make_shared<const std::vector<uint32_t>>(std::move(ranks))) {}
  FrRanks(std::initializer_list<uint32_t> ranks) : FrRanks(std::vector<uint32_t>(ranks)) {}
  explicit FrRanks(std::shared_ptr<const std::vector<uint32_t>> list) : list_(std::move(list)) {}

  const std::vector<uint32_t>& vec() const { return list_ ? *list_ : Empty(); }
  operator const std::vector<uint32_t>&() const { return vec(); }  // NOLINT
  const_iterator begin() const { return vec().begin(); }
  const_iterator end() const { return vec().end(); }
  size_t size() const { return vec().size(); }
  bool empty() const { return vec().empty(); }
  uint32_t operator[](size_t i) const { return vec()[i]; }
  uint32_t back() const { return vec().back(); }
  // Identity of the shared list (equal for two FrRanks of one interned list).
  const void* id() const { return list_.get(); }
  const std::shared_ptr<const std::vector<uint32_t>>& shared() const { return list_; }

  friend bool operator==(const FrRanks& a, const FrRanks& b) { return a.vec() == b.vec(); }
  friend bool operator==(const FrRanks& a, const std::vector<uint32_t>& b) { return a.vec() == b; }
  friend bool operator==(const std::vector<uint32_t>& a, const FrRanks& b) { return a == b.vec(); }

 private:
  static const std::vector<uint32_t>& Empty() {
    static const std::vector<uint32_t> empty;
    return empty;
  }
  std::shared_ptr<const std::vector<uint32_t>> list_;
};

// pg_config: one process group as this rank knows it.
struct FrGroup {
  std::string name;  // this rank's name of the group (e.g. "35")
  std::string desc;  // the description given at creation (e.g. "TENSOR_MODEL_PARALLEL_GROUP")
  FrRanks ranks;     // global ranks, in the dump's order
};

// pg_status: one group's counters on this rank, keyed by the group's local id (`pg_id` of the
// entries, ProcessGroupNCCL's uid), not by its name. Each is the sequence number of the last
// work enqueued, started and completed (a collective's collective_seq_id, a point-to-point
// operation's p2p_seq_id); -1 when none (started is -1 when timing is not enabled).
struct FrGroupStatus {
  std::string uid;
  int64_t last_enqueued = -1;
  int64_t last_started = -1;
  int64_t last_completed = -1;
};

enum class FrState : uint8_t { kScheduled, kStarted, kCompleted, kUnknown };

struct FrFrame {
  std::string name;
  std::string filename;
  int64_t line = 0;
};

// One entry of the ring buffer: a collective, a point-to-point operation, or the end of a
// coalesced group ("coalesced", "ALLGATHER_coalesced", "REDUCE_SCATTER_coalesced").
struct FrEntry {
  int64_t record_id = -1;          // position in the ring buffer's history (grows)
  int64_t pg_uid = -1;             // the group's local id (key of pg_status); -1 if absent
  std::string pg_name;             // process_group[0]: this rank's name of the group
  std::string pg_desc;             // process_group[1]
  int64_t collective_seq_id = -1;  // per group, collectives (and coalesced groups)
  int64_t p2p_seq_id = -1;         // per group, point-to-point operations
  int64_t op_id = -1;
  std::string profiling_name;  // e.g. "nccl:all_reduce", "nccl:send 0->1", "nccl:recv 1<-0"
  std::vector<std::vector<int64_t>> input_sizes;
  std::vector<std::vector<int64_t>> output_sizes;
  std::vector<std::string> input_dtypes;
  std::vector<std::string> output_dtypes;
  FrState state = FrState::kUnknown;
  int64_t time_created_ns = -1;
  int64_t time_started_ns = -1;    // -1: not recorded
  int64_t time_completed_ns = -1;  // -1: not recorded
  int64_t timeout_ms = -1;
  bool is_p2p = false;
  bool retired = false;
  std::vector<FrFrame> frames;  // the Python stack that enqueued it, innermost first
};

struct FrDump {
  std::string version;       // e.g. "2.9"
  int64_t rank = -1;         // the dump's own "rank" key when present; else -1 (use the file name)
  std::string nccl_version;  // may be empty
  std::vector<FrGroup> groups;
  std::vector<FrGroupStatus> status;
  std::vector<FrEntry> entries;  // in record order
};

const char* FrStateName(FrState s);

}  // namespace rankwatch::fr
