#include "metrics/prometheus_registry.h"

#include <gtest/gtest.h>

#include <cmath>

namespace rankwatch {
namespace {

TEST(PrometheusRegistryTest, RendersFamiliesInPrometheusTextFormat) {
  PrometheusRegistry r;
  MetricFamily* c = r.Counter("rankwatch_x_total", "Things.", {"kind"});
  c->WithLabels({"b"})->Add(2);
  c->WithLabels({"a"})->Add(1.5);
  r.Gauge("rankwatch_up", "Up.", {})->WithLabels({})->Set(1);
  const std::string text = r.Render();
  EXPECT_NE(text.find("# HELP rankwatch_x_total Things.\n# TYPE rankwatch_x_total counter\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("rankwatch_x_total{kind=\"a\"} 1.5\n"), std::string::npos) << text;
  EXPECT_NE(text.find("rankwatch_x_total{kind=\"b\"} 2\n"), std::string::npos) << text;
  EXPECT_NE(text.find("# HELP rankwatch_up Up.\n# TYPE rankwatch_up gauge\nrankwatch_up 1\n"),
            std::string::npos)
      << text;
}

TEST(PrometheusRegistryTest, EscapesLabelValuesAndWritesSpecialValues) {
  PrometheusRegistry r;
  MetricFamily* g = r.Gauge("rankwatch_g", "G.", {"training_job"});
  g->WithLabels({"a\"b\\c\nd"})->Set(NAN);
  g->WithLabels({"inf"})->Set(INFINITY);
  g->WithLabels({"big"})->Set(123456789);
  const std::string text = r.Render();
  EXPECT_NE(text.find("rankwatch_g{training_job=\"a\\\"b\\\\c\\nd\"} Nan\n"), std::string::npos)
      << text;
  EXPECT_NE(text.find("rankwatch_g{training_job=\"inf\"} +Inf\n"), std::string::npos) << text;
  EXPECT_NE(text.find("rankwatch_g{training_job=\"big\"} 123456789\n"), std::string::npos) << text;
}

TEST(PrometheusRegistryTest, LabelValuesAreGivenByPosition) {
  PrometheusRegistry r;
  MetricFamily* g = r.Gauge("rankwatch_g", "G.", {"training_job", "phase"});
  MetricCell* cell = g->WithLabels({"j", "forward"});
  cell->Set(0.25);
  EXPECT_EQ(g->WithLabels({"j", "forward"}), cell) << "the same series, the same handle";
  // Labels appear in the family's order.
  EXPECT_NE(r.Render().find("rankwatch_g{training_job=\"j\",phase=\"forward\"} 0.25\n"),
            std::string::npos)
      << r.Render();
}

TEST(PrometheusRegistryTest, CountersNeverGoDown) {
  PrometheusRegistry r;
  MetricCell* c = r.Counter("rankwatch_c_total", "C.", {})->WithLabels({});
  c->Set(5);
  EXPECT_EQ(c->Get(), 5);
  c->Set(3);
  EXPECT_EQ(c->Get(), 5);
  c->Add(-1);
  EXPECT_EQ(c->Get(), 5);
  c->Add(2);
  EXPECT_EQ(c->Get(), 7);
  MetricCell* g = r.Gauge("rankwatch_g", "G.", {})->WithLabels({});
  g->Set(5);
  g->Add(-2);
  EXPECT_EQ(g->Get(), 3);
}

TEST(PrometheusRegistryTest, RemovesTheSeriesOfOneJob) {
  PrometheusRegistry r;
  MetricFamily* g = r.Gauge("rankwatch_g", "G.", {"training_job", "phase"});
  g->WithLabels({"a", "x"})->Set(1);
  g->WithLabels({"a", "y"})->Set(1);
  g->WithLabels({"ab", "x"})->Set(3);
  g->WithLabels({"b", "x"})->Set(2);
  g->RemoveWhereFirstLabel("a");
  EXPECT_EQ(g->series(), 2u);
  const std::string text = r.Render();
  EXPECT_EQ(text.find("training_job=\"a\""), std::string::npos) << text;
  EXPECT_NE(text.find("rankwatch_g{training_job=\"ab\",phase=\"x\"} 3\n"), std::string::npos);
  EXPECT_NE(text.find("rankwatch_g{training_job=\"b\",phase=\"x\"} 2\n"), std::string::npos);
  g->RemoveSeries({"b", "x"});
  g->RemoveSeries({"nope", "x"});
  EXPECT_EQ(r.Render().find("training_job=\"b\""), std::string::npos);
  // A removed series comes back at 0.
  EXPECT_EQ(g->WithLabels({"b", "x"})->Get(), 0);
}

TEST(PrometheusRegistryTest, SetSeriesOfKeepsWhatStaysAndRemovesTheRest) {
  PrometheusRegistry r;
  MetricFamily* g = r.Gauge("rankwatch_g", "G.", {"training_job", "rank"});
  g->SetSeriesOf("a", {{{"a", "1"}, 1}, {{"a", "2"}, 2}});
  g->WithLabels({"b", "1"})->Set(5);
  MetricCell* kept = g->WithLabels({"a", "2"});
  g->SetSeriesOf("a", {{{"a", "2"}, 20}, {{"a", "3"}, 30}});
  EXPECT_EQ(g->WithLabels({"a", "2"}), kept) << "a series that stays is the same series";
  EXPECT_EQ(kept->Get(), 20);
  EXPECT_FALSE(g->Has({"a", "1"}));
  EXPECT_TRUE(g->Has({"a", "3"}));
  EXPECT_TRUE(g->Has({"b", "1"})) << "another job's series are untouched";
  g->SetSeriesOf("a", {});
  EXPECT_EQ(g->series(), 1u);
  EXPECT_EQ(r.Render().find("training_job=\"a\""), std::string::npos);
}

TEST(PrometheusRegistryDeathTest, CountersMustEndInTotal) {
  PrometheusRegistry r;
  EXPECT_DEATH(r.Counter("rankwatch_bad", "x", {}), "invalid metric name");
}

TEST(PrometheusRegistryDeathTest, NamesAreUnique) {
  PrometheusRegistry r;
  r.Gauge("rankwatch_g", "G.", {});
  EXPECT_DEATH(r.Gauge("rankwatch_g", "again", {}), "rankwatch_g");
}

TEST(PrometheusRegistryDeathTest, LabelNamesAreChecked) {
  PrometheusRegistry r;
  EXPECT_DEATH(r.Gauge("rankwatch_g", "G.", {"bad-label"}), "invalid metric name");
}

}  // namespace
}  // namespace rankwatch
