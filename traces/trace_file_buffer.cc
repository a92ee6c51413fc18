#include "traces/trace_file_buffer.h"

#include <sys/stat.h>
#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>

namespace rankwatch {
namespace {

constexpr size_t kPadding = 64;  // >= simdjson::SIMDJSON_PADDING

absl::Status Fail(const std::filesystem::path& file, const std::string& why) {
  return absl::InvalidArgumentError(file.string() + ": " + why);
}

}  // namespace

absl::Status StreamTraceFile(const std::filesystem::path& file,
                             const std::function<absl::Status(const char*, size_t)>& sink) {
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(file.c_str(), "rb"), &std::fclose);
  if (f == nullptr) {
    return absl::NotFoundError(file.string() + ": cannot open: " + std::strerror(errno));
  }
  // Pieces of at most 4 MiB; a small file gets small buffers (at least 64 KiB).
  struct stat st {};
  const size_t file_size = fstat(fileno(f.get()), &st) == 0 ? static_cast<size_t>(st.st_size) : 0;
  const size_t kChunk = std::clamp<size_t>(file_size, 64 << 10, 4 << 20);
  std::unique_ptr<char[]> in(new char[kChunk]);
  size_t n = std::fread(in.get(), 1, kChunk, f.get());
  const bool gzip = n >= 2 && static_cast<unsigned char>(in[0]) == 0x1f &&
                    static_cast<unsigned char>(in[1]) == 0x8b;
  if (!gzip) {
    while (n > 0) {
      if (auto s = sink(in.get(), n); !s.ok()) return s;
      n = std::fread(in.get(), 1, kChunk, f.get());
    }
    return std::ferror(f.get()) ? absl::InvalidArgumentError("read error") : absl::OkStatus();
  }
  std::unique_ptr<char[]> out(new char[kChunk]);
  z_stream zs{};
  if (inflateInit2(&zs, 15 + 16) != Z_OK) return absl::InternalError("zlib init failed");
  std::unique_ptr<z_stream, int (*)(z_stream*)> guard(&zs, &inflateEnd);
  bool ended = false;
  while (true) {
    if (zs.avail_in == 0) {
      if (n == 0) n = std::fread(in.get(), 1, kChunk, f.get());
      if (n == 0) break;
      zs.next_in = reinterpret_cast<Bytef*>(in.get());
      zs.avail_in = static_cast<uInt>(n);
      n = 0;
    }
    if (ended) {  // another gzip member follows (concatenated .gz files are valid gzip)
      inflateReset(&zs);
      ended = false;
    }
    zs.next_out = reinterpret_cast<Bytef*>(out.get());
    zs.avail_out = static_cast<uInt>(kChunk);
    const int rc = inflate(&zs, Z_NO_FLUSH);
    const size_t produced = kChunk - zs.avail_out;
    if (produced > 0) {
      if (auto s = sink(out.get(), produced); !s.ok()) return s;
    }
    if (rc == Z_STREAM_END) {
      ended = true;
    } else if (rc != Z_OK && rc != Z_BUF_ERROR) {
      return absl::InvalidArgumentError(std::string("corrupt gzip stream: ") +
                                        (zs.msg ? zs.msg : "inflate error"));
    }
  }
  if (std::ferror(f.get())) return absl::InvalidArgumentError("read error");
  if (!ended) return absl::InvalidArgumentError("truncated gzip stream");
  return absl::OkStatus();
}

absl::StatusOr<TraceFileBuffer> TraceFileBuffer::Read(const std::filesystem::path& file) {
  std::FILE* f = std::fopen(file.c_str(), "rb");
  if (f == nullptr) {
    return absl::NotFoundError(file.string() + ": cannot open: " + std::strerror(errno));
  }
  std::string raw;
  char chunk[1 << 16];
  size_t n;
  while ((n = std::fread(chunk, 1, sizeof chunk, f)) > 0) raw.append(chunk, n);
  const bool read_error = std::ferror(f) != 0;
  std::fclose(f);
  if (read_error) return Fail(file, "read error");

  TraceFileBuffer out;
  out.gzip_ = raw.size() >= 2 && static_cast<unsigned char>(raw[0]) == 0x1f &&
              static_cast<unsigned char>(raw[1]) == 0x8b;
  if (!out.gzip_) {
    out.capacity_ = raw.size();
    out.data_.reset(new char[raw.size() + kPadding]);
    std::memcpy(out.data_.get(), raw.data(), raw.size());
    std::memset(out.data_.get() + raw.size(), 0, kPadding);
    out.size_ = raw.size();
    return out;
  }
  if (raw.size() < 18) return Fail(file, "truncated gzip file");
  // ISIZE (the last 4 bytes) is the size mod 2^32 of the last member: a hint, not a promise.
  uint32_t isize;
  std::memcpy(&isize, raw.data() + raw.size() - 4, 4);
  // Deflate expands at most ~1032:1, so a larger ISIZE is a lie (a damaged or hostile file):
  // capped, a few bytes cannot make the reader allocate 4 GiB up front.
  out.capacity_ = std::max<size_t>(std::min<size_t>(isize, raw.size() * 1032), raw.size() * 2);
  out.data_.reset(new char[out.capacity_ + kPadding]);

  z_stream zs{};
  if (inflateInit2(&zs, 15 + 16) != Z_OK) return Fail(file, "zlib init failed");
  zs.next_in = reinterpret_cast<Bytef*>(raw.data());
  zs.avail_in = static_cast<uInt>(raw.size());
  while (true) {
    if (out.size_ == out.capacity_) {
      const size_t grown = out.capacity_ + out.capacity_ / 2 + (1 << 20);
      std::unique_ptr<char[]> bigger(new char[grown + kPadding]);
      std::memcpy(bigger.get(), out.data_.get(), out.size_);
      out.data_ = std::move(bigger);
      out.capacity_ = grown;
    }
    const size_t room = std::min<size_t>(out.capacity_ - out.size_, 1u << 30);
    zs.next_out = reinterpret_cast<Bytef*>(out.data_.get() + out.size_);
    zs.avail_out = static_cast<uInt>(room);
    const int rc = inflate(&zs, Z_NO_FLUSH);
    out.size_ += room - zs.avail_out;
    if (rc == Z_STREAM_END) {
      // Another gzip member may follow (concatenated .gz files are valid gzip).
      if (zs.avail_in >= 2 && zs.next_in[0] == 0x1f && zs.next_in[1] == 0x8b) {
        inflateReset(&zs);
        continue;
      }
      break;
    }
    if (rc == Z_BUF_ERROR && zs.avail_in == 0) {
      inflateEnd(&zs);
      return Fail(file, "truncated gzip stream");
    }
    if (rc != Z_OK && rc != Z_BUF_ERROR) {
      std::string why = zs.msg ? zs.msg : "inflate error";
      inflateEnd(&zs);
      return Fail(file, "corrupt gzip stream: " + why);
    }
  }
  inflateEnd(&zs);
  std::memset(out.data_.get() + out.size_, 0, kPadding);
  return out;
}

}  // namespace rankwatch
