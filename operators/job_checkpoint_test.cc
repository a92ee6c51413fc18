// A job restored from its checkpoints behaves exactly like the job that was checkpointed.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>

#include "collectors/simulator/fleet_model.h"
#include "operators/job_pipeline.h"
#include "operators/step_codec.h"

namespace rankwatch {
namespace {

// The simulator's batches: one rank's `per_batch` steps per message, in step-chunk order.
std::vector<v1::Batch> FleetBatches(uint32_t ranks, uint64_t steps, uint32_t per_batch,
                                    std::vector<std::string> faults = {"slow-compute:3:0.3:60",
                                                                       "memory-leak:all:64:20"}) {
  FleetOptions o;
  o.training_job = "ckpt";
  o.ranks = ranks;
  o.report_collective = true;
  for (const std::string& f : faults) o.faults.push_back(*ParseFaultSpec(f));
  FleetModel model(o);
  std::vector<v1::Batch> pending(ranks), out;
  for (uint32_t r = 0; r < ranks; ++r) {
    pending[r].mutable_source()->set_training_job("ckpt");
    pending[r].mutable_source()->set_rank(r);
    pending[r].mutable_source()->set_world_size(ranks);
    pending[r].mutable_source()->set_node(model.NodeName(r));
  }
  std::vector<v1::StepRecord> rec;
  std::vector<bool> rep;
  for (uint64_t s = 0; s < steps; ++s) {
    model.Step(s, &rec, &rep);
    for (uint32_t r = 0; r < ranks; ++r) {
      *pending[r].add_steps() = rec[r];
      if (pending[r].steps_size() == static_cast<int>(per_batch)) {
        out.push_back(pending[r]);
        pending[r].clear_steps();
      }
    }
  }
  return out;
}

// What the daemon keeps in its store for one job.
struct FakeStore {
  state::v1::JobMeta meta;
  std::map<uint64_t, state::v1::StoredStep> steps;
  std::map<uint64_t, state::v1::WhatIfStepOps> whatif;
  size_t bytes_written = 0;  // serialized metadata and new steps of every checkpoint

  void Apply(JobCheckpoint c) {
    bytes_written += c.meta.ByteSizeLong();
    for (const auto& s : c.new_steps) bytes_written += s.ByteSizeLong();
    for (const auto& s : c.new_whatif_steps) bytes_written += s.ByteSizeLong();
    meta = std::move(c.meta);
    for (auto& s : c.new_steps) steps[s.step()] = std::move(s);
    steps.erase(steps.begin(), steps.lower_bound(c.keep_from_step));
    for (auto& s : c.new_whatif_steps) whatif[s.step()] = std::move(s);
    if (c.whatif_keep_from_step > 0) {
      whatif.erase(whatif.begin(), whatif.lower_bound(c.whatif_keep_from_step));
    }
  }
  std::vector<state::v1::StoredStep> Steps() const {
    std::vector<state::v1::StoredStep> v;
    for (const auto& [step, s] : steps) v.push_back(s);
    return v;
  }
  std::vector<state::v1::WhatIfStepOps> WhatIfSteps() const {
    std::vector<state::v1::WhatIfStepOps> v;
    for (const auto& [step, s] : whatif) v.push_back(s);
    return v;
  }
};

void ExpectSameSnapshot(const JobSnapshot& a, const JobSnapshot& b) {
  EXPECT_EQ(a.aligned_steps, b.aligned_steps);
  EXPECT_EQ(a.timed_out_steps, b.timed_out_steps);
  EXPECT_EQ(a.ranks_seen, b.ranks_seen);
  EXPECT_EQ(a.window_first_step, b.window_first_step);
  EXPECT_EQ(a.window_last_step, b.window_last_step);
  for (int p = 0; p < kPhaseCount; ++p) {
    EXPECT_EQ(a.phases[p].median_seconds, b.phases[p].median_seconds) << p;
    EXPECT_EQ(a.phases[p].worst_seconds, b.phases[p].worst_seconds) << p;
    EXPECT_EQ(a.phases[p].worst_rank, b.phases[p].worst_rank) << p;
  }
  EXPECT_EQ(a.step.label, b.step.label);
  EXPECT_EQ(a.step.cause, b.step.cause);
  EXPECT_EQ(a.step.compute_score, b.step.compute_score);
  EXPECT_EQ(a.step.gc.time.stat.present, b.step.gc.time.stat.present);
  EXPECT_EQ(a.step.gc.time.stat.median_seconds, b.step.gc.time.stat.median_seconds);
  EXPECT_EQ(a.step.gc.time.stat.worst_seconds, b.step.gc.time.stat.worst_seconds);
  EXPECT_EQ(a.step.gc.rank_collections, b.step.gc.rank_collections);
  EXPECT_EQ(a.step.culprit_ranks, b.step.culprit_ranks);
  EXPECT_EQ(a.step.note, b.step.note);
  EXPECT_EQ(a.memory.label, b.memory.label);
  EXPECT_EQ(a.memory.kinds[0].worst_peak_bytes, b.memory.kinds[0].worst_peak_bytes);
  EXPECT_EQ(a.memory.kinds[0].creep_bytes_per_step, b.memory.kinds[0].creep_bytes_per_step);
  EXPECT_EQ(a.memory.note, b.memory.note);
  EXPECT_EQ(a.memory.lifetime_trend, b.memory.lifetime_trend);
  for (int k = 0; k < kMemoryKindCount; ++k) {
    const MemoryTrendEvidence &x = a.memory.kinds[k].trend, &y = b.memory.kinds[k].trend;
    EXPECT_EQ(x.steps, y.steps) << k;
    EXPECT_EQ(x.worst.slope, y.worst.slope) << k;
    EXPECT_EQ(x.worst.sigma, y.worst.sigma) << k;
    EXPECT_EQ(x.median.recent_slope, y.median.recent_slope) << k;
    EXPECT_EQ(x.label, y.label) << k;
    const MemoryKindEvidence &ex = a.memory.kinds[k], &ey = b.memory.kinds[k];
    EXPECT_EQ(ex.ranks_followed, ey.ranks_followed) << k;
    ASSERT_EQ(ex.rank_trends.size(), ey.rank_trends.size()) << k;
    for (size_t i = 0; i < ex.rank_trends.size(); ++i) {
      EXPECT_EQ(ex.rank_trends[i].rank, ey.rank_trends[i].rank) << k;
      EXPECT_EQ(ex.rank_trends[i].steps, ey.rank_trends[i].steps) << k;
      EXPECT_EQ(ex.rank_trends[i].bytes_per_step(), ey.rank_trends[i].bytes_per_step()) << k;
    }
  }
  EXPECT_EQ(a.memory.creep_scope, b.memory.creep_scope);
  EXPECT_EQ(a.memory.creep_rank, b.memory.creep_rank);
}

TEST(StepCodecTest, RoundTripsAStep) {
  AlignedStep a{42, 4, true, {}};
  for (uint32_t r : {0u, 2u, 3u}) {
    StepSample s;
    s.step = 42;
    s.rank = r;
    s.Set(Phase::kForward, 30'000'000 + r * 17);
    s.Set(Phase::kStep, 100'000'000 - r);
    s.peak_allocated_bytes = (40ull << 30) + r;
    s.device_capacity_bytes = 80ull << 30;
    s.end_unix_ns = 1'795'000'000'000'000'000 + r;
    a.samples.push_back(s);
  }
  const state::v1::StoredStep stored = EncodeStep(a);
  AlignedStep b;
  ASSERT_TRUE(DecodeStep(stored, &b).ok());
  EXPECT_EQ(b.step, 42u);
  EXPECT_TRUE(b.timed_out);
  ASSERT_EQ(b.samples.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(b.samples[i].rank, a.samples[i].rank);
    EXPECT_EQ(b.samples[i].present, a.samples[i].present);
    EXPECT_EQ(b.samples[i].ns, a.samples[i].ns);
    EXPECT_EQ(b.samples[i].peak_allocated_bytes, a.samples[i].peak_allocated_bytes);
    EXPECT_EQ(b.samples[i].end_unix_ns, a.samples[i].end_unix_ns);
  }
  state::v1::StoredStep damaged = stored;
  damaged.mutable_ranks()->RemoveLast();
  EXPECT_EQ(DecodeStep(damaged, &b).code(), absl::StatusCode::kDataLoss);
}

TEST(StepCodecTest, RoundTripsGcPauses) {
  AlignedStep a{7, 4, false, {}};
  for (uint32_t r : {0u, 1u, 3u}) {
    StepSample s;
    s.step = 7;
    s.rank = r;
    s.Set(Phase::kStep, 100'000'000);
    if (r != 1) {  // rank 1's collector does not watch GC
      s.gc_ns = r == 3 ? 41'000'000 : 0;
      s.gc_count = r == 3 ? 3 : 0;
      s.present |= kGcBit;
    }
    a.samples.push_back(s);
  }
  const state::v1::StoredStep stored = EncodeStep(a);
  ASSERT_EQ(stored.gc_ns_delta_size(), 3);
  AlignedStep b;
  ASSERT_TRUE(DecodeStep(stored, &b).ok());
  ASSERT_EQ(b.samples.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(b.samples[i].HasGc(), a.samples[i].HasGc()) << i;
    EXPECT_EQ(b.samples[i].gc_ns, a.samples[i].gc_ns) << i;
    EXPECT_EQ(b.samples[i].gc_count, a.samples[i].gc_count) << i;
  }
  // A step without GC stores no GC columns.
  for (StepSample& s : a.samples) {
    s.present &= ~kGcBit;
    s.gc_ns = 0;
    s.gc_count = 0;
  }
  EXPECT_EQ(EncodeStep(a).gc_ns_delta_size(), 0);
  EXPECT_EQ(EncodeStep(a).gc_count_size(), 0);
  // Damaged: GC marked without its columns, or columns of another length.
  state::v1::StoredStep damaged = stored;
  damaged.clear_gc_ns_delta();
  damaged.clear_gc_count();
  EXPECT_EQ(DecodeStep(damaged, &b).code(), absl::StatusCode::kDataLoss);
  damaged = stored;
  damaged.mutable_gc_count()->RemoveLast();
  EXPECT_EQ(DecodeStep(damaged, &b).code(), absl::StatusCode::kDataLoss);
}

TEST(StepCodecTest, RoundTripsTheRecordsClock) {
  AlignedStep a{11, 3, false, {}};
  const uint32_t clocks[] = {kDeviceClockBit, kDeviceMissingBit, 0u};
  for (uint32_t r : {0u, 1u, 2u}) {
    StepSample s;
    s.step = 11;
    s.rank = r;
    s.Set(Phase::kForward, 30'000'000);
    s.Set(Phase::kStep, 100'000'000);
    s.present |= clocks[r];
    a.samples.push_back(s);
  }
  const state::v1::StoredStep stored = EncodeStep(a);
  AlignedStep b;
  ASSERT_TRUE(DecodeStep(stored, &b).ok());
  ASSERT_EQ(b.samples.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(b.samples[i].present, a.samples[i].present) << i;
    EXPECT_EQ(b.samples[i].ns, a.samples[i].ns) << i;
  }
  EXPECT_TRUE(b.samples[0].DeviceTimed());
  EXPECT_TRUE(b.samples[1].DeviceTimesMissing());
  EXPECT_FALSE(b.samples[2].DeviceTimed() || b.samples[2].DeviceTimesMissing());
  // A step stored before the clock was carried (no clock bits) restores as host-timed.
  state::v1::StoredStep old = stored;
  for (int i = 0; i < old.present_size(); ++i) {
    old.set_present(i, old.present(i) & ~(kDeviceClockBit | kDeviceMissingBit));
  }
  ASSERT_TRUE(DecodeStep(old, &b).ok());
  for (const StepSample& s : b.samples) EXPECT_FALSE(s.DeviceTimed() || s.DeviceTimesMissing());
}

TEST(StepCodecTest, AStepStoredBeforeGcWasCarriedRestoresWithoutGc) {
  // The columns as the encoder wrote them before GC: no fields 11 and 12, no GC bit.
  state::v1::StoredStep old;
  old.set_step(9);
  old.set_world_size(2);
  for (uint32_t r : {0u, 1u}) {
    old.add_ranks(r);
    old.add_present(1u << static_cast<int>(Phase::kStep));
    for (int p = 0; p < kPhaseCount; ++p) {
      old.add_phase_ns_delta(p == static_cast<int>(Phase::kStep) && r == 0 ? 50'000'000 : 0);
    }
    old.add_peak_allocated_delta(0);
    old.add_peak_reserved_delta(0);
    old.add_capacity_delta(0);
    old.add_end_unix_ns_delta(0);
  }
  AlignedStep b;
  ASSERT_TRUE(DecodeStep(old, &b).ok());
  ASSERT_EQ(b.samples.size(), 2u);
  for (const StepSample& s : b.samples) {
    EXPECT_FALSE(s.HasGc());
    EXPECT_EQ(s.gc_ns, 0);
    EXPECT_EQ(s.Get(Phase::kStep), 50'000'000);
  }
}

TEST(JobCheckpointTest, ARestoredJobContinuesExactlyLikeTheOriginal) {
  const std::vector<v1::Batch> batches = FleetBatches(8, 240, 5);
  JobPipelineOptions options;
  options.record_changes = true;
  JobPipeline original("ckpt", 8, options);
  FakeStore store;
  const TimePoint t0{};
  const int64_t wall0 = 1'795'000'000'000'000'000;
  // Checkpoint every 11 batches; crash after batch 150 (some steps are half-reported then).
  // Evaluated every 8 batches, as the daemon evaluates a job as its steps align (snapshots
  // change nothing of the job).
  size_t crash_at = 0;
  for (size_t i = 0; i < batches.size(); ++i) {
    original.AddBatch(batches[i], t0);
    if (i % 8 == 7) (void)original.Snapshot(t0);
    if (i % 11 == 10) {
      store.Apply(original.TakeCheckpoint(t0, wall0));
      if (i >= 150 && crash_at == 0) crash_at = i + 1;
    }
  }
  ASSERT_GT(crash_at, 0u);
  // Replay: the original up to the checkpoint, restored, then both see the rest.
  JobPipeline reference("ckpt", 8, options);
  FakeStore at_crash;
  for (size_t i = 0; i < crash_at; ++i) {
    reference.AddBatch(batches[i], t0);
    if (i % 8 == 7) (void)reference.Snapshot(t0);
    if (i % 11 == 10) at_crash.Apply(reference.TakeCheckpoint(t0, wall0));
  }
  ASSERT_GT(at_crash.meta.aligner().pending_size(), 0) << "the crash should leave steps pending";
  EXPECT_LE(at_crash.steps.size(), 100u);  // only what the windows still hold is kept
  auto restored = JobPipeline::Restore(at_crash.meta, at_crash.Steps(), options, t0, wall0);
  ASSERT_TRUE(restored.ok()) << restored.status();
  ExpectSameSnapshot(reference.Snapshot(t0), (*restored)->Snapshot(t0));
  for (size_t i = crash_at; i < batches.size(); ++i) {
    reference.AddBatch(batches[i], t0);
    (*restored)->AddBatch(batches[i], t0);
    if (i % 8 == 7) (void)reference.Snapshot(t0), (void)(*restored)->Snapshot(t0);
  }
  const JobSnapshot a = reference.Snapshot(t0), b = (*restored)->Snapshot(t0);
  EXPECT_EQ(a.aligned_steps, 240u);
  EXPECT_EQ(a.step.straggler.since_step, 60u) << a.step.note;  // held: the window is 141-240
  EXPECT_EQ(a.step.label, StepLabel::kComputeStraggler);
  EXPECT_EQ(a.memory.label, MemoryLabel::kCreep);
  ExpectSameSnapshot(a, b);
  ExpectSameSnapshot(original.Snapshot(t0), b);
}

// A job checkpointed rarely (a fast job: thousands of steps between checkpoints) hands over only
// the steps its windows still hold, not every step aligned since the last checkpoint, and
// restores exactly like the job checkpointed often.
TEST(JobCheckpointTest, ARareCheckpointCarriesOnlyTheStepsTheWindowsHold) {
  const std::vector<v1::Batch> batches = FleetBatches(8, 400, 5);
  JobPipelineOptions options;
  options.record_changes = true;
  const TimePoint t0{};
  const int64_t wall0 = 1'795'000'000'000'000'000;
  JobPipeline often("ckpt", 8, options), rarely("ckpt", 8, options);
  FakeStore often_store, rarely_store;
  for (size_t i = 0; i < batches.size(); ++i) {
    often.AddBatch(batches[i], t0);
    rarely.AddBatch(batches[i], t0);
    if (i % 11 == 10) often_store.Apply(often.TakeCheckpoint(t0, wall0));
  }
  often_store.Apply(often.TakeCheckpoint(t0, wall0));
  JobCheckpoint once = rarely.TakeCheckpoint(t0, wall0);
  ASSERT_FALSE(once.new_steps.empty());
  EXPECT_GE(once.new_steps.front().step(), once.keep_from_step);
  EXPECT_LE(once.new_steps.size(), 100u);  // of 400 aligned steps
  rarely_store.Apply(std::move(once));
  ASSERT_EQ(often_store.steps.size(), rarely_store.steps.size());
  for (const auto& [step, stored] : often_store.steps) {
    EXPECT_EQ(stored.SerializeAsString(), rarely_store.steps.at(step).SerializeAsString()) << step;
  }
  auto a = JobPipeline::Restore(often_store.meta, often_store.Steps(), options, t0, wall0);
  auto b = JobPipeline::Restore(rarely_store.meta, rarely_store.Steps(), options, t0, wall0);
  ASSERT_TRUE(a.ok() && b.ok());
  ExpectSameSnapshot((*a)->Snapshot(t0), (*b)->Snapshot(t0));
  ExpectSameSnapshot(often.Snapshot(t0), (*b)->Snapshot(t0));
}

// `batches` with GC pauses: rank 2 reports 40 ms in 3 collections every step, the others none.
std::vector<v1::Batch> WithGc(std::vector<v1::Batch> batches) {
  for (v1::Batch& b : batches) {
    const bool slow = b.source().rank() == 2;
    for (v1::StepRecord& r : *b.mutable_steps()) {
      r.set_gc_ns(slow ? 40'000'000 : 0);
      r.set_gc_count(slow ? 3 : 0);
    }
  }
  return batches;
}

TEST(JobCheckpointTest, GcPausesSurviveARestoreAndStateWithoutThemStillRestores) {
  const std::vector<v1::Batch> batches = WithGc(FleetBatches(8, 120, 5, {}));
  JobPipelineOptions options;
  options.record_changes = true;
  JobPipeline original("ckpt", 8, options);
  FakeStore store;
  const TimePoint t0{};
  const int64_t wall0 = 1'795'000'000'000'000'000;
  for (size_t i = 0; i < batches.size(); ++i) {
    original.AddBatch(batches[i], t0);
    if (i % 11 == 10) store.Apply(original.TakeCheckpoint(t0, wall0));
  }
  store.Apply(original.TakeCheckpoint(t0, wall0));
  const JobSnapshot a = original.Snapshot(t0);
  ASSERT_TRUE(a.step.gc.time.stat.present);
  EXPECT_NEAR(a.step.gc.time.stat.worst_seconds, 0.040, 1e-9);
  EXPECT_EQ(a.step.gc.time.stat.worst_rank, 2u);
  auto restored = JobPipeline::Restore(store.meta, store.Steps(), options, t0, wall0);
  ASSERT_TRUE(restored.ok()) << restored.status();
  ExpectSameSnapshot(a, (*restored)->Snapshot(t0));

  // The same state as written before GC was carried: no GC columns, no GC bit.
  auto strip = [](state::v1::StoredStep& st) {
    st.clear_gc_ns_delta();
    st.clear_gc_count();
    for (uint32_t& present : *st.mutable_present()) present &= ~kGcBit;
  };
  FakeStore old = store;
  for (auto& [step, st] : old.steps) strip(st);
  for (state::v1::PendingStep& p : *old.meta.mutable_aligner()->mutable_pending()) {
    strip(*p.mutable_samples());
  }
  auto from_old = JobPipeline::Restore(old.meta, old.Steps(), options, t0, wall0);
  ASSERT_TRUE(from_old.ok()) << from_old.status();
  const JobSnapshot b = (*from_old)->Snapshot(t0);
  EXPECT_FALSE(b.step.gc.time.stat.present);
  EXPECT_EQ(b.aligned_steps, a.aligned_steps);
  EXPECT_EQ(b.window_last_step, a.window_last_step);
}

// An 8-rank job of 700 steps with `faults`, checkpointed every 11 batches, crashed right after
// the checkpoint of batch 967 (around step 605) and restored from the store (which keeps only
// the window's last 100 steps), then fed the rest: the snapshots of the job that never stopped,
// of the restored one, and of one restored from the same state less its lifetime trend (as
// written before the trend existed).
struct CrashedJob {
  JobSnapshot reference, restored, without_trend;
};

CrashedJob RunCrashingAt605(const std::vector<std::string>& faults) {
  const std::vector<v1::Batch> batches = FleetBatches(8, 700, 5, faults);
  JobPipelineOptions options;
  options.record_changes = true;
  JobPipeline reference("ckpt", 8, options);
  FakeStore store;
  const TimePoint t0{};
  const int64_t wall0 = 1'795'000'000'000'000'000;
  const size_t crash_at = 968;  // right after the checkpoint of batch 967 (around step 605)
  for (size_t i = 0; i < crash_at; ++i) {
    reference.AddBatch(batches[i], t0);
    if (i % 11 == 10) store.Apply(reference.TakeCheckpoint(t0, wall0));
  }
  EXPECT_LE(store.steps.size(), 100u);
  EXPECT_TRUE(store.meta.has_memory_trend());
  auto restored = JobPipeline::Restore(store.meta, store.Steps(), options, t0, wall0);
  EXPECT_TRUE(restored.ok()) << restored.status();
  state::v1::JobMeta old_meta = store.meta;
  old_meta.clear_memory_trend();
  auto without = JobPipeline::Restore(old_meta, store.Steps(), options, t0, wall0);
  EXPECT_TRUE(without.ok()) << without.status();
  if (!restored.ok() || !without.ok()) return {};
  for (size_t i = crash_at; i < batches.size(); ++i) {
    reference.AddBatch(batches[i], t0);
    (*restored)->AddBatch(batches[i], t0);
    (*without)->AddBatch(batches[i], t0);
  }
  return {reference.Snapshot(t0), (*restored)->Snapshot(t0), (*without)->Snapshot(t0)};
}

TEST(JobCheckpointTest, ARestoredJobKeepsItsLifetimeMemoryTrend) {
  // A slow leak, 8 MiB a step on 40 GiB per rank (+-1 % noise): a 100-step window sees 0.8 GiB,
  // 2 %, never a creep; the lifetime trend reaches 10 % (early creep) after ~500 steps. The
  // store keeps only the window's last 100 steps, so the trend must come from the checkpoint.
  const CrashedJob j = RunCrashingAt605({"memory-leak:all:8"});
  const JobSnapshot &a = j.reference, &b = j.restored;
  EXPECT_EQ(a.aligned_steps, 700u);
  EXPECT_EQ(a.memory.label, MemoryLabel::kCreepEarly) << a.memory.note;
  EXPECT_TRUE(a.memory.lifetime_trend);
  EXPECT_EQ(a.memory.creep_scope, CreepScope::kJob);
  EXPECT_EQ(a.memory.kinds[0].trend.steps, 700u);
  EXPECT_NEAR(a.memory.kinds[0].creep_bytes_per_step / (1 << 20), 8, 0.4);
  ExpectSameSnapshot(a, b);
  // Without the trend in the checkpoint only the stored steps rebuild it: it spans 100 steps,
  // too few to judge.
  EXPECT_EQ(j.without_trend.memory.label, MemoryLabel::kBalanced);
}

TEST(JobCheckpointTest, ARestoredJobKeepsEachRanksOwnMemoryTrend) {
  // Rank 3 alone leaks 8 MiB a step on 40 GiB: +14 % of its own peak in 700 steps, an early
  // creep of that rank by its own series (the median rank is flat), with its rate.
  const CrashedJob j = RunCrashingAt605({"memory-leak:3:8"});
  const JobSnapshot &a = j.reference, &b = j.restored;
  EXPECT_EQ(a.memory.label, MemoryLabel::kCreepEarly) << a.memory.note;
  EXPECT_EQ(a.memory.creep_scope, CreepScope::kRank);
  EXPECT_EQ(a.memory.creep_rank, 3u);
  EXPECT_EQ(a.memory.kinds[0].ranks_followed, 8u);
  EXPECT_NEAR(a.memory.kinds[0].creep_bytes_per_step / (1 << 20), 8, 0.4);
  ExpectSameSnapshot(a, b);
  // A state without the trend restarts the ranks' series too: 100 steps, nothing to judge.
  EXPECT_EQ(j.without_trend.memory.creep_scope, CreepScope::kNone);
}

TEST(JobCheckpointTest, TheTimeBetweenCheckpointAndRestoreDoesNotAgePendingSteps) {
  // Step 0 of a 4-rank job: three ranks reported, the fourth still to come when the daemon
  // stops. It checkpointed 3 s after the step was first seen and comes back 60 s later, when
  // the fourth rank's record is read again from the log. The step waited 3 s of the daemon's
  // time, so it is still pending (10 s timeout) and aligns whole, as it did in a daemon that
  // never stopped.
  const std::vector<v1::Batch> batches = FleetBatches(4, 1, 1, {});
  ASSERT_EQ(batches.size(), 4u);
  JobPipelineOptions options;
  options.record_changes = true;
  options.align.align_timeout = std::chrono::seconds(10);
  JobPipeline original("ckpt", 4, options);
  const TimePoint t0{};
  const int64_t wall0 = 1'795'000'000'000'000'000;
  for (size_t i = 0; i < 3; ++i) original.AddBatch(batches[i], t0);
  const TimePoint t_ckpt = t0 + std::chrono::seconds(3);
  const JobCheckpoint c = original.TakeCheckpoint(t_ckpt, wall0 + 3'000'000'000);
  ASSERT_EQ(c.meta.aligner().pending_size(), 1);

  const TimePoint t1 = t0 + std::chrono::hours(5);  // another process: another steady clock
  const int64_t wall1 = wall0 + 63'000'000'000;
  auto restored = JobPipeline::Restore(c.meta, {}, options, t1, wall1);
  ASSERT_TRUE(restored.ok()) << restored.status();
  (*restored)->Tick(t1 + std::chrono::seconds(6));  // 9 s of the step's 10
  EXPECT_EQ((*restored)->Snapshot(t1).aligned_steps, 0u);
  (*restored)->AddBatch(batches[3], t1 + std::chrono::seconds(6));
  EXPECT_EQ((*restored)->Snapshot(t1).aligned_steps, 1u);
  EXPECT_EQ((*restored)->Snapshot(t1).timed_out_steps, 0u);

  // It still times out on the daemon's time: 7 s after the restore is 10 s in all.
  auto again = JobPipeline::Restore(c.meta, {}, options, t1, wall1);
  ASSERT_TRUE(again.ok()) << again.status();
  (*again)->Tick(t1 + std::chrono::seconds(7) + std::chrono::milliseconds(1));
  EXPECT_EQ((*again)->Snapshot(t1).timed_out_steps, 1u);

  // State written before checkpoints carried their time: the wall clock at restore, as then.
  state::v1::JobMeta old_meta = c.meta;
  old_meta.clear_checkpoint_unix_ns();
  auto old = JobPipeline::Restore(old_meta, {}, options, t1, wall1);
  ASSERT_TRUE(old.ok()) << old.status();
  (*old)->Tick(t1);
  EXPECT_EQ((*old)->Snapshot(t1).timed_out_steps, 1u);
}

// A DP 2 x PP 4 x TP 2 pipeline job (`rankwatch simulate --parallel`), one batch per rank and
// step, with `faults`.
std::vector<v1::Batch> PipelineBatches(uint64_t steps, const std::vector<std::string>& faults) {
  FleetOptions o;
  o.training_job = "pipe";
  o.parallel = PipelineSpec{.dp = 2, .pp = 4, .tp = 2, .microbatches = 8};
  o.ranks = o.parallel->world_size();
  for (const std::string& f : faults) o.faults.push_back(*ParseFaultSpec(f));
  EXPECT_TRUE(CheckFleetOptions(o).ok());
  FleetModel model(o);
  std::vector<v1::Batch> out;
  std::vector<v1::StepRecord> rec;
  std::vector<bool> rep;
  for (uint64_t s = 0; s < steps; ++s) {
    model.Step(s, &rec, &rep);
    for (uint32_t r = 0; r < o.ranks; ++r) {
      v1::Batch& b = out.emplace_back();
      b.mutable_source()->set_training_job("pipe");
      b.mutable_source()->set_rank(r);
      b.mutable_source()->set_world_size(o.ranks);
      b.mutable_source()->set_node(model.NodeName(r));
      *b.mutable_source()->mutable_layout() = model.LayoutOf(r);
      *b.add_steps() = rec[r];
    }
  }
  return out;
}

void ExpectSameWhatIf(const JobSnapshot& a, const JobSnapshot& b) {
  ASSERT_NE(a.whatif, nullptr);
  ASSERT_NE(b.whatif, nullptr);
  const whatif::WhatIfSnapshot &x = *a.whatif, &y = *b.whatif;
  EXPECT_EQ(x.analysed_steps, y.analysed_steps);
  EXPECT_EQ(x.skipped_steps, y.skipped_steps) << y.last_error;
  EXPECT_EQ(x.result.steps, y.result.steps);
  EXPECT_EQ(x.result.first_step, y.result.first_step);
  EXPECT_EQ(x.result.last_step, y.result.last_step);
  EXPECT_DOUBLE_EQ(x.result.slowdown, y.result.slowdown);
  EXPECT_DOUBLE_EQ(x.result.actual_us, y.result.actual_us);
  EXPECT_DOUBLE_EQ(x.result.ideal_us, y.result.ideal_us);
  // The decompositions too: the analyzer's cached re-simulations (computed with typical
  // durations up to 1 % older than the window's) are restored with it, not recomputed.
  EXPECT_DOUBLE_EQ(x.result.m_w, y.result.m_w);
  EXPECT_DOUBLE_EQ(x.result.m_s, y.result.m_s);
  EXPECT_EQ(x.result.decomposition.by_dp_rank, y.result.decomposition.by_dp_rank);
  EXPECT_EQ(x.result.decomposition.by_stage, y.result.decomposition.by_stage);
  EXPECT_EQ(x.result.decomposition.by_op_group, y.result.decomposition.by_op_group);
  EXPECT_EQ(x.result.decomposition.by_worker, y.result.decomposition.by_worker);
  EXPECT_EQ(x.verdict.note, y.verdict.note);
  EXPECT_EQ(x.verdict.verdict, y.verdict.verdict) << y.verdict.note;
  EXPECT_EQ(x.verdict.data_rank, y.verdict.data_rank);
  EXPECT_EQ(x.verdict.stage, y.verdict.stage);
  EXPECT_EQ(x.verdict.ranks, y.verdict.ranks);
  EXPECT_EQ(x.worker_ranks, y.worker_ranks);
  EXPECT_EQ(x.since_step, y.since_step);
  EXPECT_EQ(x.onset_known, y.onset_known);
  EXPECT_EQ(a.step.straggler.since_step, b.step.straggler.since_step);
  EXPECT_EQ(a.step.label, b.step.label);
  EXPECT_EQ(a.step.note, b.step.note);
}

// A pipeline job with a slow worker from step 30, checkpointed every 13 batches (mid-step: the
// what-if then holds ops of steps still waiting for ranks), is restored from the checkpoint
// after batch `crash_after` (one batch per rank and step: 16 a step), and both go on.
struct CrashedPipeline {
  JobSnapshot reference_at_crash, restored_at_crash, reference, restored, restored_without;
  FakeStore store;
};

CrashedPipeline RunPipelineCrashingAfter(size_t crash_after, uint64_t steps = 160) {
  const std::vector<v1::Batch> batches =
      PipelineBatches(steps, {"slow-worker:dp=1,pp=2,factor=1.3:30"});
  JobPipelineOptions options;
  options.record_changes = true;
  JobPipeline reference("pipe", 16, options);
  CrashedPipeline out;
  const TimePoint t0{};
  const int64_t wall0 = 1'795'000'000'000'000'000;
  size_t i = 0;
  for (; i < batches.size(); ++i) {
    reference.AddBatch(batches[i], t0);
    if (i % 13 == 12) {
      out.store.Apply(reference.TakeCheckpoint(t0, wall0));
      if (i >= crash_after) break;
    }
    if (i % 16 == 15) (void)reference.Snapshot(t0);  // the daemon evaluates as steps align
  }
  ++i;
  auto restored = JobPipeline::Restore(out.store.meta, out.store.Steps(), options, t0, wall0,
                                       out.store.WhatIfSteps());
  EXPECT_TRUE(restored.ok()) << restored.status();
  // The same state as written before the what-if was checkpointed.
  state::v1::JobMeta old_meta = out.store.meta;
  old_meta.clear_whatif();
  auto without = JobPipeline::Restore(old_meta, out.store.Steps(), options, t0, wall0);
  EXPECT_TRUE(without.ok()) << without.status();
  if (!restored.ok() || !without.ok()) return out;
  out.reference_at_crash = reference.Snapshot(t0);
  out.restored_at_crash = (*restored)->Snapshot(t0);
  for (; i < batches.size(); ++i) {
    reference.AddBatch(batches[i], t0);
    (*restored)->AddBatch(batches[i], t0);
    (*without)->AddBatch(batches[i], t0);
    if (i % 16 == 15) {
      (void)reference.Snapshot(t0);
      (void)(*restored)->Snapshot(t0);
      (void)(*without)->Snapshot(t0);
    }
  }
  out.reference = reference.Snapshot(t0);
  out.restored = (*restored)->Snapshot(t0);
  out.restored_without = (*without)->Snapshot(t0);
  return out;
}

TEST(JobCheckpointTest, APipelineJobsWhatIfContinuesExactlyAfterARestore) {
  // Crashed around step 120: the slow worker began at step 30, before the what-if's 64-step
  // window, and steps were half-reported at the last checkpoint.
  const CrashedPipeline j = RunPipelineCrashingAfter(120 * 16);
  EXPECT_GT(j.store.meta.whatif().pending_size(), 0) << "the crash should leave ops pending";
  EXPECT_LE(j.store.whatif.size(), 64u);  // only the what-if's window is kept
  const whatif::WhatIfSnapshot& w = *j.reference.whatif;
  EXPECT_EQ(w.verdict.verdict, whatif::Verdict::kSlowWorker) << w.verdict.note;
  EXPECT_EQ((std::pair{w.verdict.data_rank, w.verdict.stage}), (std::pair{1, 2}));
  EXPECT_EQ(w.analysed_steps, 160u);
  EXPECT_EQ(w.skipped_steps, 0u) << w.last_error;
  // The onset (step 30) left the window long ago; it is held, and restored.
  EXPECT_EQ(w.result.first_step, 96u);
  EXPECT_EQ(w.since_step, 30u);
  EXPECT_TRUE(w.onset_known);
  EXPECT_EQ(j.reference.step.label, StepLabel::kStraggler);
  EXPECT_TRUE(j.reference.step.straggler.present);
  EXPECT_EQ(j.reference.step.straggler.since_step, 30u);
  EXPECT_NE(j.reference.step.note.find("; since step 30"), std::string::npos)
      << j.reference.step.note;
  ExpectSameWhatIf(j.reference_at_crash, j.restored_at_crash);
  ExpectSameWhatIf(j.reference, j.restored);
  // Without the what-if's state it starts again: fewer steps analysed, a step skipped (its
  // first ranks' ops were in the checkpoint), the onset unknown.
  const whatif::WhatIfSnapshot& v = *j.restored_without.whatif;
  EXPECT_LT(v.analysed_steps, w.analysed_steps);
  EXPECT_NE(v.since_step, 30u);
}

TEST(JobCheckpointTest, APipelineJobsStateWithADamagedOrNoCacheRestoresItsWindow) {
  const CrashedPipeline j = RunPipelineCrashingAfter(120 * 16, 121);
  ASSERT_GT(j.store.meta.whatif().cache_size(), 0);
  JobPipelineOptions options;
  options.record_changes = true;
  state::v1::JobMeta damaged = j.store.meta;
  damaged.mutable_whatif()->mutable_cache(3)->mutable_dp_t()->RemoveLast();
  state::v1::JobMeta none = j.store.meta;
  none.mutable_whatif()->clear_cache();
  for (const state::v1::JobMeta& meta : {damaged, none}) {
    auto restored =
        JobPipeline::Restore(meta, j.store.Steps(), options, TimePoint{}, 0, j.store.WhatIfSteps());
    ASSERT_TRUE(restored.ok()) << restored.status();
    const JobSnapshot s = (*restored)->Snapshot(TimePoint{});
    ASSERT_NE(s.whatif, nullptr);
    // The decompositions recomputed: S as the original's, the rest within the 1 % tolerance.
    EXPECT_DOUBLE_EQ(s.whatif->result.slowdown, j.restored_at_crash.whatif->result.slowdown);
    EXPECT_EQ(s.whatif->verdict.verdict, whatif::Verdict::kSlowWorker);
  }
}

TEST(JobCheckpointTest, APipelineJobRestoredWhileItsOnsetIsInTheWindow) {
  // Crashed around step 60: the onset is in the window; restored, the window still shows it.
  const CrashedPipeline j = RunPipelineCrashingAfter(60 * 16, 120);
  ExpectSameWhatIf(j.reference_at_crash, j.restored_at_crash);
  ExpectSameWhatIf(j.reference, j.restored);
  EXPECT_EQ(j.reference.whatif->since_step, 30u);
}

TEST(JobCheckpointTest, APipelineJobRestoredWhileANewFindingWaitsOutItsHold) {
  // Crashed around step 54: the slow worker (from step 30; S passes 1.05 at step 47) is judged,
  // but the balanced verdict is still shown while the new finding waits out its 16 analysed
  // steps (VerdictHold, until step 63). The restored job shows the same, and switches too.
  const CrashedPipeline j = RunPipelineCrashingAfter(54 * 16, 120);
  const state::v1::VerdictHoldState& hold = j.store.meta.whatif().hold();
  ASSERT_TRUE(hold.has_held());
  EXPECT_EQ(hold.held().verdict(), static_cast<uint32_t>(whatif::Verdict::kBalanced));
  EXPECT_EQ(hold.candidate().verdict(), static_cast<uint32_t>(whatif::Verdict::kSlowWorker));
  EXPECT_GT(hold.candidate_since(), 30u);
  ExpectSameWhatIf(j.reference_at_crash, j.restored_at_crash);
  EXPECT_EQ(j.reference_at_crash.whatif->verdict.note, j.restored_at_crash.whatif->verdict.note);
  ExpectSameWhatIf(j.reference, j.restored);
  EXPECT_EQ(j.reference.whatif->verdict.verdict, whatif::Verdict::kSlowWorker);
}

TEST(JobCheckpointTest, APipelineJobsCheckpointsStoreItsOpsOnce) {
  // What the what-if adds to the checkpoints: each analysed step's ops once (about 7 bytes an
  // op), the ops of steps still pending in the metadata.
  const CrashedPipeline j = RunPipelineCrashingAfter(SIZE_MAX, 160);
  size_t ops = 0, bytes = 0;
  for (const auto& [step, s] : j.store.whatif) {
    ops += s.kind().size();
    bytes += s.ByteSizeLong();
  }
  ASSERT_GT(ops, 0u);
  const double per_op = static_cast<double>(bytes) / static_cast<double>(ops);
  std::printf("what-if ops stored: %zu steps, %.1f bytes an op, %zu bytes a step\n",
              j.store.whatif.size(), per_op, bytes / j.store.whatif.size());
  EXPECT_LT(per_op, 10.0);
}

TEST(JobCheckpointTest, AFlatStragglersOnsetIsHeldAfterItLeftTheWindowAndRestored) {
  // Rank 3 slow from step 60; the 100-step window has long lost it by step 240. The daemon
  // evaluates as steps align (a snapshot every 8 batches here).
  const std::vector<v1::Batch> batches = FleetBatches(8, 240, 5);
  JobPipelineOptions options;
  options.record_changes = true;
  JobPipeline reference("ckpt", 8, options);
  FakeStore store;
  const TimePoint t0{};
  const int64_t wall0 = 1'795'000'000'000'000'000;
  size_t resume_at = 0;  // after the checkpoint of batch 296 (batches of 5 steps: step ~185)
  for (size_t i = 0; i < batches.size(); ++i) {
    reference.AddBatch(batches[i], t0);
    if (i % 8 == 7) (void)reference.Snapshot(t0);
    if (i % 11 == 10 && i <= 300) {
      store.Apply(reference.TakeCheckpoint(t0, wall0));
      resume_at = i + 1;
    }
  }
  const JobSnapshot a = reference.Snapshot(t0);
  ASSERT_EQ(a.step.label, StepLabel::kComputeStraggler) << a.step.note;
  EXPECT_EQ(a.window_first_step, 140u);
  EXPECT_EQ(a.step.straggler.since_step, 60u) << a.step.note;
  EXPECT_TRUE(a.step.straggler.onset_in_window);
  EXPECT_NE(a.step.note.find("since step 60"), std::string::npos) << a.step.note;
  EXPECT_EQ(store.meta.straggler_onset().culprit(), "rank:3");
  // How often the job was evaluated does not matter: one never evaluated before says the same.
  JobPipeline quiet("ckpt", 8, options);
  for (const v1::Batch& b : batches) quiet.AddBatch(b, t0);
  EXPECT_EQ(quiet.Snapshot(t0).step.straggler.since_step, 60u);

  auto restored = JobPipeline::Restore(store.meta, store.Steps(), options, t0, wall0);
  ASSERT_TRUE(restored.ok()) << restored.status();
  state::v1::JobMeta old_meta = store.meta;
  old_meta.clear_straggler_onset();
  auto without = JobPipeline::Restore(old_meta, store.Steps(), options, t0, wall0);
  ASSERT_TRUE(without.ok()) << without.status();
  for (size_t i = resume_at; i < batches.size(); ++i) {
    for (JobPipeline* p : {restored->get(), without->get()}) {
      p->AddBatch(batches[i], t0);
      if (i % 8 == 7) (void)p->Snapshot(t0);
    }
  }
  ExpectSameSnapshot(a, (*restored)->Snapshot(t0));
  EXPECT_EQ((*restored)->Snapshot(t0).step.straggler.since_step, 60u);
  // Without the held onset, the restored window no longer shows it.
  const JobSnapshot b = (*without)->Snapshot(t0);
  EXPECT_NE(b.step.straggler.since_step, 60u);
}

TEST(JobCheckpointTest, DamagedMetadataIsDataLoss) {
  state::v1::JobMeta meta;
  meta.set_training_job("x");
  meta.set_world_size(4);  // but no rank nodes and no aligner
  auto r = JobPipeline::Restore(meta, {}, {}, TimePoint{}, 0);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace rankwatch
