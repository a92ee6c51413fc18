#include "operators/kernel/describe.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace rankwatch::kernel {
namespace {
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
}

double LinearQuantile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return kNaN;
  const double pos = (static_cast<double>(sorted.size()) - 1) * q;
  const size_t lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, sorted.size() - 1);
  const double frac = pos - static_cast<double>(lo);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * frac;
}

double Mean(const std::vector<double>& v) {
  if (v.empty()) return kNaN;
  double s = 0;
  for (double x : v) s += x;
  return s / static_cast<double>(v.size());
}

double SampleStd(const std::vector<double>& v) {
  if (v.size() < 2) return kNaN;
  const double m = Mean(v);
  double ss = 0;
  for (double x : v) ss += (x - m) * (x - m);
  return std::sqrt(ss / static_cast<double>(v.size() - 1));
}

Describe DescribeSample(std::vector<double> v) {
  v.erase(std::remove_if(v.begin(), v.end(), [](double x) { return std::isnan(x); }), v.end());
  std::sort(v.begin(), v.end());
  Describe d;
  d.count = static_cast<double>(v.size());
  d.mean = Mean(v);
  d.std = SampleStd(v);
  d.min = v.empty() ? kNaN : v.front();
  d.max = v.empty() ? kNaN : v.back();
  d.p25 = LinearQuantile(v, 0.25);
  d.p50 = LinearQuantile(v, 0.50);
  d.p75 = LinearQuantile(v, 0.75);
  return d;
}

}  // namespace rankwatch::kernel
