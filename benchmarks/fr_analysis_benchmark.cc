// Cost of the offline Flight Recorder analysis (issue #35, acceptance 5: 16,384 ranks' dumps in
// <= 5 s and <= 2 GiB): what `rankwatch flight-recorder PATH` does, timed in its two parts:
//   - read: finding the dump files under PATH and reading and parsing every one of them
//     (fr::LoadDumps, the reader of flight_recorder/fr_reader.h);
//   - analysis: fr::AnalyzeFlightRecorder over all of them;
// and their sum. Each run starts from nothing (the previous run's dumps and verdict are freed).
// Prints each run's times, the medians, the process's peak RSS (getrusage ru_maxrss: the whole
// process, every run included), the dumps by state, the verdict's summary line and its culprits,
// so that a run shows it is right. The dumps: the fixture sets, or a large job made by
// benchmarks/fr_scale.py.
//
// Usage: fr_analysis_benchmark [--repeat 1] [--expect-culprits 9,14] [--world-size N] PATH...
//   PATH: a folder of dumps (`<prefix><rank>`), a dump prefix or files, as for the CLI.
//   --expect-culprits: exit 1 unless the culprits are exactly these ranks (every run).
// Exit status: 0, 1 when the culprits differ from --expect-culprits, 2 on a usage or read error.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "flight_recorder/fr_analysis.h"
#include "flight_recorder/fr_files.h"
#include "flight_recorder/fr_report.h"

namespace {

using rankwatch::fr::FrCulprit;
using rankwatch::fr::FrVerdict;
using rankwatch::fr::RankDump;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

double PeakRssMiB() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_maxrss) / 1024.0;  // ru_maxrss: KiB on Linux
}

bool ParseRanks(const char* text, std::set<uint32_t>* out) {
  std::stringstream list(text);
  std::string item;
  while (std::getline(list, item, ',')) {
    if (item.empty()) continue;
    char* end = nullptr;
    const unsigned long r = std::strtoul(item.c_str(), &end, 10);
    if (*end != '\0') return false;
    out->insert(static_cast<uint32_t>(r));
  }
  return true;
}

std::string RankList(const std::vector<uint32_t>& ranks, size_t max = 16) {
  std::string s;
  for (size_t i = 0; i < ranks.size() && i < max; ++i)
    s += (i ? "," : "") + std::to_string(ranks[i]);
  if (ranks.size() > max) s += ",... (" + std::to_string(ranks.size()) + ")";
  return s.empty() ? "-" : s;
}

void PrintVerdict(const std::vector<RankDump>& dumps, const FrVerdict& v) {
  std::printf(
      "dumps: %zu files, world %u: read %zu, empty %zu [%s], unreadable %zu [%s], missing %zu\n",
      dumps.size(), v.world_size, v.read.size(), v.empty.size(), RankList(v.empty).c_str(),
      v.unreadable.size(), RankList(v.unreadable).c_str(), v.missing.size());
  std::printf("verdict: %s\n", v.summary.c_str());
  for (const FrCulprit& c : v.culprits)
    std::printf("culprit: rank %u, %s, in %s, %s; waiting directly %zu, blocked %u\n", c.rank,
                rankwatch::fr::CulpritReasonName(c.reason),
                rankwatch::fr::GroupText(c.group_desc, c.group_ranks).c_str(),
                rankwatch::fr::OpText(c.op).c_str(), c.waiting.size(), c.blocked);
  if (v.culprits.empty()) std::printf("culprit: none\n");
}

}  // namespace

int main(int argc, char** argv) {
  int repeat = 1;
  bool expect = false;
  std::set<uint32_t> expected;
  rankwatch::fr::FrAnalysisOptions options;
  std::vector<std::filesystem::path> paths;
  for (int i = 1; i < argc; ++i) {
    const bool has_value = i + 1 < argc;
    if (!std::strcmp(argv[i], "--repeat") && has_value) {
      repeat = std::max(1, std::atoi(argv[++i]));
    } else if (!std::strcmp(argv[i], "--expect-culprits") && has_value) {
      expect = true;
      if (!ParseRanks(argv[++i], &expected)) {
        std::fprintf(stderr, "--expect-culprits: ranks separated by commas, got %s\n", argv[i]);
        return 2;
      }
    } else if (!std::strcmp(argv[i], "--world-size") && has_value) {
      options.world_size = static_cast<uint32_t>(std::strtoul(argv[++i], nullptr, 10));
    } else if (argv[i][0] == '-') {
      std::fprintf(stderr,
                   "usage: fr_analysis_benchmark [--repeat N] [--expect-culprits R,R...] "
                   "[--world-size N] PATH...\n");
      return 2;
    } else {
      paths.emplace_back(argv[i]);
    }
  }
  if (paths.empty()) {
    std::fprintf(stderr, "fr_analysis_benchmark: no PATH (a folder of dumps, a prefix or files)\n");
    return 2;
  }

  using Clock = std::chrono::steady_clock;
  auto seconds = [](Clock::duration d) {
    return std::chrono::duration<double, std::milli>(d).count();
  };
  std::vector<double> reads, analyses, totals;
  bool right = true;
  for (int run = 0; run < repeat; ++run) {
    const auto t0 = Clock::now();
    auto dumps = rankwatch::fr::LoadDumps(paths);
    if (!dumps.ok()) {
      std::fprintf(stderr, "fr_analysis_benchmark: %s\n",
                   std::string(dumps.status().message()).c_str());
      return 2;
    }
    const auto t1 = Clock::now();
    const FrVerdict v = rankwatch::fr::AnalyzeFlightRecorder(*dumps, options);
    const auto t2 = Clock::now();
    reads.push_back(seconds(t1 - t0));
    analyses.push_back(seconds(t2 - t1));
    totals.push_back(seconds(t2 - t0));
    std::printf("run %d: read %.2f ms, analysis %.2f ms, total %.2f ms\n", run + 1, reads.back(),
                analyses.back(), totals.back());
    std::set<uint32_t> named;
    for (const FrCulprit& c : v.culprits) named.insert(c.rank);
    if (expect && named != expected) right = false;
    if (run + 1 == repeat || (expect && named != expected)) PrintVerdict(*dumps, v);
  }
  std::printf("median of %d: read %.2f ms, analysis %.2f ms, total %.2f ms; peak RSS %.0f MiB\n",
              repeat, Median(reads), Median(analyses), Median(totals), PeakRssMiB());
  if (expect) {
    std::vector<uint32_t> want(expected.begin(), expected.end());
    std::printf("expected culprits %s: %s\n", RankList(want).c_str(), right ? "yes" : "NO");
  }
  return right ? 0 : 1;
}
