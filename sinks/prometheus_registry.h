// PrometheusRegistry: the metrics of rankwatchd and of the node agent, kept by prometheus-cpp
// (Debian's prometheus-cpp-dev, core library): a prometheus::Registry of counter and gauge
// families, exposed in the text format (0.0.4) by its TextSerializer.
//
// What this file adds on top of the library is what rankwatch's use of it needs:
//   - label values given by position: a family declares its label names once, and the code that
//     updates it passes values in that order (no std::map built per update);
//   - stable handles to series (MetricCell), updated without a lock once looked up;
//   - removal of every series of one training job in O(log n + removed): the series are indexed
//     by their label values in order, so the series whose first label is a job are one run. The
//     library itself removes a series only by its handle.
//
// Thread-safe: families guard their index with a mutex; the library guards its own maps; cells
// are the library's atomics. A cell stays valid until its series is removed.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"

namespace prometheus {
class Counter;
class Gauge;
class Registry;
template <typename T>
class Family;
}  // namespace prometheus

namespace rankwatch {

// One time series: a prometheus::Gauge or a prometheus::Counter.
class MetricCell {
 public:
  // Gauges take any value. A counter never goes down: Set moves it up to `v` and ignores a
  // smaller value, Add ignores a negative delta.
  void Set(double v);
  void Add(double delta);
  double Get() const;

 private:
  friend class MetricFamily;
  prometheus::Gauge* gauge_ = nullptr;
  prometheus::Counter* counter_ = nullptr;
};

class MetricFamily {
 public:
  // The series with these label values (one per label name, in order), created at 0.
  MetricCell* WithLabels(const std::vector<std::string>& values);
  // Whether the series with these label values exists.
  bool Has(const std::vector<std::string>& values) const;
  // Removes the series with exactly these label values, if present.
  void RemoveSeries(const std::vector<std::string>& values);
  // Removes the series whose first label equals `value` (e.g. every series of one job).
  // prometheus-cpp removes each by a scan of the family: O(series of the family) a series.
  void RemoveWhereFirstLabel(std::string_view value);
  // Makes `rows` (label values, value) the series whose first label is `first`: sets each,
  // creating what is missing, and removes that label's other series. Series that stay are
  // updated in place, not removed and re-added — prometheus-cpp removes a series by scanning its
  // family, so a per-publication "remove all, add back" costs O(series of the family).
  using Row = std::pair<std::vector<std::string>, double>;
  void SetSeriesOf(std::string_view first, const std::vector<Row>& rows);

  const std::string& name() const { return name_; }
  size_t series() const;

 private:
  friend class PrometheusRegistry;
  MetricFamily(std::string name, std::vector<std::string> label_names,
               prometheus::Family<prometheus::Gauge>* gauges,
               prometheus::Family<prometheus::Counter>* counters);
  void RemoveLocked(MetricCell* cell) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  MetricCell* FindOrAddLocked(const std::vector<std::string>& values)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string name_;
  const std::vector<std::string> label_names_;
  prometheus::Family<prometheus::Gauge>* const gauges_;      // gauge families
  prometheus::Family<prometheus::Counter>* const counters_;  // counter families
  mutable std::mutex mu_;
  std::map<std::vector<std::string>, std::unique_ptr<MetricCell>> series_ ABSL_GUARDED_BY(mu_);
};

class PrometheusRegistry {
 public:
  PrometheusRegistry();
  ~PrometheusRegistry();
  PrometheusRegistry(const PrometheusRegistry&) = delete;
  PrometheusRegistry& operator=(const PrometheusRegistry&) = delete;

  // Registers a family. Names must be unique, valid Prometheus names, and counters end in
  // `_total`; a violation is a programming error and aborts.
  MetricFamily* Counter(const std::string& name, const std::string& help,
                        std::vector<std::string> labels);
  MetricFamily* Gauge(const std::string& name, const std::string& help,
                      std::vector<std::string> labels);

  // The text exposition of every family (prometheus::TextSerializer over Collect()).
  std::string Render() const;

  // The library's registry, for code that uses prometheus-cpp directly.
  prometheus::Registry& registry() { return *registry_; }

 private:
  void CheckName(const std::string& name, const std::vector<std::string>& labels,
                 bool counter) const;

  std::unique_ptr<prometheus::Registry> registry_;
  std::mutex mu_;
  std::vector<std::unique_ptr<MetricFamily>> families_ ABSL_GUARDED_BY(mu_);
};

}  // namespace rankwatch
