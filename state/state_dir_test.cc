#include "state/state_dir.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

namespace rankwatch {
namespace {

std::filesystem::path TempDir(const std::string& name) {
  auto p = std::filesystem::temp_directory_path() /
           ("rankwatch_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(p);
  return p;
}

TEST(StateDirTest, CreatesLocksAndWritesAtomically) {
  const auto path = TempDir("statedir") / "nested";
  auto dir = StateDir::Open(path);
  ASSERT_TRUE(dir.ok()) << dir.status();
  ASSERT_TRUE((*dir)->WriteFileAtomic("endpoints.json", "{}\n").ok());
  std::ifstream in(path / "endpoints.json");
  std::stringstream ss;
  ss << in.rdbuf();
  EXPECT_EQ(ss.str(), "{}\n");
  EXPECT_FALSE(std::filesystem::exists(path / "endpoints.json.tmp"));

  // A second daemon on the same directory is refused while the first holds it.
  auto second = StateDir::Open(path);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  dir->reset();
  EXPECT_TRUE(StateDir::Open(path).ok());
  std::filesystem::remove_all(path.parent_path());
}

TEST(StateDirTest, UnwritableLocationIsAClearError) {
  auto dir = StateDir::Open("/proc/rankwatch-cannot-exist");
  ASSERT_FALSE(dir.ok());
  EXPECT_NE(dir.status().message().find("/proc/rankwatch-cannot-exist"), std::string::npos);
}

}  // namespace
}  // namespace rankwatch
