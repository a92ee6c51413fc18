#include "sinks/prometheus_registry.h"

#include <prometheus/check_names.h>
#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <sstream>

namespace rankwatch {

void MetricCell::Set(double v) {
  if (gauge_ != nullptr) {
    gauge_->Set(v);
    return;
  }
  const double delta = v - counter_->Value();
  if (delta > 0) counter_->Increment(delta);
}

void MetricCell::Add(double delta) {
  if (gauge_ != nullptr) {
    gauge_->Increment(delta);
  } else {
    counter_->Increment(delta);
  }
}

double MetricCell::Get() const { return gauge_ != nullptr ? gauge_->Value() : counter_->Value(); }

MetricFamily::MetricFamily(std::string name, std::vector<std::string> label_names,
                           prometheus::Family<prometheus::Gauge>* gauges,
                           prometheus::Family<prometheus::Counter>* counters)
    : name_(std::move(name)),
      label_names_(std::move(label_names)),
      gauges_(gauges),
      counters_(counters) {}

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
  if (!cell) {
    prometheus::Labels labels;
    for (size_t i = 0; i < values.size(); ++i) labels.emplace(label_names_[i], values[i]);
    cell = std::make_unique<MetricCell>();
    if (gauges_ != nullptr) {
      cell->gauge_ = &gauges_->Add(labels);
    } else {
      cell->counter_ = &counters_->Add(labels);
    }
  }
  return cell.get();
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
    if (kept) {
      ++it;
    } else {
      RemoveLocked(it->second.get());
      it = series_.erase(it);
    }
  }
  for (const Row& row : rows) FindOrAddLocked(row.first)->Set(row.second);
}

void MetricFamily::RemoveLocked(MetricCell* cell) {
  if (cell->gauge_ != nullptr) {
    gauges_->Remove(cell->gauge_);
  } else {
    counters_->Remove(cell->counter_);
  }
}

bool MetricFamily::Has(const std::vector<std::string>& values) const {
  std::lock_guard<std::mutex> lock(mu_);
  return series_.count(values) != 0;
}

void MetricFamily::RemoveSeries(const std::vector<std::string>& values) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = series_.find(values);
  if (it == series_.end()) return;
  RemoveLocked(it->second.get());
  series_.erase(it);
}

void MetricFamily::RemoveWhereFirstLabel(std::string_view value) {
  std::lock_guard<std::mutex> lock(mu_);
  // Series are ordered by their label values: those whose first value is `value` are one run,
  // starting at the first key not less than {value}. O(log n + removed), not a scan: removing
  // one job of 10,000 must not touch the others' series.
  auto it = series_.lower_bound(std::vector<std::string>{std::string(value)});
  while (it != series_.end() && !it->first.empty() && it->first[0] == value) {
    RemoveLocked(it->second.get());
    it = series_.erase(it);
  }
}

size_t MetricFamily::series() const {
  std::lock_guard<std::mutex> lock(mu_);
  return series_.size();
}

PrometheusRegistry::PrometheusRegistry()
    : registry_(
          std::make_unique<prometheus::Registry>(prometheus::Registry::InsertBehavior::Throw)) {}

PrometheusRegistry::~PrometheusRegistry() = default;

void PrometheusRegistry::CheckName(const std::string& name, const std::vector<std::string>& labels,
                                   bool counter) const {
  bool ok = prometheus::CheckMetricName(name) && (!counter || name.ends_with("_total"));
  for (const std::string& label : labels) ok = ok && prometheus::CheckLabelName(label);
  if (!ok) {
    std::fprintf(stderr, "invalid metric name %s (or one of its labels)\n", name.c_str());
    std::abort();
  }
}

namespace {

// Registers a family with the library; a duplicate name is a programming error and aborts.
template <typename T>
prometheus::Family<T>* RegisterFamily(prometheus::detail::Builder<T> builder,
                                      const std::string& name, const std::string& help,
                                      prometheus::Registry* registry) {
  try {
    return &builder.Name(name).Help(help).Register(*registry);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "metric %s: %s\n", name.c_str(), e.what());
    std::abort();
  }
}

}  // namespace

MetricFamily* PrometheusRegistry::Counter(const std::string& name, const std::string& help,
                                          std::vector<std::string> labels) {
  CheckName(name, labels, /*counter=*/true);
  std::lock_guard<std::mutex> lock(mu_);
  auto* family = RegisterFamily(prometheus::BuildCounter(), name, help, registry_.get());
  families_.push_back(
      std::unique_ptr<MetricFamily>(new MetricFamily(name, std::move(labels), nullptr, family)));
  return families_.back().get();
}

MetricFamily* PrometheusRegistry::Gauge(const std::string& name, const std::string& help,
                                        std::vector<std::string> labels) {
  CheckName(name, labels, /*counter=*/false);
  std::lock_guard<std::mutex> lock(mu_);
  auto* family = RegisterFamily(prometheus::BuildGauge(), name, help, registry_.get());
  families_.push_back(
      std::unique_ptr<MetricFamily>(new MetricFamily(name, std::move(labels), family, nullptr)));
  return families_.back().get();
}

std::string PrometheusRegistry::Render() const {
  std::ostringstream out;
  prometheus::TextSerializer().Serialize(out, registry_->Collect());
  return std::move(out).str();
}

}  // namespace rankwatch
