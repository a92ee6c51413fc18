#include "collectors/agent/fr_dump_watcher.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>
#include "common/wall_clock.h"

#include <chrono>
#include <fstream>

namespace rankwatch {
namespace {

namespace fs = std::filesystem;

class FrDumpWatcherTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("fr-dump-watcher-" + std::to_string(getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    prefix_ = (dir_ / "nccl_trace_rank_").string();
  }
  void TearDown() override { fs::remove_all(dir_); }

  void Write(const std::string& name, const std::string& bytes) {
    std::ofstream(dir_ / name, std::ios::binary) << bytes;
  }
  // Moves the file's modification time `seconds` ahead (a rewrite within the clock's
  // resolution would otherwise look the same when the size does not change).
  void Touch(const std::string& name, int seconds) {
    fs::last_write_time(dir_ / name,
                        fs::last_write_time(dir_ / name) + std::chrono::seconds(seconds));
  }
  static std::vector<uint32_t> Ranks(const std::vector<FoundDump>& found) {
    std::vector<uint32_t> out;
    for (const FoundDump& d : found) out.push_back(d.rank);
    return out;
  }

  fs::path dir_;
  std::string prefix_;
};

TEST_F(FrDumpWatcherTest, RankOfName) {
  uint32_t rank = 99;
  EXPECT_TRUE(FrDumpWatcher::RankOfName("nccl_trace_rank_12", "nccl_trace_rank_", &rank));
  EXPECT_EQ(rank, 12u);
  EXPECT_TRUE(FrDumpWatcher::RankOfName("7", "", &rank));
  EXPECT_EQ(rank, 7u);
  EXPECT_FALSE(FrDumpWatcher::RankOfName("nccl_trace_rank_", "nccl_trace_rank_", &rank));
  EXPECT_FALSE(FrDumpWatcher::RankOfName("nccl_trace_rank_3.tmp", "nccl_trace_rank_", &rank));
  EXPECT_FALSE(FrDumpWatcher::RankOfName("nccl_trace_rank_3.pipe", "nccl_trace_rank_", &rank));
  EXPECT_FALSE(FrDumpWatcher::RankOfName("other_3", "nccl_trace_rank_", &rank));
  EXPECT_FALSE(FrDumpWatcher::RankOfName("nccl_trace_rank_1234567890", "nccl_trace_rank_", &rank));
}

TEST_F(FrDumpWatcherTest, ReportsStableDumpsOnceAndAgainWhenRewritten) {
  Write("nccl_trace_rank_0", "old");  // there at start: not reported
  FrDumpWatcher w({{prefix_}});
  EXPECT_TRUE(w.Poll().empty());
  Write("nccl_trace_rank_3", "dump 3");
  Write("nccl_trace_rank_10", "dump 10");
  Write("nccl_trace_rank_2.tmp", "half");  // not a dump's name
  Write("unrelated_4", "x");
  EXPECT_TRUE(w.Poll().empty());                   // seen once
  Write("nccl_trace_rank_10", "dump 10, longer");  // still being written
  std::vector<FoundDump> found = w.Poll();
  EXPECT_EQ(Ranks(found), (std::vector<uint32_t>{3}));
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].file, dir_ / "nccl_trace_rank_3");
  EXPECT_EQ(found[0].bytes, 6u);
  const int64_t now_ns = WallNowUnixNs();
  EXPECT_LT(std::abs(found[0].mtime_unix_ns - now_ns), int64_t{60'000'000'000});
  EXPECT_EQ(Ranks(w.Poll()), (std::vector<uint32_t>{10}));
  EXPECT_TRUE(w.Poll().empty());
  // Rewritten: reported again once stable; the one there at start too.
  Write("nccl_trace_rank_3", "dump 3");
  Touch("nccl_trace_rank_3", 5);
  Touch("nccl_trace_rank_0", 5);
  EXPECT_TRUE(w.Poll().empty());
  EXPECT_EQ(Ranks(w.Poll()), (std::vector<uint32_t>{0, 3}));
  EXPECT_TRUE(w.Poll().empty());
}

TEST_F(FrDumpWatcherTest, IncludeExistingAndSeveralPrefixes) {
  Write("nccl_trace_rank_1", "a");
  fs::create_directories(dir_ / "other");
  FrDumpWatcher w({{prefix_, (dir_ / "other" / "fr_").string(), (dir_ / "absent" / "x_").string()},
                   /*include_existing=*/true});
  EXPECT_TRUE(w.Poll().empty());
  std::ofstream(dir_ / "other" / "fr_5") << "b";
  EXPECT_EQ(Ranks(w.Poll()), (std::vector<uint32_t>{1}));
  EXPECT_EQ(Ranks(w.Poll()), (std::vector<uint32_t>{5}));
}

TEST_F(FrDumpWatcherTest, TriggerWritesOneByteToAPipeThatHasAReader) {
  const fs::path pipe = DumpPipePath((dir_ / "pipe_").string(), 4);
  EXPECT_EQ(pipe, dir_ / "pipe_4.pipe");
  EXPECT_EQ(TriggerDumpPipe(pipe).code(), absl::StatusCode::kNotFound);
  ASSERT_EQ(mkfifo(pipe.c_str(), 0666), 0);
  ASSERT_EQ(mkfifo((dir_ / "pipe_12.pipe").c_str(), 0666), 0);
  Write("pipe_7.pipe", "a file, not a pipe");
  EXPECT_EQ(FindDumpPipes((dir_ / "pipe_").string()), (std::vector<uint32_t>{4, 12}));
  // Nobody reads it: the process is gone.
  const absl::Status no_reader = TriggerDumpPipe(pipe);
  EXPECT_EQ(no_reader.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(no_reader.message().find("no reader"), std::string::npos) << no_reader;
  EXPECT_EQ(TriggerDumpPipe(dir_ / "pipe_7.pipe").code(), absl::StatusCode::kFailedPrecondition);
  // As PyTorch's watchdog holds it: open for reading, not blocking.
  const int fd = open(pipe.c_str(), O_RDONLY | O_NONBLOCK);
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(TriggerDumpPipe(pipe).ok());
  char buf[8];
  EXPECT_EQ(read(fd, buf, sizeof(buf)), 1);
  EXPECT_LE(read(fd, buf, sizeof(buf)), 0);  // nothing more: one byte a request
  // A full pipe (requests nobody took yet) is not an error.
  const int big = fcntl(fd, F_GETPIPE_SZ);
  ASSERT_GT(big, 0);
  for (int i = 0; i <= big; ++i) ASSERT_TRUE(TriggerDumpPipe(pipe).ok()) << i;
  close(fd);
}

}  // namespace
}  // namespace rankwatch
