#include "state/state_dir.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace rankwatch {
namespace {

absl::Status ErrnoError(const std::string& what) {
  return absl::UnavailableError(what + ": " + std::strerror(errno));
}

}  // namespace

absl::StatusOr<std::unique_ptr<StateDir>> StateDir::Open(const std::filesystem::path& path) {
  std::error_code ec;
  std::filesystem::create_directories(path, ec);
  if (ec) {
    return absl::UnavailableError("cannot create state dir " + path.string() + ": " + ec.message());
  }
  const std::string lock_path = (path / "LOCK").string();
  const int fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError("cannot open " + lock_path);
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    ::close(fd);
    return absl::FailedPreconditionError("state dir " + path.string() +
                                         " is in use by another rankwatchd");
  }
  return std::unique_ptr<StateDir>(new StateDir(path, fd));
}

StateDir::~StateDir() { ::close(lock_fd_); }

absl::Status StateDir::WriteFileAtomic(std::string_view name, std::string_view content) const {
  const std::string target = (path_ / std::string(name)).string();
  const std::string tmp = target + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError("cannot write " + tmp);
  size_t written = 0;
  while (written < content.size()) {
    const ssize_t n = ::write(fd, content.data() + written, content.size() - written);
    if (n < 0) {
      if (errno == EINTR) continue;
      ::close(fd);
      return ErrnoError("cannot write " + tmp);
    }
    written += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) {
    ::close(fd);
    return ErrnoError("cannot sync " + tmp);
  }
  ::close(fd);
  if (::rename(tmp.c_str(), target.c_str()) != 0) return ErrnoError("cannot rename " + tmp);
  return absl::OkStatus();
}

}  // namespace rankwatch
