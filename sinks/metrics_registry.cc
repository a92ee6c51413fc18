#include "sinks/metrics_registry.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <regex>

#include <fmt/format.h>

namespace rankwatch {

void MetricCell::Add(double delta) {
  double current = value_.load(std::memory_order_relaxed);
  while (!value_.compare_exchange_weak(current, current + delta, std::memory_order_relaxed)) {
  }
}

std::string FormatMetricValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (v == std::floor(v) && std::fabs(v) < 1e15) return fmt::format("{}", static_cast<int64_t>(v));
  return fmt::format("{}", v);  // shortest round-trip representation
}

std::string EscapeLabelValue(std::string_view v) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    switch (c) {
      case '\\': out += "\\\\"; break;
      case '"': out += "\\\""; break;
      case '\n': out += "\\n"; break;
      default: out += c;
    }
  }
  return out;
}

MetricFamily::MetricFamily(std::string name, std::string help, Type type,
                           std::vector<std::string> label_names)
    : name_(std::move(name)),
      help_(std::move(help)),
      type_(type),
      label_names_(std::move(label_names)) {}

MetricCell* MetricFamily::WithLabels(const std::vector<std::string>& values) {
  if (values.size() != label_names_.size()) {
    std::fprintf(stderr, "metric %s: %zu label values for %zu labels\n", name_.c_str(),
                 values.size(), label_names_.size());
    std::abort();
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto& cell = series_[values];
  if (!cell) cell = std::make_unique<MetricCell>();
  return cell.get();
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

void MetricFamily::Render(std::string* out) const {
  out->append("# HELP ").append(name_).append(" ").append(help_).append("\n");
  out->append("# TYPE ").append(name_).append(type_ == Type::kCounter ? " counter\n" : " gauge\n");
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [values, cell] : series_) {
    out->append(name_);
    if (!values.empty()) {
      out->push_back('{');
      for (size_t i = 0; i < values.size(); ++i) {
        if (i > 0) out->push_back(',');
        out->append(label_names_[i]).append("=\"").append(EscapeLabelValue(values[i])).append("\"");
      }
      out->push_back('}');
    }
    out->push_back(' ');
    out->append(FormatMetricValue(cell->Get()));
    out->push_back('\n');
  }
}

MetricFamily* MetricsRegistry::Counter(std::string name, std::string help,
                                       std::vector<std::string> labels) {
  return Add(std::move(name), std::move(help), MetricFamily::Type::kCounter, std::move(labels));
}

MetricFamily* MetricsRegistry::Gauge(std::string name, std::string help,
                                     std::vector<std::string> labels) {
  return Add(std::move(name), std::move(help), MetricFamily::Type::kGauge, std::move(labels));
}

MetricFamily* MetricsRegistry::Add(std::string name, std::string help, MetricFamily::Type type,
                                   std::vector<std::string> labels) {
  static const std::regex kName("[a-zA-Z_:][a-zA-Z0-9_:]*");
  if (!std::regex_match(name, kName) ||
      (type == MetricFamily::Type::kCounter && !name.ends_with("_total"))) {
    std::fprintf(stderr, "invalid metric name %s\n", name.c_str());
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
      std::make_unique<MetricFamily>(std::move(name), std::move(help), type, std::move(labels)));
  return families_.back().get();
}

std::string MetricsRegistry::Render() const {
  std::string out;
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& f : families_) f->Render(&out);
  return out;
}

}  // namespace rankwatch
