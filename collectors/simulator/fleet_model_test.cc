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
  EXPECT_EQ(rec[0].dataloader_ns(), 10'000'000u);
  EXPECT_EQ(rec[0].forward_ns(), 30'000'000u);
  EXPECT_EQ(rec[0].backward_ns(), 50'000'000u);
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
  // The slow rank: forward+backward x1.3 = 104 ms, step 124 ms.
  EXPECT_EQ(rec[2].step_time_ns(), 124'000'000u);
  for (int r = 0; r < 4; ++r) EXPECT_EQ(rec[r].step_time_ns(), 124'000'000u) << r;
  // Fast ranks absorb 24 ms in backward and report it as collective time on top of the
  // 5 ms allreduce; the slow rank only has the allreduce.
  EXPECT_EQ(rec[0].backward_ns(), 74'000'000u);
  EXPECT_EQ(rec[0].collective_ns(), 29'000'000u);
  EXPECT_EQ(rec[2].collective_ns(), 5'000'000u);
  EXPECT_EQ(rec[2].forward_ns(), 39'000'000u);
}

// Derived wait, as the daemon computes it: step time minus the measured phases.
uint64_t DerivedWait(const v1::StepRecord& r) {
  return r.step_time_ns() - r.dataloader_ns() - r.forward_ns() - r.backward_ns() - r.optimizer_ns();
}

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
  for (int r = 0; r < 4; ++r) EXPECT_EQ(rec[r].step_time_ns(), 120'000'000u) << r;
  // Its phases are the nominal ones: the 20 ms are in no phase, only in its step time, so its
  // derived wait is 2 ms nominal + 20 ms; and it waits for nobody (allreduce only).
  EXPECT_EQ(rec[2].dataloader_ns(), 10'000'000u);
  EXPECT_EQ(rec[2].forward_ns(), 30'000'000u);
  EXPECT_EQ(rec[2].backward_ns(), 50'000'000u);
  EXPECT_EQ(rec[2].optimizer_ns(), 8'000'000u);
  EXPECT_EQ(DerivedWait(rec[2]), 22'000'000u);
  EXPECT_EQ(rec[2].collective_ns(), 5'000'000u);
  // The others wait for it inside backward: backward 50 + 20 ms, collective 5 + 20 ms, and
  // their derived wait stays the nominal 2 ms.
  for (int r : {0, 1, 3}) {
    EXPECT_EQ(rec[r].forward_ns(), 30'000'000u) << r;
    EXPECT_EQ(rec[r].backward_ns(), 70'000'000u) << r;
    EXPECT_EQ(rec[r].collective_ns(), 25'000'000u) << r;
    EXPECT_EQ(DerivedWait(rec[r]), 2'000'000u) << r;
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
  EXPECT_EQ(rec[1].step_time_ns(), 130'000'000u);
  EXPECT_EQ(rec[1].backward_ns(), 50'000'000u);
  EXPECT_EQ(DerivedWait(rec[1]), 32'000'000u);
  EXPECT_EQ(rec[0].step_time_ns(), 130'000'000u);
  EXPECT_EQ(rec[0].backward_ns(), 80'000'000u);
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
  EXPECT_EQ(rec[3].step_time_ns(), 100'000'000u);  // before FROM
  m.Step(1, &rec, &rep);
  EXPECT_EQ(rec[3].step_time_ns(), 120'000'000u);
  EXPECT_EQ(rec[3].backward_ns(), 50'000'000u);
  EXPECT_EQ(DerivedWait(rec[3]), 22'000'000u);
  EXPECT_EQ(rec[0].step_time_ns(), 100'000'000u);  // nobody waits for it
  EXPECT_EQ(rec[0].backward_ns(), 50'000'000u);
  m.Step(2, &rec, &rep);
  EXPECT_EQ(rec[3].step_time_ns(), 100'000'000u);  // UNTIL is exclusive
}

TEST(FleetModelTest, UnderDdpTheSlowestRankSetsTheStepWhateverItsCause) {
  // Rank 1: +20 ms of host code (120 ms); rank 2: forward+backward x1.3 (124 ms).
  FleetOptions o = Options(4, FleetOptions::Sync::kDdp);
  o.jitter = 0;
  o.faults.push_back(Fault("slow-host:1:0.2"));
  o.faults.push_back(Fault("slow-compute:2:0.3"));
  FleetModel m(o);
  std::vector<v1::StepRecord> rec;
  std::vector<bool> rep;
  m.Step(0, &rec, &rep);
  for (int r = 0; r < 4; ++r) EXPECT_EQ(rec[r].step_time_ns(), 124'000'000u) << r;
  // Rank 1 waits 4 ms for rank 2, in backward; its 20 ms of host code stay outside.
  EXPECT_EQ(rec[1].backward_ns(), 54'000'000u);
  EXPECT_EQ(rec[1].collective_ns(), 9'000'000u);
  EXPECT_EQ(DerivedWait(rec[1]), 22'000'000u);
  EXPECT_EQ(rec[0].backward_ns(), 74'000'000u);
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
  EXPECT_EQ(rec[8].dataloader_ns(), 10'000'000u);
  const uint64_t base = rec[1].peak_allocated_bytes();
  EXPECT_EQ(rec[0].peak_allocated_bytes() - base, 100ull << 20);
  m.Step(3, &rec, &rep);
  EXPECT_EQ(rec[8].dataloader_ns(), 20'000'000u);  // rank 8 is on node 1
  EXPECT_EQ(rec[15].dataloader_ns(), 20'000'000u);
  EXPECT_EQ(rec[7].dataloader_ns(), 10'000'000u);  // node 0 untouched
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
