#include "state/state_store.h"

#include <gtest/gtest.h>

#include <rocksdb/file_system.h>
#include "state/failing_file_system.h"

#include <spdlog/sinks/ringbuffer_sink.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <fstream>

namespace rankwatch {
namespace {

std::filesystem::path FreshDir(const std::string& name) {
  auto p = std::filesystem::path(::testing::TempDir()) / ("state_store_" + name);
  std::filesystem::remove_all(p);
  return p;
}

TEST(StateStoreTest, CheckpointsAreDurableAcrossReopen) {
  const auto dir = FreshDir("reopen");
  {
    auto store = StateStore::Open({dir});
    ASSERT_TRUE(store.ok()) << store.status();
    Checkpoint c;
    c.Put(StateFamily::kJobs, "job-a/0", "window bytes");
    c.Put(StateFamily::kAlerts, "job-a/17", "pending");
    c.SetOffset("rankwatch.telemetry", 3, 1234);
    c.SetOffset("rankwatch.telemetry", 10, 7);
    ASSERT_TRUE((*store)->Commit(c).ok());
    Checkpoint d;
    d.Delete(StateFamily::kAlerts, "job-a/17");
    d.SetOffset("rankwatch.telemetry", 3, 1300);
    ASSERT_TRUE((*store)->Commit(d).ok());
  }
  auto store = StateStore::Open({dir});
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ(*(*store)->Get(StateFamily::kJobs, "job-a/0"), "window bytes");
  EXPECT_FALSE((*store)->Get(StateFamily::kAlerts, "job-a/17")->has_value());
  // Families are separate key spaces.
  EXPECT_FALSE((*store)->Get(StateFamily::kAlerts, "job-a/0")->has_value());
  auto offsets = (*store)->Offsets();
  ASSERT_TRUE(offsets.ok());
  ASSERT_EQ(offsets->size(), 2u);
  EXPECT_EQ((offsets->at({"rankwatch.telemetry", 3})), 1300);
  EXPECT_EQ((offsets->at({"rankwatch.telemetry", 10})), 7);
}

// A first start in a state directory that does not exist yet logs nothing at warning or above
// (RocksDB, opening a directory it has not created, used to log "Error when reading ... dir").
TEST(StateStoreTest, AFirstStartLogsNoError) {
  const auto dir = FreshDir("first_start");
  auto sink = std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(64);
  struct RestoreLogger {
    std::shared_ptr<spdlog::logger> previous = spdlog::default_logger();
    ~RestoreLogger() { spdlog::set_default_logger(previous); }
  } restore;
  spdlog::set_default_logger(std::make_shared<spdlog::logger>("capture", sink));
  {
    auto store = StateStore::Open({dir});
    ASSERT_TRUE(store.ok()) << store.status();
  }
  spdlog::set_default_logger(restore.previous);
  for (const auto& msg : sink->last_raw()) {
    EXPECT_LT(msg.level, spdlog::level::warn)
        << std::string(msg.payload.data(), msg.payload.size());
  }
  EXPECT_TRUE(std::filesystem::is_directory(dir));
}

TEST(StateStoreTest, ForEachScansAPrefixInKeyOrder) {
  auto store = StateStore::Open({FreshDir("scan")});
  ASSERT_TRUE(store.ok());
  Checkpoint c;
  c.Put(StateFamily::kJobs, "b/2", "x");
  c.Put(StateFamily::kJobs, "a/1", "y");
  c.Put(StateFamily::kJobs, "b/1", "z");
  ASSERT_TRUE((*store)->Commit(c).ok());
  std::vector<std::string> keys;
  ASSERT_TRUE((*store)
                  ->ForEach(StateFamily::kJobs, "b/",
                            [&](std::string_view k, std::string_view) { keys.emplace_back(k); })
                  .ok());
  EXPECT_EQ(keys, (std::vector<std::string>{"b/1", "b/2"}));
  Checkpoint d;
  d.DeleteRange(StateFamily::kJobs, "b/", "b/2");
  ASSERT_TRUE((*store)->Commit(d).ok());
  keys.clear();
  ASSERT_TRUE((*store)
                  ->ForEach(StateFamily::kJobs, "",
                            [&](std::string_view k, std::string_view) { keys.emplace_back(k); })
                  .ok());
  EXPECT_EQ(keys, (std::vector<std::string>{"a/1", "b/2"}));
}

TEST(StateStoreTest, StateFromANewerSchemaIsAClearError) {
  const auto dir = FreshDir("future");
  {
    auto store = StateStore::Open({dir});
    ASSERT_TRUE(store.ok());
    Checkpoint c;
    c.Put(StateFamily::kMetadata, "schema_version", std::to_string(kStateSchemaVersion + 1));
    ASSERT_TRUE((*store)->Commit(c).ok());
  }
  auto store = StateStore::Open({dir});
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(store.status().message().find("newer rankwatchd"), std::string::npos);
  EXPECT_NE(store.status().message().find("remove --state-dir"), std::string::npos);
}

TEST(StateStoreTest, UnreadableFilesAreAnErrorNotACrash) {
  const auto dir = FreshDir("corrupt");
  { ASSERT_TRUE(StateStore::Open({dir}).ok()); }
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().filename().string().starts_with("MANIFEST")) {
      std::ofstream(entry.path(), std::ios::trunc) << "this is not a manifest";
    }
  }
  auto store = StateStore::Open({dir});
  ASSERT_FALSE(store.ok());
  EXPECT_NE(store.status().message().find(dir.string()), std::string::npos) << store.status();
}

TEST(StateStoreTest, AFailedWriteIsStickyAndReadsStillWork) {
  auto fs = std::make_shared<FailingFileSystem>();
  StateStoreOptions options{FreshDir("sticky")};
  options.file_system = fs;
  auto store = StateStore::Open(options);
  ASSERT_TRUE(store.ok()) << store.status();
  Checkpoint good;
  good.Put(StateFamily::kJobs, "job", "last good");
  ASSERT_TRUE((*store)->Commit(good).ok());
  EXPECT_TRUE((*store)->health().ok());

  fs->fail = true;
  Checkpoint bad;
  bad.Put(StateFamily::kJobs, "job", "lost");
  const absl::Status first = (*store)->Commit(bad);
  ASSERT_FALSE(first.ok());
  EXPECT_EQ(first.code(), absl::StatusCode::kUnavailable) << first;
  // The disk recovers, but the store does not pretend nothing happened.
  fs->fail = false;
  Checkpoint later;
  later.Put(StateFamily::kJobs, "job", "later");
  EXPECT_EQ((*store)->Commit(later), first);
  EXPECT_EQ((*store)->health(), first);
  // The last good state can still be read.
  EXPECT_EQ(*(*store)->Get(StateFamily::kJobs, "job"), "last good");
}

}  // namespace
}  // namespace rankwatch
