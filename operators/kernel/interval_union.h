// Interval union as HTA merges kernel intervals (docs/spec/kernel-analysis.md section 3): sorted by
// start, an interval starts a new group only when it starts strictly after the largest end seen
// so far, so touching intervals merge. Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <vector>

namespace rankwatch::kernel {

struct Interval {
  int64_t ts = 0;
  int64_t end = 0;
};

// Merges `intervals` (any order; consumed). The result is sorted and disjoint except that a
// group of negative-length intervals keeps HTA's [min ts, max end] even when end < ts.
std::vector<Interval> MergeIntervals(std::vector<Interval> intervals);

// Σ(end − ts) over merged groups.
int64_t UnionLength(const std::vector<Interval>& merged);

// Measure of the intersection of two merged unions.
int64_t IntersectionLength(const std::vector<Interval>& a, const std::vector<Interval>& b);

}  // namespace rankwatch::kernel
