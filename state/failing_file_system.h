// FailingFileSystem: a RocksDB file system for tests that, once `fail` is set, fails every
// write like a full or read-only disk (for the sticky-error paths of the state store).
#pragma once

#include <rocksdb/file_system.h>

#include <atomic>
#include <memory>
#include <string>

namespace rankwatch {

// Fails every write once armed, like a full or read-only disk.
class FailingFile : public rocksdb::FSWritableFileOwnerWrapper {
 public:
  FailingFile(std::unique_ptr<rocksdb::FSWritableFile>&& file, std::atomic<bool>* fail)
      : FSWritableFileOwnerWrapper(std::move(file)), fail_(fail) {}
  rocksdb::IOStatus Append(const rocksdb::Slice& data, const rocksdb::IOOptions& o,
                           rocksdb::IODebugContext* d) override {
    if (*fail_) return rocksdb::IOStatus::NoSpace("injected: no space left on device");
    return FSWritableFileOwnerWrapper::Append(data, o, d);
  }
  rocksdb::IOStatus Append(const rocksdb::Slice& data, const rocksdb::IOOptions& o,
                           const rocksdb::DataVerificationInfo& v,
                           rocksdb::IODebugContext* d) override {
    if (*fail_) return rocksdb::IOStatus::NoSpace("injected: no space left on device");
    return FSWritableFileOwnerWrapper::Append(data, o, v, d);
  }

 private:
  std::atomic<bool>* fail_;
};

class FailingFileSystem : public rocksdb::FileSystemWrapper {
 public:
  FailingFileSystem() : FileSystemWrapper(rocksdb::FileSystem::Default()) {}
  const char* Name() const override { return "FailingFileSystem"; }
  rocksdb::IOStatus NewWritableFile(const std::string& f, const rocksdb::FileOptions& o,
                                    std::unique_ptr<rocksdb::FSWritableFile>* r,
                                    rocksdb::IODebugContext* d) override {
    rocksdb::IOStatus s = target()->NewWritableFile(f, o, r, d);
    if (s.ok()) *r = std::make_unique<FailingFile>(std::move(*r), &fail);
    return s;
  }
  std::atomic<bool> fail{false};
};

}  // namespace rankwatch
