#include "collectors/agent/fr_dump_watcher.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

namespace rankwatch {
namespace {

// The directory a prefix's files live in ("." for a bare name) and their name's start.
std::pair<std::filesystem::path, std::string> Split(const std::string& prefix) {
  const std::filesystem::path p(prefix);
  std::filesystem::path dir = p.parent_path();
  if (dir.empty()) dir = ".";
  // A prefix ending in '/' names a directory: its files are the bare ranks.
  const std::string base = !prefix.empty() && prefix.back() == '/' ? "" : p.filename().string();
  return {dir, base};
}

}  // namespace

bool FrDumpWatcher::RankOfName(const std::string& name, const std::string& base, uint32_t* rank) {
  if (name.size() <= base.size() || name.compare(0, base.size(), base) != 0) return false;
  const size_t digits = name.size() - base.size();
  if (digits > 9) return false;
  uint32_t r = 0;
  for (size_t i = base.size(); i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return false;
    r = r * 10 + static_cast<uint32_t>(name[i] - '0');
  }
  *rank = r;
  return true;
}

std::vector<FoundDump> FrDumpWatcher::Poll() {
  std::vector<FoundDump> ready;
  std::map<std::filesystem::path, Seen> now;
  for (const std::string& prefix : options_.prefixes) {
    const auto [dir, base] = Split(prefix);
    std::error_code ec;
    std::vector<std::pair<std::filesystem::path, uint32_t>> files;
    for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
      uint32_t rank = 0;
      if (!RankOfName(it->path().filename().string(), base, &rank)) continue;
      std::error_code fe;
      if (!it->is_regular_file(fe)) continue;
      files.emplace_back(it->path(), rank);
    }
    std::sort(files.begin(), files.end());
    for (const auto& [file, rank] : files) {
      std::error_code fe;
      Seen s;
      s.bytes = std::filesystem::file_size(file, fe);
      if (fe) continue;
      const auto mtime = std::filesystem::last_write_time(file, fe);
      if (fe) continue;
      s.mtime = std::chrono::duration_cast<std::chrono::nanoseconds>(
                    std::chrono::file_clock::to_sys(mtime).time_since_epoch())
                    .count();
      if (first_poll_ && !options_.include_existing) {
        reported_[file] = s;
        continue;
      }
      auto done = reported_.find(file);
      if (done != reported_.end() && done->second == s) continue;
      auto before = candidates_.find(file);
      if (before != candidates_.end() && before->second == s &&
          (done != reported_.end() || reported_.size() < options_.max_tracked)) {
        reported_[file] = s;
        ready.push_back({file, rank, s.bytes, s.mtime});
      } else {
        now[file] = s;
      }
    }
  }
  first_poll_ = false;
  candidates_ = std::move(now);
  return ready;
}

std::filesystem::path DumpPipePath(const std::string& pipe_prefix, uint32_t rank) {
  return std::filesystem::path(pipe_prefix + std::to_string(rank) + ".pipe");
}

std::vector<uint32_t> FindDumpPipes(const std::string& pipe_prefix) {
  const auto [dir, base] = Split(pipe_prefix);
  std::vector<uint32_t> ranks;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::string name = it->path().filename().string();
    constexpr std::string_view kSuffix = ".pipe";
    if (name.size() <= kSuffix.size() ||
        name.compare(name.size() - kSuffix.size(), kSuffix.size(), kSuffix) != 0) {
      continue;
    }
    name.resize(name.size() - kSuffix.size());
    uint32_t rank = 0;
    std::error_code fe;
    if (FrDumpWatcher::RankOfName(name, base, &rank) && it->is_fifo(fe)) ranks.push_back(rank);
  }
  std::sort(ranks.begin(), ranks.end());
  return ranks;
}

absl::Status TriggerDumpPipe(const std::filesystem::path& pipe) {
  struct stat st {};
  if (::stat(pipe.c_str(), &st) != 0) {
    if (errno == ENOENT) return absl::NotFoundError(pipe.string() + " does not exist");
    return absl::InternalError(pipe.string() + ": " + std::strerror(errno));
  }
  if (!S_ISFIFO(st.st_mode)) {
    return absl::FailedPreconditionError(pipe.string() + " is not a pipe");
  }
  const int fd = ::open(pipe.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENXIO) {
      return absl::FailedPreconditionError(
          "no reader on " + pipe.string() +
          " (the process is gone, or its NCCL watchdog does not take dump requests)");
    }
    return absl::InternalError("cannot open " + pipe.string() + ": " + std::strerror(errno));
  }
  const char byte = '1';
  ssize_t n;
  do {
    n = ::write(fd, &byte, 1);
  } while (n < 0 && errno == EINTR);
  const int write_errno = errno;
  ::close(fd);
  if (n == 1 || (n < 0 && write_errno == EAGAIN)) return absl::OkStatus();  // full: one waits
  return absl::InternalError("cannot write to " + pipe.string() + ": " +
                             std::strerror(write_errno));
}

}  // namespace rankwatch
