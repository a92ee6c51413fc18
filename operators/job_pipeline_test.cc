#include "operators/job_pipeline.h"

#include <gtest/gtest.h>

namespace rankwatch {
namespace {

using namespace std::chrono_literals;

v1::Batch MakeBatch(const std::string& job, uint32_t rank, uint32_t world, uint64_t first,
                    uint64_t count, double forward_ms = 30) {
  v1::Batch b;
  b.set_schema_version(1);
  b.mutable_source()->set_training_job(job);
  b.mutable_source()->set_rank(rank);
  b.mutable_source()->set_world_size(world);
  for (uint64_t s = first; s < first + count; ++s) {
    v1::StepRecord* r = b.add_steps();
    r->set_step(s);
    r->set_forward_ns(static_cast<uint64_t>(forward_ms * 1e6));
    r->set_step_time_ns(100'000'000);
    r->set_end_unix_ns(1000 + s);
  }
  return b;
}

TEST(JobPipelineTest, AlignsBatchesFromEveryRankAndSummarises) {
  JobPipeline p("j", 4, {});
  const TimePoint t0{};
  JobDelta total;
  for (uint32_t r = 0; r < 4; ++r) {
    JobDelta d = p.AddBatch(MakeBatch("j", r, 4, 0, 10, r == 3 ? 60 : 30), t0);
    total.accepted += d.accepted;
    total.aligned += d.aligned;
  }
  EXPECT_EQ(total.accepted, 40u);
  EXPECT_EQ(total.aligned, 10u);
  const JobSnapshot s = p.Snapshot(t0);
  EXPECT_EQ(s.aligned_steps, 10u);
  EXPECT_EQ(s.ranks_seen, 4u);
  EXPECT_EQ(s.window_last_step, 9u);
  EXPECT_EQ(s.last_record_unix_ns, 1009);
  const PhaseStat& fwd = s.phases[static_cast<int>(Phase::kForward)];
  EXPECT_NEAR(fwd.median_seconds, 0.030, 1e-9);
  EXPECT_NEAR(fwd.worst_seconds, 0.060, 1e-9);
  EXPECT_EQ(fwd.worst_rank, 3u);
  // wait = 100 ms step - forward
  EXPECT_NEAR(s.phases[static_cast<int>(Phase::kWait)].median_seconds, 0.070, 1e-9);
}

TEST(JobPipelineTest, TickClosesTimedOutSteps) {
  JobPipelineOptions o;
  o.align.align_timeout = std::chrono::seconds(1);
  JobPipeline p("j", 2, o);
  const TimePoint t0{};
  p.AddBatch(MakeBatch("j", 0, 2, 0, 3), t0);
  EXPECT_EQ(p.Tick(t0 + std::chrono::milliseconds(500)).aligned, 0u);
  JobDelta d = p.Tick(t0 + std::chrono::seconds(2));
  EXPECT_EQ(d.aligned, 3u);
  EXPECT_EQ(d.aligned_timed_out, 3u);
  EXPECT_EQ(p.Snapshot(t0).last_ranks_present, 1u);
}

TEST(JobPipelineTest, SilenceIsAHangUnlessEveryRankEndedCleanly) {
  JobPipeline p("j", 2, {});
  const TimePoint t0{};
  p.AddBatch(MakeBatch("j", 0, 2, 0, 20), t0);
  v1::Batch last = MakeBatch("j", 1, 2, 0, 20);
  p.AddBatch(last, t0);
  const TimePoint later = t0 + std::chrono::seconds(60);
  EXPECT_EQ(p.Snapshot(later).step.label, StepLabel::kHang);
  v1::Batch bye0 = MakeBatch("j", 0, 2, 20, 0);
  bye0.set_final(true);
  p.AddBatch(bye0, t0);
  EXPECT_EQ(p.Snapshot(later).step.label, StepLabel::kHang);  // rank 1 has not said goodbye
  v1::Batch bye1 = MakeBatch("j", 1, 2, 20, 0);
  bye1.set_final(true);
  p.AddBatch(bye1, t0);
  const JobSnapshot s = p.Snapshot(later);
  EXPECT_TRUE(s.finished);
  EXPECT_NE(s.step.label, StepLabel::kHang);
}

TEST(JobPipelineTest, RanksServingEvidenceAreNotHung) {
  // Ranks 2 and 3 serve a capture and their telemetry stops at step 19 while ranks 0 and 1 go
  // on to step 24: the hang clock waits for the capture, then runs from when it let go.
  JobPipeline p("j", 4, {});
  const TimePoint t0{};
  for (uint32_t r = 0; r < 4; ++r) p.AddBatch(MakeBatch("j", r, 4, 0, r < 2 ? 25 : 20), t0);
  for (int s = 10; s <= 50; s += 10) {
    p.Tick(t0 + std::chrono::seconds(s));
    p.NoteEvidenceBusy({3, 2}, t0 + std::chrono::seconds(s));
  }
  EXPECT_NE(p.Snapshot(t0 + 50s).step.label, StepLabel::kHang);
  p.Tick(t0 + 70s);
  EXPECT_NE(p.Snapshot(t0 + 70s).step.label, StepLabel::kHang);  // 20 s since it let go
  EXPECT_DOUBLE_EQ(p.Snapshot(t0 + 70s).lost.total_hang_rank_seconds, 0);
  p.Tick(t0 + 90s);  // 40 s since: hung, from the end of the capture on
  const JobSnapshot hung = p.Snapshot(t0 + 90s);
  EXPECT_EQ(hung.step.label, StepLabel::kHang) << hung.step.note;
  EXPECT_EQ(hung.step.culprit_ranks, (std::vector<uint32_t>{2, 3}));
  EXPECT_DOUBLE_EQ(hung.lost.total_hang_rank_seconds, 4 * 40);
}

TEST(JobPipelineTest, EvidenceOnRanksThatAreNotBehindHoldsNoHangBack) {
  // Rank 3 is stuck at step 19; rank 0, ahead, serves a capture: rank 3 is hung all the same.
  JobPipeline p("j", 4, {});
  const TimePoint t0{};
  for (uint32_t r = 0; r < 4; ++r) p.AddBatch(MakeBatch("j", r, 4, 0, r == 3 ? 20 : 25), t0);
  p.NoteEvidenceBusy({0}, t0 + 40s);
  const JobSnapshot s = p.Snapshot(t0 + 40s);
  EXPECT_EQ(s.step.label, StepLabel::kHang);
  EXPECT_EQ(s.step.culprit_ranks, (std::vector<uint32_t>{3}));
}

TEST(JobPipelineTest, RecordsTheCollectorsDroppedAreSummedAndSurviveARestore) {
  JobPipelineOptions o;
  o.record_changes = true;
  JobPipeline p("j", 2, o);
  const TimePoint t0{};
  v1::Batch a = MakeBatch("j", 0, 2, 0, 5), b = MakeBatch("j", 1, 2, 0, 5);
  a.set_dropped_records(3);
  b.set_dropped_records(4);
  p.AddBatch(a, t0);
  p.AddBatch(b, t0);
  EXPECT_EQ(p.Snapshot(t0).collector_dropped_records, 7u);
  JobCheckpoint c = p.TakeCheckpoint(t0, 1'000'000'000'000);
  auto restored = JobPipeline::Restore(c.meta, c.new_steps, o, t0, 1'000'000'000'000);
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_EQ((*restored)->Snapshot(t0).collector_dropped_records, 7u);
}

TEST(JobPipelineTest, StepRecordsAreCountedByClockAndTheCountsSurviveARestore) {
  JobPipelineOptions o;
  o.record_changes = true;
  JobPipeline p("j", 2, o);
  const TimePoint t0{};
  v1::Batch a = MakeBatch("j", 0, 2, 0, 10), b = MakeBatch("j", 1, 2, 0, 10);
  for (v1::StepRecord& r : *a.mutable_steps()) r.set_clock(v1::STEP_CLOCK_DEVICE);
  for (v1::StepRecord& r : *b.mutable_steps()) {
    r.set_clock(r.step() < 3 ? v1::STEP_CLOCK_DEVICE_MISSING : v1::STEP_CLOCK_DEVICE);
  }
  p.AddBatch(a, t0);
  p.AddBatch(b, t0);
  p.AddBatch(MakeBatch("j", 1, 2, 0, 2), t0);  // duplicates: not counted
  JobSnapshot s = p.Snapshot(t0);
  EXPECT_EQ(s.step_records_by_clock, (std::array<uint64_t, 3>{0, 17, 3}));
  EXPECT_EQ(s.step.timing.clock, TimingClock::kDevice);
  EXPECT_EQ(s.step.timing.device_steps, 17u);
  EXPECT_EQ(s.step.timing.host_steps, 3u);
  EXPECT_EQ(s.step.timing.device_missing_steps, 3u);
  JobCheckpoint c = p.TakeCheckpoint(t0, 1'000'000'000'000);
  auto restored = JobPipeline::Restore(c.meta, c.new_steps, o, t0, 1'000'000'000'000);
  ASSERT_TRUE(restored.ok()) << restored.status();
  s = (*restored)->Snapshot(t0);
  EXPECT_EQ(s.step_records_by_clock, (std::array<uint64_t, 3>{0, 17, 3}));
  // The window's clocks come back with its stored steps.
  EXPECT_EQ(s.step.timing.device_steps, 17u);
  EXPECT_EQ(s.step.timing.device_missing_steps, 3u);
  // A job of host records, and state written before the counts existed.
  JobPipeline cpu("c", 1, o);
  cpu.AddBatch(MakeBatch("c", 0, 1, 0, 4), t0);
  EXPECT_EQ(cpu.Snapshot(t0).step_records_by_clock, (std::array<uint64_t, 3>{4, 0, 0}));
  c.meta.clear_step_records();
  restored = JobPipeline::Restore(c.meta, c.new_steps, o, t0, 1'000'000'000'000);
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_EQ((*restored)->Snapshot(t0).step_records_by_clock, (std::array<uint64_t, 3>{}));
}

TEST(JobPipelineTest, AWorldSizeChangeRestartsAlignment) {
  JobPipeline p("j", 2, {});
  const TimePoint t0{};
  JobDelta d = p.AddBatch(MakeBatch("j", 0, 2, 0, 2), t0);
  EXPECT_EQ(d.aligned, 0u);
  d = p.AddBatch(MakeBatch("j", 0, 1, 5, 2), t0);  // restarted with one rank
  EXPECT_EQ(d.aligned, 4u);  // two flushed from the old size + two complete at the new size
  EXPECT_EQ(p.world_size(), 1u);
}

TEST(JobPipelineTest, AHangCostsEveryRankEverySecondUntilAStepAligns) {
  // 10 steps of 100 ms on 4 ranks, then silence: the hang timeout is max(5 x 0.1 s, 30 s).
  JobPipeline p("j", 4, {});
  const TimePoint t0{};
  for (uint32_t r = 0; r < 4; ++r) p.AddBatch(MakeBatch("j", r, 4, 0, 10), t0);
  EXPECT_NEAR(p.Snapshot(t0).lost.total_rank_seconds, 4 * 10 * 0.1, 1e-9);
  p.Tick(t0 + std::chrono::seconds(20));  // not hung yet
  EXPECT_DOUBLE_EQ(p.Snapshot(t0).lost.total_hang_rank_seconds, 0);
  p.Tick(t0 + std::chrono::seconds(40));  // hung since t0: 4 ranks x 40 s
  EXPECT_DOUBLE_EQ(p.Snapshot(t0).lost.total_hang_rank_seconds, 160);
  p.Tick(t0 + std::chrono::seconds(50));
  EXPECT_DOUBLE_EQ(p.Snapshot(t0).lost.total_hang_rank_seconds, 200);
  // Step 10 aligns at 55 s: the hang ends there; the step itself adds nothing more.
  for (uint32_t r = 0; r < 4; ++r)
    p.AddBatch(MakeBatch("j", r, 4, 10, 1), t0 + std::chrono::seconds(55));
  const LostTimeSummary l = p.Snapshot(t0 + std::chrono::seconds(56)).lost;
  EXPECT_DOUBLE_EQ(l.total_hang_rank_seconds, 220);
  EXPECT_NEAR(l.total_rank_seconds, 4.0 + 220, 1e-9);
  EXPECT_DOUBLE_EQ(l.total_straggler_rank_seconds, 0);
  p.Tick(t0 + std::chrono::seconds(60));  // progressing again
  EXPECT_DOUBLE_EQ(p.Snapshot(t0).lost.total_hang_rank_seconds, 220);
}

TEST(JobPipelineTest, LostTimeSurvivesACheckpointAndRestore) {
  JobPipelineOptions o;
  o.record_changes = true;
  JobPipeline p("j", 4, o);
  const TimePoint t0{};
  for (uint32_t r = 0; r < 4; ++r) p.AddBatch(MakeBatch("j", r, 4, 0, 10), t0);
  p.Tick(t0 + std::chrono::seconds(40));
  JobCheckpoint c = p.TakeCheckpoint(t0 + std::chrono::seconds(40), 1'000'000'000'000);
  auto restored = JobPipeline::Restore(c.meta, c.new_steps, o, t0, 1'000'000'000'000);
  ASSERT_TRUE(restored.ok()) << restored.status();
  const LostTimeSummary a = p.Snapshot(t0).lost, b = (*restored)->Snapshot(t0).lost;
  EXPECT_DOUBLE_EQ(a.total_hang_rank_seconds, b.total_hang_rank_seconds);
  EXPECT_DOUBLE_EQ(a.total_rank_seconds, b.total_rank_seconds);
  EXPECT_DOUBLE_EQ(a.window_rank_seconds, b.window_rank_seconds);
  // Still hung: both go on counting from where the checkpoint was, not from the last progress.
  // (The restored pipeline's t0 is the checkpoint's moment, t0 + 40 s of the original.)
  p.Tick(t0 + std::chrono::seconds(50));
  (*restored)->Tick(t0 + std::chrono::seconds(10));
  EXPECT_DOUBLE_EQ(p.Snapshot(t0).lost.total_hang_rank_seconds, 200);
  EXPECT_DOUBLE_EQ((*restored)->Snapshot(t0).lost.total_hang_rank_seconds, 200);
}

TEST(JobPipelineTest, KeepsEachRanksPodAndTheJobsSchedulerAcrossARestore) {
  JobPipeline p("research/trainer", 4, {});
  const TimePoint t0{};
  for (uint32_t r = 0; r < 4; ++r) {
    v1::Batch b = MakeBatch("research/trainer", r, 4, 0, 3);
    if (r != 1) {  // rank 1's collector names no pod (e.g. an older writer)
      v1::SchedulerIdentity* s = b.mutable_source()->mutable_scheduler();
      s->set_scheduler("kubernetes");
      s->set_job("trainer");
      s->set_namespace_("research");
      s->set_owner("trainer");
      s->set_pod("trainer-worker-" + std::to_string(r));
    }
    p.AddBatch(b, t0);
  }
  JobSnapshot snap = p.Snapshot(t0);
  EXPECT_EQ(snap.PodOf(0), "trainer-worker-0");
  EXPECT_EQ(snap.PodOf(1), "");
  EXPECT_EQ(snap.PodOf(3), "trainer-worker-3");
  EXPECT_EQ(snap.PodOf(9), "");
  EXPECT_EQ(snap.scheduler, (JobScheduler{"kubernetes", "trainer", "research", "trainer"}));
  JobCheckpoint c = p.TakeCheckpoint(t0, 1'000'000'000'000);
  auto restored = JobPipeline::Restore(c.meta, c.new_steps, {}, t0, 1'000'000'000'000);
  ASSERT_TRUE(restored.ok()) << restored.status();
  JobSnapshot back = (*restored)->Snapshot(t0);
  EXPECT_EQ(back.PodOf(3), "trainer-worker-3");
  EXPECT_EQ(back.scheduler, snap.scheduler);
  // A job whose collectors never named a scheduler has none, before and after a restore.
  JobPipeline plain("j", 2, {});
  for (uint32_t r = 0; r < 2; ++r) plain.AddBatch(MakeBatch("j", r, 2, 0, 3), t0);
  EXPECT_TRUE(plain.Snapshot(t0).scheduler.empty());
  EXPECT_EQ(plain.Snapshot(t0).rank_pods, nullptr);
  JobCheckpoint pc = plain.TakeCheckpoint(t0, 1'000'000'000'000);
  EXPECT_FALSE(pc.meta.has_scheduler());
  EXPECT_EQ(pc.meta.rank_pods_size(), 0);
}

v1::Batch FromNode(v1::Batch b, const std::string& node) {
  b.mutable_source()->set_node(node);
  return b;
}

TEST(JobPipelineTest, ARankClaimedByASecondNodeIsRejectedWhileItsNodeSends) {
  JobPipeline p("j", 2, {});
  const TimePoint t0{};
  EXPECT_EQ(p.AddBatch(FromNode(MakeBatch("j", 0, 2, 0, 5), "node-a"), t0).accepted, 5u);
  EXPECT_EQ(p.AddBatch(FromNode(MakeBatch("j", 1, 2, 0, 5), "node-b"), t0).aligned, 5u);
  // node-c claims rank 0 too: its batches are refused and noted once.
  JobDelta d = p.AddBatch(FromNode(MakeBatch("j", 0, 2, 5, 5), "node-c"), t0 + 1s);
  EXPECT_EQ(d.rank_conflict, 1u);
  EXPECT_EQ(d.accepted, 0u);
  EXPECT_NE(d.note.find("'node-a' and 'node-c'"), std::string::npos) << d.note;
  d = p.AddBatch(FromNode(MakeBatch("j", 0, 2, 10, 5), "node-c"), t0 + 2s);
  EXPECT_EQ(d.rank_conflict, 1u);
  EXPECT_TRUE(d.note.empty()) << "noted once per job";
  // The rightful node goes on, and the snapshot names it.
  EXPECT_EQ(p.AddBatch(FromNode(MakeBatch("j", 0, 2, 5, 5), "node-a"), t0 + 3s).accepted, 5u);
  EXPECT_EQ(p.Snapshot(t0 + 3s).NodeOf(0), "node-a");
  // After a minute of silence from node-a, the rank moves to node-c (rescheduled).
  d = p.AddBatch(FromNode(MakeBatch("j", 0, 2, 10, 5), "node-c"), t0 + 3s + 61s);
  EXPECT_EQ(d.rank_conflict, 0u);
  EXPECT_EQ(d.accepted, 5u);
  EXPECT_EQ(p.Snapshot(t0 + 65s).NodeOf(0), "node-c");
}

TEST(JobPipelineTest, WorldSizeFlappingIsRejectedAfterTheFirstChange) {
  JobPipeline p("j", 4, {});
  const TimePoint t0{};
  for (uint32_t r = 0; r < 4; ++r) p.AddBatch(MakeBatch("j", r, 4, 0, 10), t0);
  JobDelta d = p.AddBatch(MakeBatch("j", 0, 8, 100, 1), t0 + 1s);  // an elastic restart
  EXPECT_EQ(d.world_size_changed, 1u);
  EXPECT_EQ(p.world_size(), 8u);
  EXPECT_NE(d.note.find("from 4 to 8"), std::string::npos) << d.note;
  // A rank of the old incarnation is still sending, and a third size comes in: both refused.
  d = p.AddBatch(MakeBatch("j", 1, 4, 10, 1), t0 + 2s);
  EXPECT_EQ(d.stale_world_size, 1u);
  EXPECT_EQ(p.AddBatch(MakeBatch("j", 1, 16, 10, 1), t0 + 3s).stale_world_size, 1u);
  EXPECT_EQ(p.world_size(), 8u);
  // The old size stays refused for six grace periods; another size is a change after one.
  EXPECT_EQ(p.AddBatch(MakeBatch("j", 1, 4, 11, 1), t0 + 30s).stale_world_size, 1u);
  EXPECT_EQ(p.AddBatch(MakeBatch("j", 1, 16, 11, 1), t0 + 30s).world_size_changed, 1u);
  EXPECT_EQ(p.world_size(), 16u);
}

TEST(JobPipelineTest, AStepFarAheadOfItsRankIsRejected) {
  JobPipeline p("j", 2, {});
  const TimePoint t0{};
  p.AddBatch(MakeBatch("j", 0, 2, 0, 5), t0);
  p.AddBatch(MakeBatch("j", 1, 2, 0, 5), t0);
  JobDelta d = p.AddBatch(MakeBatch("j", 0, 2, 5 + (uint64_t{1} << 62) - 10, 1), t0);
  EXPECT_EQ(d.step_jump, 1u);
  EXPECT_EQ(d.accepted, 0u);
  EXPECT_NE(d.note.find("jumped from step 4"), std::string::npos) << d.note;
  // The job goes on aligning its real steps.
  p.AddBatch(MakeBatch("j", 0, 2, 5, 5), t0);
  EXPECT_EQ(p.AddBatch(MakeBatch("j", 1, 2, 5, 5), t0).aligned, 5u);
  EXPECT_EQ(p.Snapshot(t0).window_last_step, 9u);
  // Within the limit, a gap is fine (a collector that samples every k steps).
  p.AddBatch(MakeBatch("j", 0, 2, 1000, 1), t0);
  EXPECT_EQ(p.AddBatch(MakeBatch("j", 1, 2, 1000, 1), t0).aligned, 1u);
}

}  // namespace
}  // namespace rankwatch
