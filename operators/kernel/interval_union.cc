#include "operators/kernel/interval_union.h"

#include <algorithm>

namespace rankwatch::kernel {

std::vector<Interval> MergeIntervals(std::vector<Interval> v) {
  std::sort(v.begin(), v.end(), [](const Interval& a, const Interval& b) { return a.ts < b.ts; });
  std::vector<Interval> out;
  int64_t max_end = 0;
  for (const Interval& i : v) {
    if (out.empty() || i.ts > max_end) {
      out.push_back(i);
      max_end = i.end;
    } else {
      max_end = std::max(max_end, i.end);
      out.back().end = std::max(out.back().end, i.end);
    }
  }
  return out;
}

int64_t UnionLength(const std::vector<Interval>& merged) {
  int64_t total = 0;
  for (const Interval& i : merged) total += i.end - i.ts;
  return total;
}

int64_t IntersectionLength(const std::vector<Interval>& a, const std::vector<Interval>& b) {
  int64_t total = 0;
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    const int64_t lo = std::max(a[i].ts, b[j].ts);
    const int64_t hi = std::min(a[i].end, b[j].end);
    if (hi > lo) total += hi - lo;
    if (a[i].end < b[j].end) {
      ++i;
    } else {
      ++j;
    }
  }
  return total;
}

}  // namespace rankwatch::kernel
