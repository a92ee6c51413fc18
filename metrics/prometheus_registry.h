// PrometheusRegistry: the metrics of rankwatchd and of the node agent, exposed with prometheus-cpp
// (Debian's prometheus-cpp-dev, core library): each family is a prometheus::Collectable that
// produces the library's MetricFamily / ClientMetric data model, and the text exposition (0.0.4)
// is the library's TextSerializer; metric and label names are checked by its CheckMetricName /
// CheckLabelName.
//
// The series themselves are kept here, not in prometheus::Family, because rankwatch removes
// series all the time (every series of a job when it is retired or evicted; a culprit's series
// when the culprit changes) and prometheus-cpp 1.0 removes a series by scanning its whole family:
// with 10,000 jobs, removing one job's series from its families took ~0.5 s
// (benchmarks/metrics_render_benchmark.cc, BM_RemoveJob, measured on prometheus::Family). Here:
//   - label values are given by position: a family declares its label names once, and the code
//     that updates it passes values in that order;
//   - a series is a stable handle (MetricCell, an atomic), updated without a lock once looked up;
//   - series are indexed by their label values in order, so the series whose first label is a
//     job are one run: removing them is O(log n + removed).
//
// Thread-safe: families guard their index with a mutex; cells are atomics. A cell stays valid
// until its series is removed.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include <prometheus/collectable.h>

#include "absl/base/thread_annotations.h"

namespace rankwatch {

// One time series' value.
class MetricCell {
 public:
  // A counter never goes down: Set moves it up to `v` and ignores a smaller value, Add ignores
  // a negative delta. Gauges take any value.
  void Set(double v);
  void Add(double delta);
  double Get() const { return value_.load(std::memory_order_relaxed); }

 private:
  friend class MetricFamily;
  explicit MetricCell(bool counter) : counter_(counter) {}
  const bool counter_;
  std::atomic<double> value_{0};
};

class MetricFamily : public prometheus::Collectable {
 public:
  // The series with these label values (one per label name, in order), created at 0.
  MetricCell* WithLabels(const std::vector<std::string>& values);
  // Whether the series with these label values exists.
  bool Has(const std::vector<std::string>& values) const;
  // Removes the series with exactly these label values, if present.
  void RemoveSeries(const std::vector<std::string>& values);
  // Removes the series whose first label equals `value` (e.g. every series of one job).
  void RemoveWhereFirstLabel(std::string_view value);
  // Makes `rows` (label values, value) the series whose first label is `first`: sets each,
  // creating what is missing, and removes that label's other series. Series that stay keep
  // their cell (a handle taken before stays valid).
  using Row = std::pair<std::vector<std::string>, double>;
  void SetSeriesOf(std::string_view first, const std::vector<Row>& rows);

  const std::string& name() const { return name_; }
  size_t series() const;

  // prometheus::Collectable: this family and its series, in label-value order.
  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  friend class PrometheusRegistry;
  MetricFamily(std::string name, std::string help, bool counter,
               std::vector<std::string> label_names);
  MetricCell* FindOrAddLocked(const std::vector<std::string>& values)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string name_;
  const std::string help_;
  const bool counter_;
  const std::vector<std::string> label_names_;
  mutable std::mutex mu_;
  std::map<std::vector<std::string>, std::unique_ptr<MetricCell>> series_ ABSL_GUARDED_BY(mu_);
};

class PrometheusRegistry {
 public:
  PrometheusRegistry() = default;
  PrometheusRegistry(const PrometheusRegistry&) = delete;
  PrometheusRegistry& operator=(const PrometheusRegistry&) = delete;

  // Registers a family. Names must be unique, valid Prometheus names, and counters end in
  // `_total`; a violation is a programming error and aborts.
  MetricFamily* Counter(const std::string& name, const std::string& help,
                        std::vector<std::string> labels);
  MetricFamily* Gauge(const std::string& name, const std::string& help,
                      std::vector<std::string> labels);

  // Runs `refresh` at the start of every Render, before any family is read: values kept
  // elsewhere (a part's counters) are read at scrape. Scrapes may overlap: `refresh` must be
  // thread-safe, and whatever it reads must outlive the last Render.
  void OnScrape(std::function<void()> refresh);

  // The text exposition of every family, in registration order (prometheus::TextSerializer).
  std::string Render() const;

 private:
  MetricFamily* Add(const std::string& name, const std::string& help, bool counter,
                    std::vector<std::string> labels);

  mutable std::mutex mu_;
  std::vector<std::unique_ptr<MetricFamily>> families_ ABSL_GUARDED_BY(mu_);
  std::vector<std::function<void()>> on_scrape_ ABSL_GUARDED_BY(mu_);
};

}  // namespace rankwatch
