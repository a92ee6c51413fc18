// FormatRankRanges: a sorted list of ranks as runs, "0-3, 5, 7-8" — the one formatter of rank
// lists for people (diagnoses, hang stacks, Flight Recorder verdicts), each caller choosing its
// separators.
//
// Pure; thread-safe.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace rankwatch {

// How runs are written. Default: "0-2, 4".
struct RankRangeStyle {
  std::string_view separator = ", ";  // between items
  std::string_view dash = "-";        // inside a run, "0-2"
  // Consecutive ranks written as a run from this many on; shorter runs are listed one by one
  // ("0,1" at 3). Default: 2 ("0-1").
  size_t min_run = 2;
};

// `sorted` ascending, without repeats.
inline std::string FormatRankRanges(std::span<const uint32_t> sorted,
                                    const RankRangeStyle& style = {}) {
  std::string out;
  for (size_t i = 0; i < sorted.size();) {
    size_t j = i;
    while (j + 1 < sorted.size() && sorted[j + 1] == sorted[j] + 1) ++j;
    if (!out.empty()) out += style.separator;
    out += std::to_string(sorted[i]);
    if (j + 1 - i >= style.min_run) {
      out += style.dash;
      out += std::to_string(sorted[j]);
    } else if (j > i) {
      for (size_t k = i + 1; k <= j; ++k) {
        out += style.separator;
        out += std::to_string(sorted[k]);
      }
    }
    i = j + 1;
  }
  return out;
}

// Any contiguous list of ranks (a std::vector, a protobuf RepeatedField).
template <typename Ranks>
requires requires(const Ranks& r) {
  { r.data() } -> std::convertible_to<const uint32_t*>;
  r.size();
}
std::string FormatRankRanges(const Ranks& sorted, const RankRangeStyle& style = {}) {
  return FormatRankRanges(
      std::span<const uint32_t>(sorted.data(), static_cast<size_t>(sorted.size())), style);
}

}  // namespace rankwatch
