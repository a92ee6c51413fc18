// pandas' Series.describe() on a sample: count, mean, std (ddof 1), min, quartiles with linear
// interpolation, max; NaN where pandas gives NaN (empty sample, std of one value). Pure.
#pragma once

#include <cstdint>
#include <vector>

namespace rankwatch::kernel {

struct Describe {
  double count = 0;
  double mean, std, min, p25, p50, p75, max;  // NaN when undefined
};

// Describes `values` (consumed; NaNs are skipped like pandas does).
Describe DescribeSample(std::vector<double> values);

// pandas' quantile with linear interpolation at position (n−1)·q of sorted `values`.
double LinearQuantile(const std::vector<double>& sorted, double q);

double Mean(const std::vector<double>& values);
// Sample standard deviation (ddof 1); NaN for fewer than two values.
double SampleStd(const std::vector<double>& values);

}  // namespace rankwatch::kernel
