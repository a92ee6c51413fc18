#include "collectors/agent/trace_watcher.h"

#include <gtest/gtest.h>

#include <fstream>

namespace rankwatch {
namespace {

namespace fs = std::filesystem;

class TraceWatcherTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("trace-watcher-" + std::to_string(getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  void Write(const fs::path& rel, const std::string& text) {
    fs::create_directories((dir_ / rel).parent_path());
    std::ofstream(dir_ / rel, std::ios::app) << text;
  }
  fs::path dir_;
};

TEST_F(TraceWatcherTest, ClassifiesKinetoAndAscendNamesOnly) {
  TraceKind k;
  EXPECT_TRUE(TraceWatcher::Classify("host_123.1700000000.pt.trace.json", &k));
  EXPECT_EQ(k, TraceKind::kKineto);
  EXPECT_TRUE(TraceWatcher::Classify("a/b.pt.trace.json.gz", &k));
  EXPECT_TRUE(TraceWatcher::Classify("step_trace_raw_0_detail_time.csv", &k));
  EXPECT_EQ(k, TraceKind::kAscendIteration);
  EXPECT_FALSE(TraceWatcher::Classify("notes.json", &k));
  EXPECT_FALSE(TraceWatcher::Classify("model.pt", &k));
}

TEST_F(TraceWatcherTest, ReportsANewFileOnceWhenItStoppedGrowing) {
  Write("old.pt.trace.json", "{}");
  TraceWatcher w({dir_});
  EXPECT_TRUE(w.Poll().empty());  // existing files are not new
  Write("run/rank0.pt.trace.json", "{\"traceEvents\": [");
  EXPECT_TRUE(w.Poll().empty());  // first sight: maybe still being written
  Write("run/rank0.pt.trace.json", "]}");
  EXPECT_TRUE(w.Poll().empty());  // it grew
  auto found = w.Poll();
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].file, dir_ / "run/rank0.pt.trace.json");
  EXPECT_EQ(found[0].kind, TraceKind::kKineto);
  EXPECT_EQ(found[0].bytes, 19u);
  EXPECT_TRUE(w.Poll().empty());  // never twice
  Write("ignored.txt", "x");
  EXPECT_TRUE(w.Poll().empty());
  EXPECT_TRUE(w.Poll().empty());
}

TEST_F(TraceWatcherTest, IncludeExistingAndAMissingDirectory) {
  Write("a.pt.trace.json", "{}");
  TraceWatcher w({dir_, /*include_existing=*/true});
  EXPECT_TRUE(w.Poll().empty());
  EXPECT_EQ(w.Poll().size(), 1u);
  TraceWatcher missing({dir_ / "nope"});
  EXPECT_TRUE(missing.Poll().empty());
}

}  // namespace
}  // namespace rankwatch
