// StateStore: rankwatchd's durable state in RocksDB, one column family per kind of
// state, and checkpoints that write dirty state together with the Kafka offsets it covers in
// one atomic WriteBatch ("offsets are state": docs/architecture.md).
//
// Errors are sticky: after one failed write the store refuses every later commit with the same
// status (the daemon then reports NOT_SERVING and keeps serving its last good diagnoses), so a
// checkpoint can never land on top of a lost one.
//
// Thread-safe: RocksDB is; the sticky status is guarded by a mutex.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>
#include "absl/base/thread_annotations.h"

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace rocksdb {
class DB;
class Env;
class ColumnFamilyHandle;
class Cache;
class FileSystem;
}  // namespace rocksdb

namespace rankwatch {

// The kinds of durable state, one RocksDB column family each. The values are part of the
// changelog's record keys: never renumber them.
enum class StateFamily : uint8_t {
  // Schema version, daemon identity; this instance's outbound deliveries (state/outbound_state.h)
  // and its fleet view's node records (fleet/node_ledger.h).
  kMetadata = 0,
  kOffsets = 1,  // consumed offset per (topic, partition)
  // 2 is reserved: a family ("pending_steps") that earlier builds created and never wrote. It
  // is still opened, so their stores open.
  // Each job's metadata, window steps, alert state and what-if ops (state/job_state_store.h).
  kJobs = 3,
  kAlerts = 4,  // the alert log (state/job_state_store.h)
};
// Column families, the reserved one included.
inline constexpr int kStateFamilyCount = 5;
std::string_view StateFamilyName(StateFamily family);

// The newest state schema this build reads and writes.
inline constexpr uint32_t kStateSchemaVersion = 1;

struct StateStoreOptions {
  std::filesystem::path dir;  // created when missing (required)
  bool sync = true;           // default: fsync every checkpoint (a crash loses nothing committed)
  // RocksDB's block cache, shared by every column family. Default: 8 MiB.
  size_t block_cache_bytes = size_t{8} << 20;
  // Flush memtables when closing, so the next open reads tables instead of replaying the log.
  // Default: true (benchmarks turn it off to measure recovery after a crash).
  bool flush_on_close = true;
  // For tests: the file system RocksDB writes through (fault injection). Default: the OS.
  std::shared_ptr<rocksdb::FileSystem> file_system;
};

// A value whose bytes are produced when the checkpoint is written, not when it is collected:
// the ingest thread hands over the state (cheap), the checkpoint writer thread serialises it.
// Implementations must be immutable once handed over (they may be serialised more than once,
// e.g. for the store and for the changelog).
class DeferredValue {
 public:
  virtual ~DeferredValue() = default;
  virtual void SerializeTo(std::string* out) const = 0;
  // An estimate of the serialised size, for checkpoint budgets; need not be exact.
  virtual size_t EstimatedBytes() const = 0;
};

// One atomic unit of writes.
class Checkpoint {
 public:
  void Put(StateFamily family, std::string key, std::string value);
  // Puts `value`'s bytes, serialised when the checkpoint is written (see Materialize).
  void PutDeferred(StateFamily family, std::string key, std::shared_ptr<const DeferredValue> value);
  void Delete(StateFamily family, std::string key);
  // Deletes every key in [begin, end) of `family`.
  void DeleteRange(StateFamily family, std::string begin, std::string end);
  // The next offset to consume in (topic, partition).
  void SetOffset(const std::string& topic, int32_t partition, int64_t next_offset);
  // Appends every write of `other`, after this checkpoint's own.
  void Append(const Checkpoint& other);
  void Append(Checkpoint&& other);
  // Serialises every deferred value into its op's `value`; bytes() becomes exact. Readers of
  // ops() other than StateStore::Commit require a materialised checkpoint.
  void Materialize();
  bool empty() const { return ops_.empty(); }
  // Keys and values written; an estimate until Materialize when values are deferred.
  size_t bytes() const { return bytes_; }

  struct Op {
    StateFamily family;
    std::string key;
    std::optional<std::string> value;  // nullopt = delete (of `key`, or up to `range_end`)
    std::optional<std::string> range_end;
    std::shared_ptr<const DeferredValue> deferred;  // a put whose value is not serialised yet
  };
  // The writes, in order.
  const std::vector<Op>& ops() const { return ops_; }

 private:
  std::vector<Op> ops_;
  size_t bytes_ = 0;
};

class StateStore {
 public:
  // Opens (or creates) the store. A store written by a newer schema, or unreadable files, are
  // FailedPrecondition / DataLoss errors that name the directory and say how to start clean.
  static absl::StatusOr<std::unique_ptr<StateStore>> Open(const StateStoreOptions& options);
  ~StateStore();
  StateStore(const StateStore&) = delete;
  StateStore& operator=(const StateStore&) = delete;

  // Writes the checkpoint atomically. Once a write failed, returns that first error forever.
  absl::Status Commit(const Checkpoint& checkpoint);

  absl::StatusOr<std::optional<std::string>> Get(StateFamily family, std::string_view key) const;
  // Calls `fn(key, value)` for every key of `family` starting with `prefix`, in key order.
  absl::Status ForEach(StateFamily family, std::string_view prefix,
                       const std::function<void(std::string_view, std::string_view)>& fn) const;
  // Calls `fn(key, value)` for every key of `family` from `from` on, in key order, until `fn`
  // returns false.
  absl::Status Scan(StateFamily family, std::string_view from,
                    const std::function<bool(std::string_view, std::string_view)>& fn) const;

  // The greatest key of `family`, or nullopt when it is empty.
  absl::StatusOr<std::optional<std::string>> LastKey(StateFamily family) const;

  // Stored next offsets: (topic, partition) -> offset.
  absl::StatusOr<std::map<std::pair<std::string, int32_t>, int64_t>> Offsets() const;

  // Writes the memtables to tables (RocksDB also does this by itself as they fill), so that a
  // later open has less log to replay.
  absl::Status Flush();

  // OK while every write succeeded; otherwise the first failure.
  absl::Status health() const;

  // Memory RocksDB holds for the store, as it counts it, over every column family.
  struct MemoryUsage {
    uint64_t memtables = 0;      // active, immutable and pinned memtables
    uint64_t table_readers = 0;  // open table files' indexes and filters (outside the cache)
    uint64_t block_cache = 0;    // the shared block cache's charge
  };
  MemoryUsage Memory() const;

 private:
  StateStore() = default;

  std::unique_ptr<rocksdb::Env> env_;  // only with a custom file system; outlives db_
  std::unique_ptr<rocksdb::DB> db_;
  rocksdb::ColumnFamilyHandle* default_family_ = nullptr;  // unused, but owned
  std::vector<rocksdb::ColumnFamilyHandle*> families_;     // index: StateFamily
  std::shared_ptr<rocksdb::Cache> block_cache_;
  bool sync_ = true;
  bool flush_on_close_ = true;
  mutable std::mutex mu_;
  absl::Status sticky_ ABSL_GUARDED_BY(mu_);
};

}  // namespace rankwatch
