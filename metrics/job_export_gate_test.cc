#include "metrics/job_export_gate.h"

#include <gtest/gtest.h>

namespace rankwatch {
namespace {

using State = JobExportGate::State;

TEST(JobExportGateTest, IdsAreCandidatesUntilTheyShowTheyAreJobsThenStayJobs) {
  JobExportGate gate({.min_steps = 5, .max_exported = 10});
  EXPECT_EQ(gate.Evaluate("junk", false), State::kCandidate);
  EXPECT_EQ(gate.Evaluate("junk", false), State::kCandidate);
  EXPECT_FALSE(gate.IsJob("junk"));
  EXPECT_FALSE(gate.IsJob("never-seen"));
  EXPECT_EQ(gate.Evaluate("real", false), State::kCandidate);
  EXPECT_EQ(gate.Evaluate("real", true), State::kExported);
  EXPECT_EQ(gate.Evaluate("real", false), State::kExported) << "sticky";
  EXPECT_TRUE(gate.IsJob("real"));
  EXPECT_TRUE(gate.Exported("real"));
  const JobExportGate::Counts c = gate.counts();
  EXPECT_EQ(c.candidates, 1u);
  EXPECT_EQ(c.exported, 1u);
  EXPECT_EQ(c.over_limit, 0u);
  EXPECT_FALSE(gate.Remove("junk")) << "a candidate had no series";
  EXPECT_TRUE(gate.Remove("real"));
  EXPECT_FALSE(gate.Remove("real"));
  EXPECT_EQ(gate.counts().candidates + gate.counts().exported, 0u);
}

TEST(JobExportGateTest, TheFirstJobsAreExportedAndTheNextWaitingTakesAFreedPlace) {
  JobExportGate gate({.min_steps = 5, .max_exported = 2});
  PrometheusRegistry registry;
  MetricFamily* f = registry.Gauge("ids", "Ids.", {"state"});
  MetricCell* shown[3] = {f->WithLabels({"c"}), f->WithLabels({"e"}), f->WithLabels({"o"})};
  gate.ShowCountsIn(shown[0], shown[1], shown[2]);
  // "c" was seen first but becomes a job last: the order is that of becoming jobs.
  EXPECT_EQ(gate.Evaluate("c", false), State::kCandidate);
  EXPECT_EQ(gate.Evaluate("a", true), State::kExported);
  EXPECT_EQ(gate.Evaluate("b", true), State::kExported);
  EXPECT_EQ(gate.Evaluate("d", true), State::kOverLimit);
  EXPECT_EQ(gate.Evaluate("c", true), State::kOverLimit);
  EXPECT_TRUE(gate.IsJob("d"));
  EXPECT_FALSE(gate.Exported("d"));
  EXPECT_EQ(shown[0]->Get(), 0);
  EXPECT_EQ(shown[1]->Get(), 2);
  EXPECT_EQ(shown[2]->Get(), 2);
  // A later flood of jobs does not displace the exported ones.
  for (int i = 0; i < 100; ++i) gate.Evaluate("flood-" + std::to_string(i), true);
  EXPECT_TRUE(gate.Exported("a"));
  EXPECT_EQ(shown[2]->Get(), 102);
  // "a" goes: "d", the first to become a job among those waiting, takes its place.
  EXPECT_TRUE(gate.Remove("a"));
  EXPECT_TRUE(gate.Exported("d"));
  EXPECT_FALSE(gate.Exported("c"));
  EXPECT_EQ(gate.Evaluate("d", true), State::kExported);
  // A waiting job that goes frees nothing.
  EXPECT_FALSE(gate.Remove("c"));
  EXPECT_TRUE(gate.Remove("b"));
  EXPECT_TRUE(gate.Exported("flood-0"));
  EXPECT_EQ(shown[1]->Get(), 2);
  EXPECT_EQ(shown[2]->Get(), 99);
}

TEST(JobExportGateTest, ABoundOfZeroExportsNoJob) {
  JobExportGate gate({.min_steps = 1, .max_exported = 0});
  EXPECT_EQ(gate.Evaluate("a", true), State::kOverLimit);
  EXPECT_FALSE(gate.Remove("a"));
}

}  // namespace
}  // namespace rankwatch
