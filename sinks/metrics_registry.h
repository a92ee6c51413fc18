// MetricsRegistry: Prometheus metric families and their text exposition (format 0.0.4).
//
// prometheus-cpp is not packaged in Debian 12, so rankwatch keeps this small registry: gauges
// and counters with labels, lock-free updates of a series once its cell is looked up, and a
// deterministic (sorted) rendering.
//
// Thread-safe: families guard their series map with a mutex; cells are atomics, and a cell
// stays valid until its series is removed.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>
#include "absl/base/thread_annotations.h"

namespace rankwatch {

// One time series' value.
class MetricCell {
 public:
  void Set(double v) { value_.store(v, std::memory_order_relaxed); }
  void Add(double delta);
  double Get() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

class MetricFamily {
 public:
  enum class Type { kCounter, kGauge };

  MetricFamily(std::string name, std::string help, Type type, std::vector<std::string> label_names);

  // The series with these label values (one per label name, in order), created at 0.
  MetricCell* WithLabels(const std::vector<std::string>& values);
  // Removes the series with exactly these label values, if present.
  void RemoveSeries(const std::vector<std::string>& values);
  // Removes the series whose first label equals `value` (e.g. every series of one job).
  void RemoveWhereFirstLabel(std::string_view value);

  const std::string& name() const { return name_; }
  void Render(std::string* out) const;

 private:
  const std::string name_;
  const std::string help_;
  const Type type_;
  const std::vector<std::string> label_names_;
  mutable std::mutex mu_;
  std::map<std::vector<std::string>, std::unique_ptr<MetricCell>> series_ ABSL_GUARDED_BY(mu_);
};

class MetricsRegistry {
 public:
  // Registers a family. Names must be unique and valid Prometheus names; a violation is a
  // programming error and aborts.
  MetricFamily* Counter(std::string name, std::string help, std::vector<std::string> labels);
  MetricFamily* Gauge(std::string name, std::string help, std::vector<std::string> labels);

  // The exposition text of every family, in registration order.
  std::string Render() const;

 private:
  MetricFamily* Add(std::string name, std::string help, MetricFamily::Type type,
                    std::vector<std::string> labels);

  mutable std::mutex mu_;
  std::vector<std::unique_ptr<MetricFamily>> families_ ABSL_GUARDED_BY(mu_);
};

// Formats a sample value as Prometheus expects (integers without exponent, NaN, +Inf).
std::string FormatMetricValue(double v);

// Escapes a label value (backslash, double quote, newline).
std::string EscapeLabelValue(std::string_view v);

}  // namespace rankwatch
