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
