// FrDumpWatcher: finds the PyTorch Flight Recorder dumps a job's ranks write on this node, and
// the pipes through which PyTorch takes dump requests. Owned by the node agent
// (collectors/agent/node_agent.h).
//
// Dumps: a job sets TORCH_NCCL_DEBUG_INFO_TEMP_FILE to a prefix (PyTorch's default:
// /tmp/nccl_trace_rank_) and each rank writes its dump to `${prefix}${rank}` (the global rank)
// on a watchdog timeout (TORCH_NCCL_DUMP_ON_TIMEOUT) or when asked. The watcher lists the
// prefix's directory (not recursively) for files named basename(prefix) followed by a decimal
// rank, and reports a file once its size and modification time held still across two polls
// (PyTorch writes the file in place), and again each time it is rewritten (a new size or time).
// Files present at the first poll are taken as already reported unless `include_existing`.
// Other names (a temporary `…3.tmp`, the pipes) are not dumps.
//
// Pipes: with TORCH_NCCL_DEBUG_INFO_PIPE_FILE set (and TORCH_NCCL_TRACE_BUFFER_SIZE > 0), the
// NCCL watchdog of each rank's default process group creates the FIFO
// `${pipe_prefix}${rank}.pipe` (mkfifo, opened O_RDONLY|O_NONBLOCK) and writes a dump when it
// reads a byte from it. TriggerDumpPipe writes that byte.
//
// Not thread-safe: owned by the agent's loop.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace rankwatch {

struct FoundDump {
  std::filesystem::path file;
  uint32_t rank = 0;
  uint64_t bytes = 0;
  int64_t mtime_unix_ns = 0;
};

struct FrDumpWatcherOptions {
  std::vector<std::string> prefixes;  // TORCH_NCCL_DEBUG_INFO_TEMP_FILE values (required)
  bool include_existing = false;      // default: dumps there at the start are not reported
  size_t max_tracked = 100000;        // default: 100,000 files remembered
};

class FrDumpWatcher {
 public:
  explicit FrDumpWatcher(FrDumpWatcherOptions options) : options_(std::move(options)) {}

  // Lists the prefixes' directories; returns the dumps that became complete (or were
  // rewritten) since the last call, by prefix and then file name. A missing directory yields
  // nothing (it may be created later).
  std::vector<FoundDump> Poll();

  // The rank in a file name that is `base` followed by a decimal rank (at most 9 digits);
  // false for any other name.
  static bool RankOfName(const std::string& name, const std::string& base, uint32_t* rank);

 private:
  struct Seen {
    uint64_t bytes = 0;
    int64_t mtime = 0;
    bool operator==(const Seen& o) const { return bytes == o.bytes && mtime == o.mtime; }
  };
  const FrDumpWatcherOptions options_;
  bool first_poll_ = true;
  std::map<std::filesystem::path, Seen> candidates_;  // seen once as they are now
  std::map<std::filesystem::path, Seen> reported_;    // as they were when reported
};

// `${pipe_prefix}${rank}.pipe`.
std::filesystem::path DumpPipePath(const std::string& pipe_prefix, uint32_t rank);

// The ranks whose dump pipe exists under `pipe_prefix` (FIFOs named basename(prefix) + rank +
// ".pipe"), ascending.
std::vector<uint32_t> FindDumpPipes(const std::string& pipe_prefix);

// Asks the rank behind `pipe` for a dump: opens it O_WRONLY|O_NONBLOCK and writes one byte.
// NotFound: no such file. FailedPrecondition: not a FIFO, or no reader (ENXIO: the process is
// gone, or its watchdog does not take dump requests). A full pipe (a request is already
// waiting) counts as success. Other errors: Internal with the system's message.
absl::Status TriggerDumpPipe(const std::filesystem::path& pipe);

}  // namespace rankwatch
