#include "collectors/agent/proc_sampler.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

namespace rankwatch {
namespace {

namespace fs = std::filesystem;

// A fake /proc with a host and two processes, one of them a training process.
class ProcSamplerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("proc-sampler-" + std::to_string(getpid()));
    fs::create_directories(root_ / "4242");
    fs::create_directories(root_ / "77");
    fs::create_directories(root_ / "self");  // not a pid
    Host(1000, 3000);
    std::ofstream(root_ / "meminfo") << "MemTotal:       1000 kB\nMemFree:         100 kB\n"
                                        "MemAvailable:    400 kB\n";
    std::ofstream(root_ / "4242/cmdline") << std::string("/usr/bin/python3\0train.py", 25);
    std::ofstream(root_ / "77/cmdline") << std::string("sshd\0", 5);
    Proc(4242, 100, 50, 10);
    Proc(77, 1, 1, 1);
  }
  void TearDown() override { fs::remove_all(root_); }
  void Host(uint64_t busy_user, uint64_t idle) {
    std::ofstream(root_ / "stat") << "cpu  " << busy_user << " 0 0 " << idle << " 0 0 0 0 0 0\n"
                                  << "cpu0 1 2 3 4\n";
  }
  void Proc(int pid, uint64_t utime, uint64_t stime, uint64_t rss_pages) {
    std::ofstream(root_ / std::to_string(pid) / "stat")
        << pid << " (my (odd) name) S 1 1 1 0 -1 0 0 0 0 0 " << utime << " " << stime
        << " 0 0 20 0 1 0 100 12345 " << rss_pages << " 0\n";
  }
  fs::path root_;
};

TEST_F(ProcSamplerTest, HostMemoryAndTrainingProcesses) {
  ProcSampler sampler({root_.string(), "python"});
  v1::SystemSample first = sampler.Sample(1'000'000'000);
  EXPECT_EQ(first.memory_total_bytes(), 1000u * 1024);
  EXPECT_EQ(first.memory_used_bytes(), 600u * 1024);
  EXPECT_EQ(first.cpu_utilization(), 0);  // no previous sample yet
  ASSERT_EQ(first.processes_size(), 1);
  EXPECT_EQ(first.processes(0).pid(), 4242u);
  EXPECT_EQ(first.processes(0).rss_bytes(), 10u * sysconf(_SC_PAGESIZE));

  Host(1000 + 300, 3000 + 100);  // 300 of 400 ticks busy
  const long hz = sysconf(_SC_CLK_TCK);
  Proc(4242, 100 + hz, 50 + hz / 2, 20);  // 1.5 s of CPU in 2 s
  v1::SystemSample second = sampler.Sample(3'000'000'000);
  EXPECT_DOUBLE_EQ(second.cpu_utilization(), 0.75);
  ASSERT_EQ(second.processes_size(), 1);
  EXPECT_NEAR(second.processes(0).cpu_utilization(), 0.75, 0.02);
  EXPECT_EQ(second.processes(0).rss_bytes(), 20u * sysconf(_SC_PAGESIZE));
}

TEST_F(ProcSamplerTest, TheRealProcIsReadable) {
  ProcSampler sampler({"/proc", "gtest-no-such-process-xyz"});
  sampler.Sample(1);
  v1::SystemSample s = sampler.Sample(2);
  EXPECT_GT(s.memory_total_bytes(), 0u);
  EXPECT_GE(s.memory_total_bytes(), s.memory_used_bytes());
  EXPECT_EQ(s.processes_size(), 0);
}

}  // namespace
}  // namespace rankwatch
