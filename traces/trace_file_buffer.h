// The bytes of a trace file, gunzipped when the file is gzip (multi-member aware), in one
// buffer with simdjson's padding after the end so it can be parsed in place.
//
// A TraceFileBuffer owns its memory; not thread-safe to mutate. Reading sizes the buffer from the
// gzip trailer, so a file decompresses without a second copy.
#pragma once

#include <cstddef>
#include <filesystem>
#include <functional>
#include <memory>
#include <string_view>

#include "absl/status/statusor.h"

namespace rankwatch {

// Reads `file` in pieces of at most 4 MiB, inflated when it is gzip, and hands each piece to
// `sink` in order; stops at the first error `sink` returns. NotFound (naming the file) when it
// cannot be opened; InvalidArgument without the file name for a corrupt or truncated stream.
absl::Status StreamTraceFile(const std::filesystem::path& file,
                             const std::function<absl::Status(const char*, size_t)>& sink);

class TraceFileBuffer {
 public:
  // Reads `file`, inflating it when it starts with the gzip magic bytes. Errors name the file:
  // NotFound when it cannot be opened, InvalidArgument for a corrupt or truncated gzip stream.
  static absl::StatusOr<TraceFileBuffer> Read(const std::filesystem::path& file);

  // The (decompressed) content; at least 64 readable padding bytes follow its end.
  std::string_view view() const { return {data_.get(), size_}; }
  size_t size() const { return size_; }
  bool was_gzip() const { return gzip_; }

 private:
  std::unique_ptr<char[]> data_;
  size_t size_ = 0;
  size_t capacity_ = 0;  // excluding padding
  bool gzip_ = false;
};

}  // namespace rankwatch
