#include "sinks/metrics_registry.h"

#include <gtest/gtest.h>

#include <cmath>

namespace rankwatch {
namespace {

TEST(MetricsRegistryTest, RendersFamiliesInPrometheusTextFormat) {
  MetricsRegistry r;
  MetricFamily* c = r.Counter("rankwatch_x_total", "Things.", {"kind"});
  c->WithLabels({"b"})->Add(2);
  c->WithLabels({"a"})->Add(1.5);
  r.Gauge("rankwatch_up", "Up.", {})->WithLabels({})->Set(1);
  EXPECT_EQ(r.Render(),
            "# HELP rankwatch_x_total Things.\n"
            "# TYPE rankwatch_x_total counter\n"
            "rankwatch_x_total{kind=\"a\"} 1.5\n"
            "rankwatch_x_total{kind=\"b\"} 2\n"
            "# HELP rankwatch_up Up.\n"
            "# TYPE rankwatch_up gauge\n"
            "rankwatch_up 1\n");
}

TEST(MetricsRegistryTest, EscapesLabelValues) {
  EXPECT_EQ(EscapeLabelValue("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
}

TEST(MetricsRegistryTest, FormatsSpecialValues) {
  EXPECT_EQ(FormatMetricValue(NAN), "NaN");
  EXPECT_EQ(FormatMetricValue(INFINITY), "+Inf");
  EXPECT_EQ(FormatMetricValue(42), "42");
  EXPECT_EQ(FormatMetricValue(0.125), "0.125");
}

TEST(MetricsRegistryTest, RemovesTheSeriesOfOneJob) {
  MetricsRegistry r;
  MetricFamily* g = r.Gauge("rankwatch_g", "G.", {"training_job", "phase"});
  g->WithLabels({"a", "x"})->Set(1);
  g->WithLabels({"b", "x"})->Set(2);
  g->RemoveWhereFirstLabel("a");
  EXPECT_EQ(r.Render(),
            "# HELP rankwatch_g G.\n# TYPE rankwatch_g gauge\n"
            "rankwatch_g{training_job=\"b\",phase=\"x\"} 2\n");
}

TEST(MetricsRegistryDeathTest, CountersMustEndInTotal) {
  MetricsRegistry r;
  EXPECT_DEATH(r.Counter("rankwatch_bad", "x", {}), "invalid metric name");
}

}  // namespace
}  // namespace rankwatch
