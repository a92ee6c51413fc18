// Helpers shared by the fuzz targets (fuzz/fuzz_*.cc): a scratch directory for decoders that
// read files, and the record framing the state targets use to split one input into keys and
// values. See docs/fuzzing.md.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>

namespace rankwatch::fuzz {

// A directory of this process's own, removed when the process exits normally.
inline const std::filesystem::path& ScratchDir() {
  static const std::filesystem::path dir = [] {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl =
        std::string(base != nullptr && *base != '\0' ? base : "/tmp") + "/rankwatch-fuzz-XXXXXX";
    if (mkdtemp(tmpl.data()) == nullptr) {
      std::perror("mkdtemp");
      std::abort();
    }
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(ScratchDir(), ec);
    });
    return std::filesystem::path(tmpl);
  }();
  return dir;
}

// Writes `bytes` to `path` (parent directories created); aborts on failure (not the input's
// fault).
inline void WriteFile(const std::filesystem::path& path, std::string_view bytes) {
  std::error_code ec;
  std::filesystem::create_directories(path.parent_path(), ec);
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr || std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size()) {
    std::perror(path.c_str());
    std::abort();
  }
  std::fclose(f);
}

// One input framed as records: a flags byte, a 2-byte big-endian key length, the key, a 2-byte
// big-endian value length, the value. A record cut short by the end of the input is dropped.
struct Record {
  uint8_t flags = 0;
  std::string_view key;
  std::string_view value;
};

class RecordReader {
 public:
  RecordReader(const uint8_t* data, size_t size)
      : data_(reinterpret_cast<const char*>(data)), size_(size) {}

  std::optional<Record> Next() {
    Record r;
    uint16_t klen, vlen;
    if (!Byte(&r.flags) || !U16(&klen) || !Bytes(klen, &r.key) || !U16(&vlen) ||
        !Bytes(vlen, &r.value)) {
      return std::nullopt;
    }
    return r;
  }

 private:
  bool Byte(uint8_t* out) {
    if (at_ >= size_) return false;
    *out = static_cast<uint8_t>(data_[at_++]);
    return true;
  }
  bool U16(uint16_t* out) {
    uint8_t hi, lo;
    if (!Byte(&hi) || !Byte(&lo)) return false;
    *out = static_cast<uint16_t>(hi << 8 | lo);
    return true;
  }
  bool Bytes(size_t n, std::string_view* out) {
    if (size_ - at_ < n) return false;
    *out = std::string_view(data_ + at_, n);
    at_ += n;
    return true;
  }

  const char* data_;
  size_t size_;
  size_t at_ = 0;
};

// Appends one record in RecordReader's framing (for seed generators).
inline void AppendRecord(std::string* out, uint8_t flags, std::string_view key,
                         std::string_view value) {
  auto u16 = [out](size_t n) {
    out->push_back(static_cast<char>((n >> 8) & 0xff));
    out->push_back(static_cast<char>(n & 0xff));
  };
  out->push_back(static_cast<char>(flags));
  u16(key.size());
  out->append(key);
  u16(value.size());
  out->append(value);
}

// A property of the decoded result was violated: abort so the fuzzer reports the input.
#define RANKWATCH_FUZZ_CHECK(cond)                                                       \
  do {                                                                                   \
    if (!(cond)) {                                                                       \
      std::fprintf(stderr, "%s:%d: fuzz check failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                      \
    }                                                                                    \
  } while (0)

}  // namespace rankwatch::fuzz
