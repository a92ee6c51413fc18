// ProcSampler: host CPU and memory, and the CPU and resident memory of the training
// processes, read from /proc (a `proc_root` other than /proc is for tests). CPU figures are
// rates between two calls of Sample(), so the first sample reports 0 CPU.
//
// Not thread-safe: owned by the agent's sampling thread.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "rankwatch/v1/telemetry.pb.h"

namespace rankwatch {

struct ProcSamplerOptions {
  std::string proc_root = "/proc";  // default: /proc
  // A process is a training process when its command line contains this (default "python";
  // empty = none). The sampler's own process is never one.
  std::string process_match = "python";
  size_t max_processes = 256;  // default: 256 processes per sample (the first by pid)
};

class ProcSampler {
 public:
  explicit ProcSampler(ProcSamplerOptions options);

  // One sample at `unix_ns`. Missing or unreadable files leave their fields 0: processes
  // come and go between listing and reading, which is normal.
  v1::SystemSample Sample(int64_t unix_ns);

 private:
  struct CpuTimes {
    uint64_t busy = 0, total = 0;
  };
  bool ReadHostCpu(CpuTimes* out) const;
  void ReadMemory(v1::SystemSample* s) const;
  std::vector<uint32_t> TrainingPids() const;

  const ProcSamplerOptions options_;
  const uint32_t self_pid_;
  const long ticks_per_second_;
  const long page_size_;
  CpuTimes last_host_;
  int64_t last_unix_ns_ = 0;
  std::map<uint32_t, uint64_t> last_process_ticks_;
};

}  // namespace rankwatch
