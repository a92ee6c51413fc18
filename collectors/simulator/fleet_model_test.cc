#include "collectors/simulator/fleet_model.h"

#include <gtest/gtest.h>

#include <algorithm>

namespace rankwatch {
namespace {

FleetOptions Options(uint32_t ranks, FleetOptions::Sync sync) {
  FleetOptions o;
  o.ranks = ranks;
  o.sync = sync;
  o.report_collective = true;
  return o;
}

FaultSpec Fault(const std::string& text) {
  auto f = ParseFaultSpec(text);
  EXPECT_TRUE(f.ok()) << f.status();
  return *f;
}

TEST(FaultSpecTest, ParsesEveryForm) {
  FaultSpec f = Fault("slow-compute:5");
  EXPECT_EQ(f.kind, FaultKind::kSlowCompute);
  EXPECT_EQ(f.target.kind, FaultTarget::Kind::kRank);
  EXPECT_EQ(f.target.index, 5u);
  EXPECT_DOUBLE_EQ(f.magnitude, 0.3);
  f = Fault("memory-leak:node2:128:40");
  EXPECT_EQ(f.target.kind, FaultTarget::Kind::kNode);
  EXPECT_EQ(f.target.index, 2u);
  EXPECT_DOUBLE_EQ(f.magnitude, 128);
  EXPECT_EQ(f.from_step, 40u);
  EXPECT_EQ(Fault("hang:all").target.kind, FaultTarget::Kind::kAll);
  f = Fault("slow-host:3");
  EXPECT_EQ(f.kind, FaultKind::kSlowHost);
  EXPECT_EQ(f.target.index, 3u);
  EXPECT_DOUBLE_EQ(f.magnitude, 0.2);
  EXPECT_EQ(FaultKindName(f.kind), "slow-host");
  f = Fault("slow-host:node1:0.5:100-300");
  EXPECT_EQ(f.target.kind, FaultTarget::Kind::kNode);
  EXPECT_DOUBLE_EQ(f.magnitude, 0.5);
  EXPECT_EQ(f.from_step, 100u);
  EXPECT_EQ(f.until_step, 300u);
}

TEST(FaultSpecTest, RejectsBadSpecsWithAMessage) {
  for (const char* bad : {"slow", "nope:1", "slow-compute:x", "slow-compute:1:-1",
                          "slow-compute:1:0.3:abc", "slow-compute:nodeX", "a:b:c:d:e"}) {
    auto f = ParseFaultSpec(bad);
    EXPECT_FALSE(f.ok()) << bad;
    EXPECT_NE(f.status().message().find(bad), std::string::npos) << f.status();
  }
}

TEST(FleetModelTest, IsDeterministicForASeed) {
  FleetModel a(Options(4, FleetOptions::Sync::kNone));
  FleetModel b(Options(4, FleetOptions::Sync::kNone));
  std::vector<v1::StepRecord> ra, rb;
  std::vector<bool> pa, pb;
  for (uint64_t s = 0; s < 5; ++s) {
    a.Step(s, &ra, &pa);
    b.Step(s, &rb, &pb);
    for (int r = 0; r < 4; ++r) EXPECT_EQ(ra[r].SerializeAsString(), rb[r].SerializeAsString());
  }
  FleetOptions other = Options(4, FleetOptions::Sync::kNone);
  other.seed = 2;
  FleetModel c(other);
  c.Step(4, &rb, &pb);
  EXPECT_NE(ra[0].forward_ns(), rb[0].forward_ns());
}

TEST(FleetModelTest, DefaultSharesOfTheStep) {
  FleetOptions o = Options(1, FleetOptions::Sync::kNone);
  o.jitter = 0;
  FleetModel m(o);
  std::vector<v1::StepRecord> rec;
  std::vector<bool> rep;
  m.Step(0, &rec, &rep);
  EXPECT_EQ(rec[0].dataloader_ns(), 5'000'000u);
  EXPECT_EQ(rec[0].forward_ns(), 30'000'000u);
  EXPECT_EQ(rec[0].backward_ns(), 55'000'000u);
  EXPECT_EQ(rec[0].optimizer_ns(), 8'000'000u);
  EXPECT_EQ(rec[0].step_time_ns(), 100'000'000u);
  EXPECT_NEAR(static_cast<double>(rec[0].peak_allocated_bytes()), 40.0 * (1ull << 30),
              0.01 * (1ull << 30));
  EXPECT_EQ(rec[0].device_capacity_bytes(), 80ull << 30);
}

TEST(FleetModelTest, DdpMakesEveryRankWaitForTheSlowOne) {
  FleetOptions o = Options(4, FleetOptions::Sync::kDdp);
  o.jitter = 0;
  o.faults.push_back(Fault("slow-compute:2:0.3"));
  FleetModel m(o);
  std::vector<v1::StepRecord> rec;
  std::vector<bool> rep;
  m.Step(0, &rec, &rep);
  // The slow rank: forward+backward (30 + 55 ms) x1.3 = 110.5 ms, step 125.5 ms.
  EXPECT_EQ(rec[2].step_time_ns(), 125'500'000u);
  for (int r = 0; r < 4; ++r) EXPECT_EQ(rec[r].step_time_ns(), 125'500'000u) << r;
  // Fast ranks absorb 25.5 ms in backward and report it as collective time on top of the
  // 5 ms allreduce; the slow rank only has the allreduce.
  EXPECT_EQ(rec[0].backward_ns(), 80'500'000u);
  EXPECT_EQ(rec[0].collective_ns(), 30'500'000u);
  EXPECT_EQ(rec[2].collective_ns(), 5'000'000u);
  EXPECT_EQ(rec[2].forward_ns(), 39'000'000u);
}

// Derived wait, as the daemon computes it: step time minus the measured phases.
double DerivedWait(const v1::StepRecord& r) {
  return static_cast<double>(r.step_time_ns()) - static_cast<double>(r.dataloader_ns()) -
         static_cast<double>(r.forward_ns()) - static_cast<double>(r.backward_ns()) -
         static_cast<double>(r.optimizer_ns());
}

// A phase's nominal time in a 100 ms step, ns (PhaseShares: dataloader 5 ms, forward 30 ms,
// backward 55 ms, optimizer 8 ms, wait 2 ms at this writing). The slow-host tests below hold
// whatever the split of the step between the phases.
double Nominal(double share) { return 100e6 * share; }
constexpr double kMs = 1e6;
constexpr double kNs = 4;  // phases are truncated to whole nanoseconds

TEST(FleetModelTest, SlowHostUnderDdpIsOutsideThePhasesOfTheSlowRankAndInBackwardOfTheOthers) {
  FleetOptions o = Options(4, FleetOptions::Sync::kDdp);
  o.jitter = 0;
  o.faults.push_back(Fault("slow-host:2:0.2"));
  FleetModel m(o);
  std::vector<v1::StepRecord> rec;
  std::vector<bool> rep;
  m.Step(0, &rec, &rep);
  // The slow rank: 100 ms of its own plus 20 ms of host code = 120 ms; every rank leaves the
  // step with it.
  for (int r = 0; r < 4; ++r) EXPECT_NEAR(rec[r].step_time_ns(), 120 * kMs, kNs) << r;
  // Its phases are the nominal ones: the 20 ms are in no phase, only in its step time, so its
  // derived wait is the nominal 2 ms + 20 ms; and it waits for nobody (allreduce only, 5 ms).
  EXPECT_NEAR(rec[2].dataloader_ns(), Nominal(PhaseShares::kDataloader), kNs);
  EXPECT_NEAR(rec[2].forward_ns(), Nominal(PhaseShares::kForward), kNs);
  EXPECT_NEAR(rec[2].backward_ns(), Nominal(PhaseShares::kBackward), kNs);
  EXPECT_NEAR(rec[2].optimizer_ns(), Nominal(PhaseShares::kOptimizer), kNs);
  EXPECT_NEAR(DerivedWait(rec[2]), 22 * kMs, kNs);
  EXPECT_EQ(rec[2].collective_ns(), 5'000'000u);
  // The others wait for it inside backward: backward nominal + 20 ms (55 + 20 = 75 ms),
  // collective 5 + 20 = 25 ms, and their derived wait stays the nominal 2 ms.
  for (int r : {0, 1, 3}) {
    EXPECT_NEAR(rec[r].forward_ns(), Nominal(PhaseShares::kForward), kNs) << r;
    EXPECT_NEAR(rec[r].backward_ns(), Nominal(PhaseShares::kBackward) + 20 * kMs, kNs) << r;
    EXPECT_NEAR(rec[r].collective_ns(), 25 * kMs, kNs) << r;
    EXPECT_NEAR(DerivedWait(rec[r]), 2 * kMs, kNs) << r;
  }
}

TEST(FleetModelTest, SlowHostWithoutCollectiveTimesReportsNoCollective) {
  FleetOptions o = Options(4, FleetOptions::Sync::kDdp);
  o.jitter = 0;
  o.report_collective = false;
  o.faults.push_back(Fault("slow-host:1:0.3"));
  FleetModel m(o);
  std::vector<v1::StepRecord> rec;
  std::vector<bool> rep;
  m.Step(0, &rec, &rep);
  EXPECT_NEAR(rec[1].step_time_ns(), 130 * kMs, kNs);
  EXPECT_NEAR(rec[1].backward_ns(), Nominal(PhaseShares::kBackward), kNs);
  EXPECT_NEAR(DerivedWait(rec[1]), 32 * kMs, kNs);  // 2 + 30 ms
  EXPECT_NEAR(rec[0].step_time_ns(), 130 * kMs, kNs);
  EXPECT_NEAR(rec[0].backward_ns(), Nominal(PhaseShares::kBackward) + 30 * kMs, kNs);
  EXPECT_FALSE(rec[0].has_collective_ns());
  EXPECT_FALSE(rec[1].has_collective_ns());
}

TEST(FleetModelTest, SlowHostWithoutSyncSlowsOnlyItsRankForItsSteps) {
  FleetOptions o = Options(4, FleetOptions::Sync::kNone);
  o.jitter = 0;
  o.faults.push_back(Fault("slow-host:3:0.2:1-2"));
  FleetModel m(o);
  std::vector<v1::StepRecord> rec;
  std::vector<bool> rep;
  m.Step(0, &rec, &rep);
  EXPECT_NEAR(rec[3].step_time_ns(), 100 * kMs, kNs);  // before FROM
  m.Step(1, &rec, &rep);
  EXPECT_NEAR(rec[3].step_time_ns(), 120 * kMs, kNs);
  EXPECT_NEAR(rec[3].backward_ns(), Nominal(PhaseShares::kBackward), kNs);
  EXPECT_NEAR(DerivedWait(rec[3]), 22 * kMs, kNs);
  EXPECT_NEAR(rec[0].step_time_ns(), 100 * kMs, kNs);  // nobody waits for it
  EXPECT_NEAR(rec[0].backward_ns(), Nominal(PhaseShares::kBackward), kNs);
  m.Step(2, &rec, &rep);
  EXPECT_NEAR(rec[3].step_time_ns(), 100 * kMs, kNs);  // UNTIL is exclusive
}

TEST(FleetModelTest, UnderDdpTheSlowestRankSetsTheStepWhateverItsCause) {
  // Rank 1: +20 ms of host code (120 ms); rank 2: forward + backward x 1.3, 100 ms + 0.3 x
  // (forward + backward) = 125.5 ms at the default 30 + 55 ms.
  FleetOptions o = Options(4, FleetOptions::Sync::kDdp);
  o.jitter = 0;
  o.faults.push_back(Fault("slow-host:1:0.2"));
  o.faults.push_back(Fault("slow-compute:2:0.3"));
  FleetModel m(o);
  std::vector<v1::StepRecord> rec;
  std::vector<bool> rep;
  m.Step(0, &rec, &rep);
  const double slowest =
      100 * kMs + 0.3 * (Nominal(PhaseShares::kForward) + Nominal(PhaseShares::kBackward));
  ASSERT_GT(slowest, 120 * kMs);
  for (int r = 0; r < 4; ++r) EXPECT_NEAR(rec[r].step_time_ns(), slowest, kNs) << r;
  // Rank 1 waits (slowest - 120 ms, 5.5 ms) for rank 2 in backward; its 20 ms of host code stay
  // outside every phase.
  EXPECT_NEAR(rec[1].backward_ns(), Nominal(PhaseShares::kBackward) + slowest - 120 * kMs, kNs);
  EXPECT_NEAR(rec[1].collective_ns(), 5 * kMs + slowest - 120 * kMs, kNs);
  EXPECT_NEAR(DerivedWait(rec[1]), 22 * kMs, kNs);
  EXPECT_NEAR(rec[0].backward_ns(), Nominal(PhaseShares::kBackward) + slowest - 100 * kMs, kNs);
  EXPECT_EQ(rec[2].collective_ns(), 5'000'000u);
}

TEST(FleetModelTest, FaultsApplyToTheirTargetFromTheirStep) {
  FleetOptions o = Options(16, FleetOptions::Sync::kNone);
  o.jitter = 0;
  o.faults.push_back(Fault("slow-input:node1:1.0:3"));
  o.faults.push_back(Fault("memory-leak:0:100:2"));
  FleetModel m(o);
  std::vector<v1::StepRecord> rec;
  std::vector<bool> rep;
  m.Step(2, &rec, &rep);
  EXPECT_EQ(rec[8].dataloader_ns(), 5'000'000u);
  const uint64_t base = rec[1].peak_allocated_bytes();
  EXPECT_EQ(rec[0].peak_allocated_bytes() - base, 100ull << 20);
  m.Step(3, &rec, &rep);
  EXPECT_EQ(rec[8].dataloader_ns(), 10'000'000u);  // rank 8 is on node 1
  EXPECT_EQ(rec[15].dataloader_ns(), 10'000'000u);
  EXPECT_EQ(rec[7].dataloader_ns(), 5'000'000u);  // node 0 untouched
}

TEST(FleetModelTest, HangStopsOneRankOrUnderDdpTheWholeJob) {
  FleetOptions none = Options(4, FleetOptions::Sync::kNone);
  none.faults.push_back(Fault("hang:1:0:5"));
  FleetModel m(none);
  std::vector<v1::StepRecord> rec;
  std::vector<bool> rep;
  m.Step(4, &rec, &rep);
  EXPECT_EQ(std::count(rep.begin(), rep.end(), true), 4);
  m.Step(5, &rec, &rep);
  EXPECT_FALSE(rep[1]);
  EXPECT_EQ(std::count(rep.begin(), rep.end(), true), 3);

  FleetOptions ddp = Options(4, FleetOptions::Sync::kDdp);
  ddp.faults.push_back(Fault("hang:1:0:5"));
  FleetModel d(ddp);
  d.Step(5, &rec, &rep);
  EXPECT_EQ(std::count(rep.begin(), rep.end(), true), 0);
}

}  // namespace
}  // namespace rankwatch
