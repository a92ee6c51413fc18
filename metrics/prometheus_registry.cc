#include "metrics/prometheus_registry.h"

#include <prometheus/check_names.h>
#include <prometheus/client_metric.h>
#include <prometheus/metric_family.h>
#include <prometheus/text_serializer.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <sstream>

namespace rankwatch {

void MetricCell::Set(double v) {
  if (!counter_) {
    value_.store(v, std::memory_order_relaxed);
    return;
  }
  double current = value_.load(std::memory_order_relaxed);
  while (v > current && !value_.compare_exchange_weak(current, v, std::memory_order_relaxed)) {
  }
}

void MetricCell::Add(double delta) {
  if (counter_ && !(delta > 0)) return;
  double current = value_.load(std::memory_order_relaxed);
  while (!value_.compare_exchange_weak(current, current + delta, std::memory_order_relaxed)) {
  }
}

MetricFamily::MetricFamily(std::string name, std::string help, bool counter,
                           std::vector<std::string> label_names)
    : name_(std::move(name)),
      help_(std::move(help)),
      counter_(counter),
      label_names_(std::move(label_names)) {}

MetricCell* MetricFamily::WithLabels(const std::vector<std::string>& values) {
  if (values.size() != label_names_.size()) {
    std::fprintf(stderr, "metric %s: %zu label values for %zu labels\n", name_.c_str(),
                 values.size(), label_names_.size());
    std::abort();
  }
  std::lock_guard<std::mutex> lock(mu_);
  return FindOrAddLocked(values);
}

MetricCell* MetricFamily::FindOrAddLocked(const std::vector<std::string>& values) {
  auto& cell = series_[values];
  if (!cell) cell.reset(new MetricCell(counter_));
  return cell.get();
}

bool MetricFamily::Has(const std::vector<std::string>& values) const {
  std::lock_guard<std::mutex> lock(mu_);
  return series_.count(values) != 0;
}

void MetricFamily::RemoveSeries(const std::vector<std::string>& values) {
  std::lock_guard<std::mutex> lock(mu_);
  series_.erase(values);
}

void MetricFamily::RemoveWhereFirstLabel(std::string_view value) {
  std::lock_guard<std::mutex> lock(mu_);
  // Series are ordered by their label values: those whose first value is `value` are one run,
  // starting at the first key not less than {value}. O(log n + removed), not a scan: removing
  // one job of 10,000 must not touch the others' series.
  auto it = series_.lower_bound(std::vector<std::string>{std::string(value)});
  while (it != series_.end() && !it->first.empty() && it->first[0] == value) it = series_.erase(it);
}

void MetricFamily::SetSeriesOf(std::string_view first, const std::vector<Row>& rows) {
  for (const Row& row : rows) {
    if (row.first.size() != label_names_.size() || row.first.empty() || row.first[0] != first) {
      std::fprintf(stderr, "metric %s: a row of SetSeriesOf(%.*s) has other labels\n",
                   name_.c_str(), static_cast<int>(first.size()), first.data());
      std::abort();
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto it = series_.lower_bound(std::vector<std::string>{std::string(first)});
  while (it != series_.end() && !it->first.empty() && it->first[0] == first) {
    const bool kept = std::any_of(rows.begin(), rows.end(),
                                  [&](const Row& row) { return row.first == it->first; });
    it = kept ? std::next(it) : series_.erase(it);
  }
  for (const Row& row : rows) FindOrAddLocked(row.first)->Set(row.second);
}

size_t MetricFamily::series() const {
  std::lock_guard<std::mutex> lock(mu_);
  return series_.size();
}

std::vector<prometheus::MetricFamily> MetricFamily::Collect() const {
  std::vector<prometheus::MetricFamily> out(1);
  prometheus::MetricFamily& f = out.front();
  f.name = name_;
  f.help = help_;
  f.type = counter_ ? prometheus::MetricType::Counter : prometheus::MetricType::Gauge;
  std::lock_guard<std::mutex> lock(mu_);
  f.metric.reserve(series_.size());
  for (const auto& [values, cell] : series_) {
    prometheus::ClientMetric& m = f.metric.emplace_back();
    m.label.reserve(values.size());
    for (size_t i = 0; i < values.size(); ++i) m.label.push_back({label_names_[i], values[i]});
    if (counter_) {
      m.counter.value = cell->Get();
    } else {
      m.gauge.value = cell->Get();
    }
  }
  return out;
}

MetricFamily* PrometheusRegistry::Counter(const std::string& name, const std::string& help,
                                          std::vector<std::string> labels) {
  return Add(name, help, /*counter=*/true, std::move(labels));
}

MetricFamily* PrometheusRegistry::Gauge(const std::string& name, const std::string& help,
                                        std::vector<std::string> labels) {
  return Add(name, help, /*counter=*/false, std::move(labels));
}

MetricFamily* PrometheusRegistry::Add(const std::string& name, const std::string& help,
                                      bool counter, std::vector<std::string> labels) {
  bool ok = prometheus::CheckMetricName(name) && (!counter || name.ends_with("_total"));
  for (const std::string& label : labels) ok = ok && prometheus::CheckLabelName(label);
  if (!ok) {
    std::fprintf(stderr, "invalid metric name %s (or one of its labels)\n", name.c_str());
    std::abort();
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& f : families_) {
    if (f->name() == name) {
      std::fprintf(stderr, "metric %s registered twice\n", name.c_str());
      std::abort();
    }
  }
  families_.push_back(
      std::unique_ptr<MetricFamily>(new MetricFamily(name, help, counter, std::move(labels))));
  return families_.back().get();
}

void PrometheusRegistry::OnScrape(std::function<void()> refresh) {
  std::lock_guard<std::mutex> lock(mu_);
  on_scrape_.push_back(std::move(refresh));
}

std::string PrometheusRegistry::Render() const {
  std::vector<const MetricFamily*> families;
  std::vector<std::function<void()>> refresh;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& f : families_) families.push_back(f.get());  // never removed
    refresh = on_scrape_;
  }
  for (const auto& r : refresh) r();
  // One family at a time: the library's data model (a ClientMetric of ~200 bytes a series) is
  // built for one family, written and freed before the next, so a scrape of 10,000 jobs holds
  // one family's copy, not the whole registry's.
  const prometheus::TextSerializer serializer;
  std::ostringstream out;
  for (const MetricFamily* f : families) serializer.Serialize(out, f->Collect());
  return std::move(out).str();
}

}  // namespace rankwatch
