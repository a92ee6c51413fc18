#include "flight_recorder/fr_files.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <system_error>
#include <thread>

#include "absl/status/status.h"

namespace rankwatch::fr {
namespace fs = std::filesystem;

bool RankFromFileName(const fs::path& file, uint32_t* rank) {
  const std::string name = file.filename().string();
  size_t i = name.size();
  while (i > 0 && name[i - 1] >= '0' && name[i - 1] <= '9') --i;
  if (i == name.size() || name.size() - i > 9) return false;
  *rank = static_cast<uint32_t>(std::stoul(name.substr(i)));
  return true;
}

absl::StatusOr<std::vector<std::pair<uint32_t, fs::path>>> FindDumpFiles(const fs::path& path) {
  std::vector<std::pair<uint32_t, fs::path>> out;
  std::error_code ec;
  uint32_t rank = 0;
  if (fs::is_directory(path, ec)) {
    for (const auto& entry : fs::directory_iterator(path, ec)) {
      if (entry.is_regular_file(ec) && RankFromFileName(entry.path(), &rank))
        out.emplace_back(rank, entry.path());
    }
  } else if (fs::is_regular_file(path, ec)) {
    if (!RankFromFileName(path, &rank))
      return absl::InvalidArgumentError(path.string() + ": the file name carries no rank");
    out.emplace_back(rank, path);
  } else {
    // A prefix: PREFIX<digits>.
    const fs::path dir = path.has_parent_path() ? path.parent_path() : fs::path(".");
    const std::string stem = path.filename().string();
    for (const auto& entry : fs::directory_iterator(dir, ec)) {
      const std::string name = entry.path().filename().string();
      if (!entry.is_regular_file(ec) || name.size() <= stem.size() ||
          name.compare(0, stem.size(), stem) != 0)
        continue;
      const std::string rest = name.substr(stem.size());
      if (rest.size() > 9 ||
          !std::all_of(rest.begin(), rest.end(), [](char c) { return c >= '0' && c <= '9'; }))
        continue;
      out.emplace_back(static_cast<uint32_t>(std::stoul(rest)), entry.path());
    }
  }
  if (ec) return absl::NotFoundError(path.string() + ": " + ec.message());
  if (out.empty())
    return absl::NotFoundError(path.string() +
                               ": no Flight Recorder dumps (files named <prefix><rank>)");
  std::sort(out.begin(), out.end());
  return out;
}

RankDump LoadRankDump(uint32_t rank, const fs::path& file, const FrReadOptions& options) {
  RankDump d;
  d.rank = rank;
  d.source = file.string();
  absl::StatusOr<FrDump> dump = ReadFrDumpFile(file, options);
  if (!dump.ok()) {
    d.state = DumpState::kUnreadable;
    d.error = std::string(dump.status().message());
    return d;
  }
  if (dump->rank >= static_cast<int64_t>(kMaxWorldSize)) {
    d.state = DumpState::kUnreadable;
    d.error = "the dump's rank " + std::to_string(dump->rank) + " is beyond " +
              std::to_string(kMaxWorldSize) + " ranks";
    return d;
  }
  d.dump = *std::move(dump);
  if (d.dump.rank >= 0) d.rank = static_cast<uint32_t>(d.dump.rank);
  d.state = d.dump.entries.empty() ? DumpState::kEmpty : DumpState::kRead;
  return d;
}

absl::StatusOr<std::vector<RankDump>> LoadDumps(const std::vector<fs::path>& paths,
                                                const FrReadOptions& options) {
  std::map<uint32_t, std::pair<fs::file_time_type, fs::path>> by_rank;
  for (const fs::path& p : paths) {
    auto files = FindDumpFiles(p);
    if (!files.ok()) return files.status();
    for (const auto& [rank, file] : *files) {
      if (rank >= kMaxWorldSize)
        return absl::InvalidArgumentError(file.string() + ": rank " + std::to_string(rank) +
                                          " (from the file name) is beyond " +
                                          std::to_string(kMaxWorldSize) + " ranks");
      std::error_code ec;
      const fs::file_time_type t = fs::last_write_time(file, ec);
      auto it = by_rank.find(rank);
      if (it == by_rank.end() || t > it->second.first) by_rank[rank] = {t, file};
    }
  }
  // Read in parallel, the groups' rank lists shared among the dumps.
  FrRanksInterner interner;
  FrReadOptions shared = options;
  if (shared.interner == nullptr) shared.interner = &interner;
  std::vector<std::pair<uint32_t, fs::path>> files;
  std::vector<fs::file_time_type> times;
  files.reserve(by_rank.size());
  for (const auto& [rank, tf] : by_rank) {
    files.emplace_back(rank, tf.second);
    times.push_back(tf.first);
  }
  std::vector<RankDump> out(files.size());
  std::atomic<size_t> next{0};
  auto work = [&]() {
    for (size_t i = next++; i < files.size(); i = next++)
      out[i] = LoadRankDump(files[i].first, files[i].second, shared);
  };
  const size_t threads = std::min<size_t>(
      {std::max(1u, std::thread::hardware_concurrency()), size_t{8}, (files.size() + 63) / 64});
  std::vector<std::thread> pool;
  for (size_t t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  // A dump's own rank wins over its file name's: two files may now give one rank. The later
  // file is kept.
  std::vector<size_t> order(out.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return out[a].rank != out[b].rank ? out[a].rank < out[b].rank : times[a] > times[b];
  });
  std::vector<RankDump> unique;
  unique.reserve(out.size());
  for (size_t i : order)
    if (unique.empty() || unique.back().rank != out[i].rank) unique.push_back(std::move(out[i]));
  out = std::move(unique);
  return out;
}

}  // namespace rankwatch::fr
