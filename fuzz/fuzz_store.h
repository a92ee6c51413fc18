// A StateStore for the state fuzz targets: one RocksDB store in the scratch directory, emptied
// between inputs (the keys an input wrote are deleted) and replaced by a fresh one every 500
// inputs so that tombstones do not pile up.
#pragma once

#include <memory>
#include <set>
#include <string>
#include <utility>

#include "fuzz/fuzz_support.h"
#include "spdlog/spdlog.h"
#include "state/state_store.h"

namespace rankwatch::fuzz {

class FuzzStore {
 public:
  FuzzStore() { spdlog::set_level(spdlog::level::off); }  // RocksDB's and the readers' logs

  // The store, empty.
  StateStore& Fresh() {
    if (store_ == nullptr || ++uses_ % 500 == 0) {
      store_.reset();
      std::error_code ec;
      std::filesystem::remove_all(Dir(), ec);
      ++generation_;
      StateStoreOptions options;
      options.dir = Dir();
      options.sync = false;
      options.flush_on_close = false;
      auto opened = StateStore::Open(options);
      RANKWATCH_FUZZ_CHECK(opened.ok());
      store_ = std::move(*opened);
    } else if (!written_.empty()) {
      Checkpoint clear;
      for (const auto& [family, key] : written_) clear.Delete(family, key);
      RANKWATCH_FUZZ_CHECK(store_->Commit(clear).ok());
    }
    written_.clear();
    return *store_;
  }

  // Commits `c` and remembers its keys for the next Fresh().
  absl::Status Commit(const Checkpoint& c) {
    for (const Checkpoint::Op& op : c.ops()) written_.emplace(op.family, op.key);
    return store_->Commit(c);
  }

 private:
  std::filesystem::path Dir() const {
    return ScratchDir() / ("store-" + std::to_string(generation_));
  }

  std::unique_ptr<StateStore> store_;
  std::set<std::pair<StateFamily, std::string>> written_;
  uint64_t uses_ = 0;
  uint64_t generation_ = 0;
};

}  // namespace rankwatch::fuzz
