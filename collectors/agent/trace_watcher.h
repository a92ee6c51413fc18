// TraceWatcher: finds new profiler trace files under a directory (searched recursively) as
// they appear, each exactly once. Kineto (`*.pt.trace.json`, `*.pt.trace.json.gz`) and the
// Ascend iteration traces of traces/iteration_trace.h (msprof, MindSpore, torch_npu) are
// traces; everything else is ignored. A file is reported once its size and modification time
// held still across two polls, so a profiler still writing it is not caught half-way. Files
// present at the first poll are taken as already published unless `include_existing`.
//
// Not thread-safe: owned by the agent's loop.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <set>
#include <vector>

namespace rankwatch {

enum class TraceKind { kKineto, kAscendIteration };

struct FoundTrace {
  std::filesystem::path file;
  TraceKind kind;
  uint64_t bytes = 0;
};

struct TraceWatcherOptions {
  std::filesystem::path directory;  // required
  bool include_existing = false;    // default: files there at the start are not published
  size_t max_tracked = 100000;      // default: 100,000 files remembered
};

class TraceWatcher {
 public:
  explicit TraceWatcher(TraceWatcherOptions options) : options_(std::move(options)) {}

  // Scans the directory; returns the traces that became complete since the last call, in
  // path order. A missing directory yields nothing (it may be created later).
  std::vector<FoundTrace> Poll();

  // The kind of a trace file from its name; false for files that are not traces.
  static bool Classify(const std::filesystem::path& file, TraceKind* kind);

 private:
  struct Seen {
    uint64_t bytes = 0;
    int64_t mtime = 0;
  };
  const TraceWatcherOptions options_;
  bool first_poll_ = true;
  std::map<std::filesystem::path, Seen> candidates_;  // seen once, not yet stable
  std::set<std::filesystem::path> published_;
};

}  // namespace rankwatch
