// StateDir: the daemon's state directory (--state-dir). Creates it, holds an exclusive lock
// on it for the life of the process (two daemons must never share one), and writes small
// files atomically (write to a temporary file, fsync, rename).
//
// The RocksDB store of durable state (state_store.h) lives under it, in `store/`.
//
// Thread-safe.
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace rankwatch {

class StateDir {
 public:
  // Creates `path` if needed and locks it. FailedPrecondition if another process holds it.
  static absl::StatusOr<std::unique_ptr<StateDir>> Open(const std::filesystem::path& path);
  ~StateDir();

  const std::filesystem::path& path() const { return path_; }

  // Replaces file `name` inside the directory with `content`, atomically.
  absl::Status WriteFileAtomic(std::string_view name, std::string_view content) const;

 private:
  StateDir(std::filesystem::path path, int lock_fd) : path_(std::move(path)), lock_fd_(lock_fd) {}

  const std::filesystem::path path_;
  const int lock_fd_;
};

}  // namespace rankwatch
