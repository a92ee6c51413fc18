// Device time (issue #48; collectors/lib/collector.h, "Device time"): a step marked
// ExpectDeviceTimes is held until SetDeviceTimes hands over its device times, and its record
// carries them (clock, host_phases, ops' host times); held steps go in step order; past
// device_hold_ms or device_hold_steps, and at Close, with host times marked missing; a step
// never marked is sent as before. Also the C API's device functions and indexed ops.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "collectors/lib/collector.h"
#include "collectors/lib/collector_test_support.h"
#include "collectors/lib/rankwatch_collector.h"
#include "collectors/lib/step_ops.h"
#include "collectors/lib/timed_step.h"

namespace rankwatch {
namespace {

constexpr uint64_t kUs = 1000, kMs = 1'000'000;

StepOp Op(v1::OpType type, uint32_t index, uint64_t begin_ns, uint64_t end_ns) {
  StepOp op;
  op.type = type;
  op.index = index;
  op.begin_ns = begin_ns;
  op.end_ns = end_ns;
  return op;
}

DeviceTimes Phases(std::initializer_list<std::pair<StepPhase, uint64_t>> phases) {
  DeviceTimes d;
  for (const auto& [phase, ns] : phases) {
    d.phases.phase_ns[static_cast<int>(phase)] = ns;
    d.phases.phase_mask |= 1u << static_cast<int>(phase);
  }
  return d;
}

CollectorOptions Options(const MockKafka& kafka) {
  CollectorOptions o;
  o.brokers = kafka.bootstrap();
  o.flush_interval_ms = 20;
  o.control_topic.clear();
  return o;
}

TEST(DeviceTimedOpsTest, DeviceTimesWinAndHostTimesStayBesideThemWhenTheyDiffer) {
  const uint64_t begin = 100 * kMs, end = begin + 10 * kMs;
  std::vector<StepOp> ops = {Op(v1::OP_FORWARD_COMPUTE, 0, begin + kMs, begin + 3 * kMs),
                             Op(v1::OP_BACKWARD_COMPUTE, 1, begin + 3 * kMs, begin + 4 * kMs),
                             Op(v1::OP_OPTIMIZER, 2, begin + 5 * kMs, begin + 6 * kMs),
                             Op(v1::OP_GRADS_ALL_REDUCE, 3, begin + 7 * kMs, begin + 8 * kMs)};
  // Op 1 runs on the device after the host's step end; op 3's device time is its host time;
  // op 2 has none; index 9 is no op of the step.
  std::vector<DeviceOpTime> device = {{1, end + 2 * kMs, end + 11 * kMs},
                                      {9, begin, begin + kMs},
                                      {0, begin + 2 * kMs, begin + 8 * kMs},
                                      {3, begin + 7 * kMs, begin + 8 * kMs}};
  v1::StepRecord r;
  AppendStepOps(ops, begin, end, 2'000'000'000, &r, &device);
  EXPECT_EQ(r.ops_origin_unix_ns(), 2'000'000'000 - 10 * int64_t{kMs});
  ASSERT_EQ(r.ops_size(), 4);
  // In the order of the starts they carry.
  EXPECT_EQ(r.ops(0).type(), v1::OP_FORWARD_COMPUTE);
  EXPECT_EQ(r.ops(0).start_offset_us(), 2'000u);
  EXPECT_EQ(r.ops(0).duration_us(), 6'000u);
  EXPECT_EQ(r.ops(0).host_start_offset_us(), 1'000u);
  EXPECT_EQ(r.ops(0).host_duration_us(), 2'000u);
  EXPECT_EQ(r.ops(1).type(), v1::OP_OPTIMIZER);  // host times only
  EXPECT_EQ(r.ops(1).start_offset_us(), 5'000u);
  EXPECT_FALSE(r.ops(1).has_host_start_offset_us());
  EXPECT_FALSE(r.ops(1).has_host_duration_us());
  EXPECT_EQ(r.ops(2).type(), v1::OP_GRADS_ALL_REDUCE);  // device = host: no host times
  EXPECT_EQ(r.ops(2).start_offset_us(), 7'000u);
  EXPECT_FALSE(r.ops(2).has_host_start_offset_us());
  EXPECT_EQ(r.ops(3).type(), v1::OP_BACKWARD_COMPUTE);
  EXPECT_EQ(r.ops(3).start_offset_us(), 12'000u);  // past the step's 10 ms
  EXPECT_EQ(r.ops(3).duration_us(), 9'000u);
  EXPECT_EQ(r.ops(3).host_start_offset_us(), 3'000u);
  EXPECT_EQ(r.ops(3).host_duration_us(), 1'000u);
}

TEST(DeviceTimedOpsTest, ADeviceStartBeforeTheStepMovesTheOrigin) {
  const uint64_t begin = 100 * kMs;
  std::vector<StepOp> ops = {Op(v1::OP_FORWARD_COMPUTE, 0, begin + kMs, begin + 2 * kMs)};
  std::vector<DeviceOpTime> device = {{0, begin - 3 * kMs, begin + 500 * kUs}};
  v1::StepRecord r;
  AppendStepOps(ops, begin, begin + 4 * kMs, 2'000'000'000, &r, &device);
  EXPECT_EQ(r.ops_origin_unix_ns(), 2'000'000'000 - 7 * int64_t{kMs});
  EXPECT_EQ(r.ops(0).start_offset_us(), 0u);
  EXPECT_EQ(r.ops(0).duration_us(), 3'500u);
  EXPECT_EQ(r.ops(0).host_start_offset_us(), 4'000u);
  EXPECT_EQ(r.ops(0).host_duration_us(), 1'000u);
}

TEST(DeviceTimedStepTest, PhasesOnTheDeviceCarryItsTimeAndHostPhasesTheHosts) {
  TimedStep s;
  s.step = 7;
  s.phase_ns[static_cast<int>(StepPhase::kDataloader)] = 1 * kMs;
  s.phase_ns[static_cast<int>(StepPhase::kForward)] = 2 * kMs;
  s.phase_ns[static_cast<int>(StepPhase::kOptimizer)] = 3 * kMs;
  s.phase_mask = 0b1011;  // dataloader, forward, optimizer
  DevicePhases d;
  d.phase_ns[static_cast<int>(StepPhase::kDataloader)] = 9 * kMs;  // ignored: host work
  d.phase_ns[static_cast<int>(StepPhase::kForward)] = 5 * kMs;
  d.phase_ns[static_cast<int>(StepPhase::kCollective)] = 4 * kMs;  // the host did not time it
  d.phase_mask = 0b10011;
  v1::StepRecord r;
  s.clock = v1::STEP_CLOCK_DEVICE;
  s.ToProto(&r, &d);
  EXPECT_EQ(r.clock(), v1::STEP_CLOCK_DEVICE);
  EXPECT_EQ(r.dataloader_ns(), 1 * kMs);
  EXPECT_EQ(r.forward_ns(), 5 * kMs);
  EXPECT_EQ(r.optimizer_ns(), 3 * kMs);
  EXPECT_EQ(r.collective_ns(), 4 * kMs);
  EXPECT_FALSE(r.has_backward_ns());
  EXPECT_EQ(r.host_phases().forward_ns(), 2 * kMs);
  EXPECT_TRUE(r.host_phases().has_collective_ns());
  EXPECT_EQ(r.host_phases().collective_ns(), 0u);
  EXPECT_FALSE(r.host_phases().has_optimizer_ns());
  EXPECT_FALSE(r.host_phases().has_backward_ns());

  s.clock = v1::STEP_CLOCK_DEVICE_MISSING;
  s.ToProto(&r, nullptr);
  EXPECT_EQ(r.clock(), v1::STEP_CLOCK_DEVICE_MISSING);
  EXPECT_EQ(r.forward_ns(), 2 * kMs);
  EXPECT_FALSE(r.has_host_phases());

  s.clock = v1::STEP_CLOCK_HOST;
  s.ToProto(&r, &d);  // host: device phases are not looked at
  EXPECT_EQ(r.clock(), v1::STEP_CLOCK_HOST);
  EXPECT_EQ(r.forward_ns(), 2 * kMs);
  EXPECT_FALSE(r.has_collective_ns());
  EXPECT_FALSE(r.has_host_phases());
}

// A device-timed step and a host-only one behind it, its ops indexed (and the fifth dropped).
TEST(CollectorDeviceTest, ADeviceTimedStepCarriesItsClockDevicePhasesAndOpHostTimes) {
  MockKafka kafka;
  CollectorOptions o = Options(kafka);
  o.max_ops_per_step = 4;
  auto c = Collector::Create(Identity(), o);
  ASSERT_TRUE(c.ok()) << c.status();
  Collector& rw = **c;
  const uint64_t t0 = 1000 * kMs;
  rw.BeginStep(0, t0);
  rw.ExpectDeviceTimes();
  rw.AddPhase(StepPhase::kDataloader, t0, t0 + kMs);
  rw.AddPhase(StepPhase::kForward, t0 + kMs, t0 + 3 * kMs);
  rw.AddPhase(StepPhase::kBackward, t0 + 3 * kMs, t0 + 4 * kMs);
  rw.AddPhase(StepPhase::kOptimizer, t0 + 4 * kMs, t0 + 5 * kMs);
  EXPECT_EQ(rw.AddOp(v1::OP_FORWARD_COMPUTE, 0, 0, t0 + kMs, t0 + 3 * kMs), 0);
  EXPECT_EQ(rw.AddOp(v1::OP_BACKWARD_COMPUTE, 0, 0, t0 + 3 * kMs, t0 + 4 * kMs), 1);
  EXPECT_EQ(rw.AddOp(v1::OP_OPTIMIZER, 0, 0, t0 + 4 * kMs, t0 + 5 * kMs), 2);
  EXPECT_EQ(rw.AddOp(v1::OP_GRADS_ALL_REDUCE, 0, 0, t0 + 4500 * kUs, t0 + 5 * kMs), 3);
  EXPECT_EQ(rw.AddOp(v1::OP_GC, 0, 0, t0 + 5 * kMs, t0 + 5 * kMs), -1);  // over 4: dropped
  rw.EndStep(t0 + 5 * kMs);
  rw.BeginStep(1, t0 + 5 * kMs);  // host only, held behind step 0
  rw.AddPhase(StepPhase::kForward, t0 + 5 * kMs, t0 + 7 * kMs);
  EXPECT_EQ(rw.AddOp(v1::OP_FORWARD_COMPUTE, 0, 0, t0 + 5 * kMs, t0 + 7 * kMs), 0);
  rw.EndStep(t0 + 8 * kMs);
  DeviceTimes d = Phases({{StepPhase::kDataloader, 7 * kMs},
                          {StepPhase::kForward, 6 * kMs},
                          {StepPhase::kBackward, 9 * kMs},
                          {StepPhase::kCollective, 2 * kMs}});
  d.ops = {{0, t0 + 2 * kMs, t0 + 8 * kMs},
           {1, t0 + 8 * kMs, t0 + 17 * kMs},
           {3, t0 + 4500 * kUs, t0 + 5 * kMs},
           {7, t0, t0 + kMs}};
  EXPECT_TRUE(rw.SetDeviceTimes(0, d));
  ASSERT_TRUE(rw.Close(true, std::chrono::seconds(10)).ok());
  const CollectorStats stats = rw.stats();
  EXPECT_EQ(stats.device_steps, 1u);
  EXPECT_EQ(stats.device_steps_missing, 0u);
  EXPECT_EQ(stats.device_times_late, 0u);
  EXPECT_EQ(stats.ops_dropped, 1u);

  const std::vector<v1::StepRecord> steps = Steps(kafka.ReadAll(std::chrono::milliseconds(500)));
  ASSERT_EQ(steps.size(), 2u);
  const v1::StepRecord& s = steps[0];
  EXPECT_EQ(s.step(), 0u);
  EXPECT_EQ(s.clock(), v1::STEP_CLOCK_DEVICE);
  EXPECT_EQ(s.step_time_ns(), 5 * kMs);  // the host's wall time
  EXPECT_EQ(s.dataloader_ns(), 1 * kMs);
  EXPECT_EQ(s.forward_ns(), 6 * kMs);
  EXPECT_EQ(s.backward_ns(), 9 * kMs);
  EXPECT_EQ(s.optimizer_ns(), 1 * kMs);
  EXPECT_EQ(s.collective_ns(), 2 * kMs);
  ASSERT_TRUE(s.has_host_phases());
  EXPECT_EQ(s.host_phases().forward_ns(), 2 * kMs);
  EXPECT_EQ(s.host_phases().backward_ns(), 1 * kMs);
  EXPECT_EQ(s.host_phases().collective_ns(), 0u);
  EXPECT_FALSE(s.host_phases().has_optimizer_ns());
  EXPECT_FALSE(s.host_phases().has_forward_backward_ns());
  EXPECT_EQ(s.ops_origin_unix_ns(), s.end_unix_ns() - int64_t{5 * kMs});
  ASSERT_EQ(s.ops_size(), 4);
  const v1::OpType types[] = {v1::OP_FORWARD_COMPUTE, v1::OP_OPTIMIZER, v1::OP_GRADS_ALL_REDUCE,
                              v1::OP_BACKWARD_COMPUTE};
  const uint64_t starts[] = {2000, 4000, 4500, 8000}, durations[] = {6000, 1000, 500, 9000};
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(s.ops(i).type(), types[i]) << i;
    EXPECT_EQ(s.ops(i).start_offset_us(), starts[i]) << i;
    EXPECT_EQ(s.ops(i).duration_us(), durations[i]) << i;
  }
  EXPECT_EQ(s.ops(0).host_start_offset_us(), 1000u);
  EXPECT_EQ(s.ops(0).host_duration_us(), 2000u);
  EXPECT_FALSE(s.ops(1).has_host_start_offset_us());  // no device time
  EXPECT_FALSE(s.ops(2).has_host_start_offset_us());  // device time = host time
  EXPECT_EQ(s.ops(3).host_start_offset_us(), 3000u);
  EXPECT_EQ(s.ops(3).host_duration_us(), 1000u);
  // Never marked: as before device time.
  const v1::StepRecord& host = steps[1];
  EXPECT_EQ(host.step(), 1u);
  EXPECT_EQ(host.clock(), v1::STEP_CLOCK_HOST);
  EXPECT_FALSE(host.has_host_phases());
  EXPECT_EQ(host.forward_ns(), 2 * kMs);
  ASSERT_EQ(host.ops_size(), 1);
  EXPECT_EQ(host.ops(0).duration_us(), 2000u);
  EXPECT_FALSE(host.ops(0).has_host_start_offset_us());
  EXPECT_FALSE(host.ops(0).has_host_duration_us());
}

// Device times arriving newest first: the held steps still go in step order, a host-only one
// behind them last; a step's second SetDeviceTimes is late.
TEST(CollectorDeviceTest, HeldStepsGoInStepOrderWhenTheirTimesComeOutOfOrder) {
  MockKafka kafka;
  auto c = Collector::Create(Identity(), Options(kafka));
  ASSERT_TRUE(c.ok()) << c.status();
  Collector& rw = **c;
  for (uint64_t step = 0; step < 4; ++step) {
    rw.BeginStep(step, (10 * step + 1) * kMs);
    if (step < 3) rw.ExpectDeviceTimes();
    rw.AddPhase(StepPhase::kForward, (10 * step + 1) * kMs, (10 * step + 2) * kMs);
    rw.EndStep((10 * step + 5) * kMs);
  }
  EXPECT_TRUE(rw.SetDeviceTimes(2, Phases({{StepPhase::kForward, 3 * kMs}})));
  EXPECT_TRUE(rw.SetDeviceTimes(1, Phases({{StepPhase::kForward, 2 * kMs}})));
  std::this_thread::sleep_for(std::chrono::milliseconds(60));  // sender rounds: nothing goes
  EXPECT_FALSE(rw.SetDeviceTimes(1, Phases({{StepPhase::kForward, 4 * kMs}})));
  DeviceTimes missing;
  missing.missing = true;
  EXPECT_TRUE(rw.SetDeviceTimes(0, missing));
  ASSERT_TRUE(rw.Close(true, std::chrono::seconds(10)).ok());
  const CollectorStats stats = rw.stats();
  EXPECT_EQ(stats.device_steps, 2u);
  EXPECT_EQ(stats.device_steps_missing, 1u);
  EXPECT_EQ(stats.device_times_late, 1u);

  const std::vector<v1::StepRecord> steps = Steps(kafka.ReadAll(std::chrono::milliseconds(500)));
  ASSERT_EQ(steps.size(), 4u);
  const v1::StepClock clocks[] = {v1::STEP_CLOCK_DEVICE_MISSING, v1::STEP_CLOCK_DEVICE,
                                  v1::STEP_CLOCK_DEVICE, v1::STEP_CLOCK_HOST};
  const uint64_t forward[] = {1 * kMs, 2 * kMs, 3 * kMs, 1 * kMs};
  for (uint64_t i = 0; i < 4; ++i) {
    EXPECT_EQ(steps[i].step(), i);
    EXPECT_EQ(steps[i].clock(), clocks[i]) << i;
    EXPECT_EQ(steps[i].forward_ns(), forward[i]) << i;
    EXPECT_EQ(steps[i].has_host_phases(), clocks[i] == v1::STEP_CLOCK_DEVICE) << i;
  }
  EXPECT_EQ(steps[1].host_phases().forward_ns(), 1 * kMs);
}

// A step whose device times do not come within device_hold_ms goes with its host times; its
// times coming later are refused and counted.
TEST(CollectorDeviceTest, PastTheDeadlineAHeldStepGoesMissingAndItsLateTimesAreCounted) {
  MockKafka kafka;
  CollectorOptions o = Options(kafka);
  o.device_hold_ms = 100;
  auto c = Collector::Create(Identity(), o);
  ASSERT_TRUE(c.ok()) << c.status();
  Collector& rw = **c;
  rw.BeginStep(0, 10 * kMs);
  rw.ExpectDeviceTimes();
  rw.AddPhase(StepPhase::kForward, 10 * kMs, 12 * kMs);
  const auto held = std::chrono::steady_clock::now();
  rw.EndStep(15 * kMs);
  while (rw.stats().device_steps_missing == 0 &&
         std::chrono::steady_clock::now() - held < std::chrono::seconds(10)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  const auto waited = std::chrono::steady_clock::now() - held;
  EXPECT_EQ(rw.stats().device_steps_missing, 1u);
  EXPECT_GE(waited, std::chrono::milliseconds(100));
  EXPECT_LT(waited, std::chrono::seconds(5));
  EXPECT_FALSE(rw.SetDeviceTimes(0, Phases({{StepPhase::kForward, 5 * kMs}})));
  EXPECT_EQ(rw.stats().device_times_late, 1u);
  EXPECT_FALSE(rw.SetDeviceTimes(42, Phases({})));  // never held
  EXPECT_EQ(rw.stats().device_times_late, 2u);
  rw.BeginStep(1, 20 * kMs);  // in time
  rw.ExpectDeviceTimes();
  rw.AddPhase(StepPhase::kForward, 20 * kMs, 22 * kMs);
  rw.EndStep(25 * kMs);
  EXPECT_TRUE(rw.SetDeviceTimes(1, Phases({{StepPhase::kForward, 3 * kMs}})));
  ASSERT_TRUE(rw.Close(true, std::chrono::seconds(10)).ok());
  EXPECT_EQ(rw.stats().device_steps, 1u);
  EXPECT_EQ(rw.stats().device_steps_missing, 1u);

  const std::vector<v1::StepRecord> steps = Steps(kafka.ReadAll(std::chrono::milliseconds(500)));
  ASSERT_EQ(steps.size(), 2u);
  EXPECT_EQ(steps[0].clock(), v1::STEP_CLOCK_DEVICE_MISSING);
  EXPECT_EQ(steps[0].forward_ns(), 2 * kMs);
  EXPECT_FALSE(steps[0].has_host_phases());
  EXPECT_EQ(steps[1].clock(), v1::STEP_CLOCK_DEVICE);
  EXPECT_EQ(steps[1].forward_ns(), 3 * kMs);
  EXPECT_EQ(steps[1].host_phases().forward_ns(), 2 * kMs);
}

// At most device_hold_steps held: EndStep sends the oldest with host times; Close sends the
// rest (an incomplete one missing, a complete one behind it with its device times).
TEST(CollectorDeviceTest, OverDeviceHoldStepsTheOldestGoesMissingAndCloseSendsTheRest) {
  MockKafka kafka;
  CollectorOptions o = Options(kafka);
  o.device_hold_steps = 2;
  o.device_hold_ms = 60'000;
  auto c = Collector::Create(Identity(), o);
  ASSERT_TRUE(c.ok()) << c.status();
  Collector& rw = **c;
  for (uint64_t step = 0; step < 4; ++step) {
    rw.BeginStep(step, (10 * step + 1) * kMs);
    rw.ExpectDeviceTimes();
    rw.AddPhase(StepPhase::kBackward, (10 * step + 1) * kMs, (10 * step + 3) * kMs);
    rw.EndStep((10 * step + 5) * kMs);
    EXPECT_EQ(rw.stats().device_steps_missing, step < 2 ? 0u : step - 1) << step;
  }
  EXPECT_FALSE(rw.SetDeviceTimes(0, Phases({{StepPhase::kBackward, kMs}})));
  EXPECT_TRUE(rw.SetDeviceTimes(3, Phases({{StepPhase::kBackward, 7 * kMs}})));
  EXPECT_EQ(rw.stats().device_steps, 0u);  // behind step 2, still held
  ASSERT_TRUE(rw.Close(true, std::chrono::seconds(10)).ok());
  EXPECT_EQ(rw.stats().device_steps, 1u);
  EXPECT_EQ(rw.stats().device_steps_missing, 3u);
  EXPECT_EQ(rw.stats().device_times_late, 1u);
  EXPECT_FALSE(rw.SetDeviceTimes(2, Phases({})));  // after Close

  const std::vector<v1::StepRecord> steps = Steps(kafka.ReadAll(std::chrono::milliseconds(500)));
  ASSERT_EQ(steps.size(), 4u);
  for (uint64_t i = 0; i < 3; ++i) {
    EXPECT_EQ(steps[i].step(), i);
    EXPECT_EQ(steps[i].clock(), v1::STEP_CLOCK_DEVICE_MISSING) << i;
    EXPECT_EQ(steps[i].backward_ns(), 2 * kMs) << i;
  }
  EXPECT_EQ(steps[3].step(), 3u);
  EXPECT_EQ(steps[3].clock(), v1::STEP_CLOCK_DEVICE);
  EXPECT_EQ(steps[3].backward_ns(), 7 * kMs);
  EXPECT_EQ(steps[3].host_phases().backward_ns(), 2 * kMs);
}

TEST(CollectorDeviceCApiTest, IndexedOpsDeviceTimesStatsAndDestroyWithAHeldStep) {
  MockKafka kafka;
  char error[256] = {};
  rw_identity id{"job-device", 0, 1, "h", 0, 0, "cuda:0"};
  rw_options o{};
  o.brokers = kafka.bootstrap().c_str();
  o.flush_interval_ms = 20;
  o.control_topic = "";
  o.device_hold_ms = 60'000;
  rw_collector* c = rw_collector_create(&id, &o, error, sizeof(error));
  ASSERT_NE(c, nullptr) << error;
  const uint64_t t0 = rw_now_ns();
  rw_step_begin(c, 5);
  rw_step_expect_device_times(c);
  rw_phase_add(c, RW_PHASE_FORWARD, t0, t0 + 2 * kMs);
  EXPECT_EQ(rw_op_add_indexed(c, RW_OP_FORWARD_COMPUTE, 0, 0, t0, t0 + 2 * kMs), 0);
  EXPECT_EQ(rw_op_add_indexed(c, static_cast<rw_op_type>(99), 0, 0, t0, t0 + kMs), -1);
  EXPECT_EQ(rw_op_add(c, RW_OP_FORWARD_SEND, 0, 0, t0 + 2 * kMs, t0 + 3 * kMs), 0);  // index 1
  rw_op_scope scope = rw_op_begin(RW_OP_BACKWARD_COMPUTE, 0, 0);
  EXPECT_EQ(rw_op_end_indexed(c, &scope), 2);
  rw_step_end(c);
  rw_step_begin(c, 6);  // held at destroy
  rw_step_expect_device_times(c);
  rw_step_end(c);
  rw_device_op_time op{0, t0 + 3 * kMs, t0 + 7 * kMs};
  rw_device_times d{};
  d.phase_ns[RW_PHASE_FORWARD] = 4 * kMs;
  d.phase_mask = 1u << RW_PHASE_FORWARD;
  d.ops = &op;
  d.n_ops = 1;
  EXPECT_EQ(rw_device_times_set(c, 5, &d), 0);
  EXPECT_EQ(rw_device_times_set(c, 5, &d), -1);  // already sent
  rw_stats s;
  rw_stats_get(c, &s);
  EXPECT_EQ(s.device_steps, 1u);
  EXPECT_EQ(s.device_steps_missing, 0u);
  EXPECT_EQ(s.device_times_late, 1u);
  EXPECT_EQ(s.ops_recorded, 3u);
  rw_collector_destroy(c, 1, 5000);

  const std::vector<v1::StepRecord> steps = Steps(kafka.ReadAll(std::chrono::milliseconds(500)));
  ASSERT_EQ(steps.size(), 2u);
  EXPECT_EQ(steps[0].clock(), v1::STEP_CLOCK_DEVICE);
  EXPECT_EQ(steps[0].forward_ns(), 4 * kMs);
  EXPECT_EQ(steps[0].host_phases().forward_ns(), 2 * kMs);
  ASSERT_EQ(steps[0].ops_size(), 3);
  for (const v1::OpRecord& r : steps[0].ops()) {
    if (r.type() != v1::OP_FORWARD_COMPUTE) continue;
    EXPECT_EQ(r.duration_us(), 4000u);
    EXPECT_EQ(r.host_duration_us(), 2000u);
  }
  EXPECT_EQ(steps[1].step(), 6u);
  EXPECT_EQ(steps[1].clock(), v1::STEP_CLOCK_DEVICE_MISSING);
}

TEST(CollectorDeviceTest, HoldOptionsMustBePositive) {
  CollectorOptions o;
  o.brokers = "127.0.0.1:1";
  o.control_topic.clear();
  o.device_hold_ms = 0;
  EXPECT_FALSE(Collector::Create(Identity(), o).ok());
  o.device_hold_ms = 1;
  o.device_hold_steps = 0;
  EXPECT_FALSE(Collector::Create(Identity(), o).ok());
}

}  // namespace
}  // namespace rankwatch
