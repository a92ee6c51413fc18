#include "state/state_store.h"

#include <rocksdb/cache.h>
#include <rocksdb/db.h>
#include <rocksdb/env.h>
#include <rocksdb/file_system.h>
#include <rocksdb/table.h>
#include <rocksdb/write_batch.h>

#include <spdlog/spdlog.h>

#include <charconv>
#include <cstdarg>

namespace rankwatch {
namespace {

constexpr std::string_view kSchemaKey = "schema_version";

// RocksDB's own log lines go to the daemon's log, not to a LOG file in the state directory
// (which, on a full disk, RocksDB's file logger trips over).
class RocksLogger : public rocksdb::Logger {
 public:
  RocksLogger() : rocksdb::Logger(rocksdb::InfoLogLevel::WARN_LEVEL) {}
  using rocksdb::Logger::Logv;
  void Logv(const rocksdb::InfoLogLevel level, const char* format, va_list ap) override {
    if (level < GetInfoLogLevel()) return;
    char line[1024];
    std::vsnprintf(line, sizeof(line), format, ap);
    if (level >= rocksdb::InfoLogLevel::ERROR_LEVEL) {
      spdlog::error("rocksdb: {}", line);
    } else {
      spdlog::warn("rocksdb: {}", line);
    }
  }
  void Logv(const char* format, va_list ap) override {
    Logv(rocksdb::InfoLogLevel::INFO_LEVEL, format, ap);
  }
};

absl::Status FromRocks(const rocksdb::Status& s, const std::string& what) {
  if (s.ok()) return absl::OkStatus();
  const std::string msg = what + ": " + s.ToString();
  if (s.IsCorruption()) return absl::DataLossError(msg);
  if (s.IsIOError() || s.IsNoSpace()) return absl::UnavailableError(msg);
  if (s.IsInvalidArgument()) return absl::InvalidArgumentError(msg);
  return absl::InternalError(msg);
}

std::string OffsetKey(const std::string& topic, int32_t partition) {
  return topic + '\0' + std::to_string(partition);
}

}  // namespace

std::string_view StateFamilyName(StateFamily family) {
  switch (family) {
    case StateFamily::kMetadata: return "metadata";
    case StateFamily::kOffsets: return "offsets";
    case StateFamily::kJobs: return "windows";  // its name in stores of earlier builds
    case StateFamily::kAlerts: return "alerts";
  }
  if (static_cast<int>(family) == 2) return "pending_steps";  // reserved (see the enum)
  return "unknown";
}

void Checkpoint::Put(StateFamily family, std::string key, std::string value) {
  bytes_ += key.size() + value.size();
  ops_.push_back({family, std::move(key), std::move(value), std::nullopt, nullptr});
}

void Checkpoint::PutDeferred(StateFamily family, std::string key,
                             std::shared_ptr<const DeferredValue> value) {
  bytes_ += key.size() + value->EstimatedBytes();
  ops_.push_back({family, std::move(key), std::nullopt, std::nullopt, std::move(value)});
}

void Checkpoint::Materialize() {
  for (Op& op : ops_) {
    if (!op.deferred) continue;
    bytes_ -= op.deferred->EstimatedBytes();
    op.value.emplace();
    op.deferred->SerializeTo(&*op.value);
    bytes_ += op.value->size();
    op.deferred.reset();
  }
}

void Checkpoint::Delete(StateFamily family, std::string key) {
  bytes_ += key.size();
  ops_.push_back({family, std::move(key), std::nullopt, std::nullopt, nullptr});
}

void Checkpoint::DeleteRange(StateFamily family, std::string begin, std::string end) {
  bytes_ += begin.size() + end.size();
  ops_.push_back({family, std::move(begin), std::nullopt, std::move(end), nullptr});
}

void Checkpoint::Append(const Checkpoint& other) {
  ops_.insert(ops_.end(), other.ops_.begin(), other.ops_.end());
  bytes_ += other.bytes_;
}

void Checkpoint::Append(Checkpoint&& other) {
  if (ops_.empty()) {
    ops_ = std::move(other.ops_);
  } else {
    ops_.insert(ops_.end(), std::make_move_iterator(other.ops_.begin()),
                std::make_move_iterator(other.ops_.end()));
  }
  bytes_ += other.bytes_;
  other.ops_.clear();
  other.bytes_ = 0;
}

void Checkpoint::SetOffset(const std::string& topic, int32_t partition, int64_t next_offset) {
  Put(StateFamily::kOffsets, OffsetKey(topic, partition), std::to_string(next_offset));
}

absl::StatusOr<std::unique_ptr<StateStore>> StateStore::Open(const StateStoreOptions& options) {
  const std::string dir = options.dir.string();
  const std::string wipe = " (remove --state-dir " + dir + " to start clean)";
  rocksdb::DBOptions db_options;
  db_options.create_if_missing = true;
  db_options.create_missing_column_families = true;
  db_options.info_log_level = rocksdb::InfoLogLevel::WARN_LEVEL;
  db_options.info_log = std::make_shared<RocksLogger>();
  // No preallocated log space: a full disk shows at the next checkpoint, not megabytes later,
  // and a small state does not reserve tens of MiB.
  db_options.allow_fallocate = false;
  // Errors are sticky by design: no automatic resume in the background after a failed write.
  db_options.max_bgerror_resume_count = 0;
  std::unique_ptr<rocksdb::Env> env;
  if (options.file_system) {
    env = rocksdb::NewCompositeEnv(options.file_system);
    db_options.env = env.get();
  }
  // One block cache for every column family, and a small one: the daemon reads its store only
  // to restore and for timelines, but each table file's range-deletion block (the steps that
  // left a job's window are deleted as a range) goes through it. RocksDB's default is a cache
  // of its own per family.
  rocksdb::BlockBasedTableOptions table_options;
  table_options.block_cache = rocksdb::NewLRUCache(options.block_cache_bytes);
  rocksdb::ColumnFamilyOptions family_options;
  family_options.table_factory.reset(rocksdb::NewBlockBasedTableFactory(table_options));
  std::vector<rocksdb::ColumnFamilyDescriptor> descriptors;
  descriptors.emplace_back(rocksdb::kDefaultColumnFamilyName, family_options);
  for (int f = 0; f < kStateFamilyCount; ++f) {
    descriptors.emplace_back(std::string(StateFamilyName(static_cast<StateFamily>(f))),
                             family_options);
  }
  auto store = std::unique_ptr<StateStore>(new StateStore());
  store->sync_ = options.sync;
  store->flush_on_close_ = options.flush_on_close;
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  rocksdb::DB* db = nullptr;
  // The directory first: RocksDB lists it before it creates it, and a first start would log
  // "Error when reading <dir> dir NotFound" as an error. A failure here (no parent, no
  // permission) is left to DB::Open, which reports it.
  (db_options.env != nullptr ? db_options.env : rocksdb::Env::Default())
      ->CreateDirIfMissing(dir)
      .PermitUncheckedError();
  rocksdb::Status s = rocksdb::DB::Open(db_options, dir, descriptors, &handles, &db);
  if (!s.ok()) {
    absl::Status st = FromRocks(s, "cannot open the state store in " + dir);
    return absl::Status(st.code(), std::string(st.message()) + wipe);
  }
  store->db_.reset(db);
  store->env_ = std::move(env);
  store->block_cache_ = table_options.block_cache;
  store->default_family_ = handles.front();
  handles.erase(handles.begin());
  store->families_ = std::move(handles);

  auto version = store->Get(StateFamily::kMetadata, kSchemaKey);
  if (!version.ok()) return version.status();
  if (!version->has_value()) {
    Checkpoint init;
    init.Put(StateFamily::kMetadata, std::string(kSchemaKey), std::to_string(kStateSchemaVersion));
    if (absl::Status c = store->Commit(init); !c.ok()) return c;
  } else {
    uint32_t stored = 0;
    const std::string& text = **version;
    auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), stored);
    if (ec != std::errc() || ptr != text.data() + text.size()) {
      return absl::DataLossError("state in " + dir + " has an unreadable schema version '" + text +
                                 "'" + wipe);
    }
    if (stored > kStateSchemaVersion) {
      return absl::FailedPreconditionError("state in " + dir +
                                           " was written by a newer rankwatchd (schema " +
                                           std::to_string(stored) + ", this build reads up to " +
                                           std::to_string(kStateSchemaVersion) + ")" + wipe);
    }
  }
  return store;
}

StateStore::~StateStore() {
  if (!db_) return;
  // A clean shutdown leaves no log to replay: the next start reads tables, which is faster.
  if (flush_on_close_ && health().ok()) (void)Flush();
  for (rocksdb::ColumnFamilyHandle* h : families_) db_->DestroyColumnFamilyHandle(h);
  if (default_family_ != nullptr) db_->DestroyColumnFamilyHandle(default_family_);
  (void)db_->Close();
  db_.reset();
}

absl::Status StateStore::Commit(const Checkpoint& checkpoint) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!sticky_.ok()) return sticky_;
  rocksdb::WriteBatch batch;
  std::string scratch;
  for (const Checkpoint::Op& op : checkpoint.ops()) {
    rocksdb::ColumnFamilyHandle* cf = families_[static_cast<int>(op.family)];
    if (op.deferred) {
      scratch.clear();
      op.deferred->SerializeTo(&scratch);
      batch.Put(cf, op.key, scratch);
    } else if (op.value) {
      batch.Put(cf, op.key, *op.value);
    } else if (op.range_end) {
      batch.DeleteRange(cf, op.key, *op.range_end);
    } else {
      batch.Delete(cf, op.key);
    }
  }
  rocksdb::WriteOptions write_options;
  write_options.sync = sync_;
  absl::Status s = FromRocks(db_->Write(write_options, &batch), "checkpoint write failed");
  if (!s.ok()) sticky_ = s;
  return s;
}

absl::StatusOr<std::optional<std::string>> StateStore::Get(StateFamily family,
                                                           std::string_view key) const {
  std::string value;
  rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), families_[static_cast<int>(family)],
                               rocksdb::Slice(key.data(), key.size()), &value);
  if (s.IsNotFound()) return std::optional<std::string>();
  if (!s.ok()) return FromRocks(s, "state read failed");
  return std::optional<std::string>(std::move(value));
}

absl::Status StateStore::ForEach(
    StateFamily family, std::string_view prefix,
    const std::function<void(std::string_view, std::string_view)>& fn) const {
  std::unique_ptr<rocksdb::Iterator> it(
      db_->NewIterator(rocksdb::ReadOptions(), families_[static_cast<int>(family)]));
  for (it->Seek(rocksdb::Slice(prefix.data(), prefix.size())); it->Valid(); it->Next()) {
    const rocksdb::Slice k = it->key();
    if (!k.starts_with(rocksdb::Slice(prefix.data(), prefix.size()))) break;
    fn(std::string_view(k.data(), k.size()),
       std::string_view(it->value().data(), it->value().size()));
  }
  return FromRocks(it->status(), "state scan failed");
}

absl::Status StateStore::Scan(
    StateFamily family, std::string_view from,
    const std::function<bool(std::string_view, std::string_view)>& fn) const {
  std::unique_ptr<rocksdb::Iterator> it(
      db_->NewIterator(rocksdb::ReadOptions(), families_[static_cast<int>(family)]));
  for (it->Seek(rocksdb::Slice(from.data(), from.size())); it->Valid(); it->Next()) {
    const rocksdb::Slice k = it->key();
    if (!fn(std::string_view(k.data(), k.size()),
            std::string_view(it->value().data(), it->value().size()))) {
      break;
    }
  }
  return FromRocks(it->status(), "state scan failed");
}

absl::StatusOr<std::optional<std::string>> StateStore::LastKey(StateFamily family) const {
  std::unique_ptr<rocksdb::Iterator> it(
      db_->NewIterator(rocksdb::ReadOptions(), families_[static_cast<int>(family)]));
  it->SeekToLast();
  if (!it->Valid()) {
    if (absl::Status s = FromRocks(it->status(), "state scan failed"); !s.ok()) return s;
    return std::optional<std::string>();
  }
  return std::optional<std::string>(it->key().ToString());
}

absl::StatusOr<std::map<std::pair<std::string, int32_t>, int64_t>> StateStore::Offsets() const {
  std::map<std::pair<std::string, int32_t>, int64_t> out;
  absl::Status bad;
  absl::Status s = ForEach(StateFamily::kOffsets, "", [&](std::string_view k, std::string_view v) {
    const size_t sep = k.find('\0');
    int32_t partition = 0;
    int64_t offset = 0;
    const bool ok =
        sep != std::string_view::npos &&
        std::from_chars(k.data() + sep + 1, k.data() + k.size(), partition).ec == std::errc() &&
        std::from_chars(v.data(), v.data() + v.size(), offset).ec == std::errc();
    if (!ok) {
      bad = absl::DataLossError("unreadable stored offset");
      return;
    }
    out[{std::string(k.substr(0, sep)), partition}] = offset;
  });
  if (!s.ok()) return s;
  if (!bad.ok()) return bad;
  return out;
}

absl::Status StateStore::Flush() {
  rocksdb::FlushOptions flush;
  for (rocksdb::ColumnFamilyHandle* h : families_) {
    if (absl::Status s = FromRocks(db_->Flush(flush, h), "state flush failed"); !s.ok()) return s;
  }
  return absl::OkStatus();
}

StateStore::MemoryUsage StateStore::Memory() const {
  MemoryUsage usage;
  for (rocksdb::ColumnFamilyHandle* h : families_) {
    uint64_t v = 0;
    if (db_->GetIntProperty(h, rocksdb::DB::Properties::kSizeAllMemTables, &v))
      usage.memtables += v;
    if (db_->GetIntProperty(h, rocksdb::DB::Properties::kEstimateTableReadersMem, &v)) {
      usage.table_readers += v;
    }
  }
  usage.block_cache = block_cache_->GetUsage();
  return usage;
}

absl::Status StateStore::health() const {
  std::lock_guard<std::mutex> lock(mu_);
  return sticky_;
}

}  // namespace rankwatch
