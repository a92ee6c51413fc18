#include "operators/job_pipeline.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "operators/step_codec.h"

namespace rankwatch {

namespace {

// Index of a record's clock in JobSnapshot::step_records_by_clock: host (also a clock this
// daemon does not know), device, device_missing.
size_t ClockIndex(v1::StepClock clock) {
  switch (clock) {
    case v1::STEP_CLOCK_DEVICE: return 1;
    case v1::STEP_CLOCK_DEVICE_MISSING: return 2;
    default: return 0;
  }
}

}  // namespace

JobPipeline::JobPipeline(std::string training_job, uint32_t world_size, JobPipelineOptions options)
    : training_job_(std::move(training_job)), options_(options) {
  Reset(world_size);
}

void JobPipeline::Reset(uint32_t world_size) {
  aligner_ = std::make_unique<StepAligner>(world_size, options_.align);
  window_ = std::make_unique<StepWindow>(world_size, options_.window);
  memory_window_ = std::make_unique<MemoryWindow>(world_size, options_.memory_window);
  memory_trend_ = std::make_unique<MemoryTrend>(options_.memory_trend, world_size);
  whatif_ = std::make_unique<whatif::StepAssembler>(options_.whatif);
  straggler_onset_ = {};
  // An elastic restart keeps the job's lost-time totals, not its per-rank costs.
  auto lost = std::make_unique<LostTime>(world_size, options_.window.steps);
  if (lost_ != nullptr) {
    state::v1::LostTimeState totals = lost_->ExportState();
    totals.clear_cost_ranks();
    totals.clear_cost_rank_ns();
    lost->ImportState(totals).IgnoreError();
  }
  lost_ = std::move(lost);
  rank_nodes_ = std::make_shared<const std::vector<std::string>>(world_size);
  rank_pods_.reset();
  finished_ranks_.assign(world_size, false);
  finished_count_ = 0;
  rank_last_batch_.assign(world_size, TimePoint{});
}

void JobPipeline::NoteOnce(int kind, JobDelta* delta, std::string note) {
  if (noted_ & (1u << kind)) return;
  noted_ |= 1u << kind;
  delta->note = std::move(note);
}

bool JobPipeline::RankClaimedElsewhere(uint32_t rank, const std::string& node, TimePoint now,
                                       JobDelta* delta) {
  const std::string& owner = (*rank_nodes_)[rank];
  if (node.empty() || owner.empty() || owner == node) return false;
  if (now - rank_last_batch_[rank] >= options_.rank_takeover_after) return false;  // it moved
  ++delta->rank_conflict;
  NoteOnce(0, delta,
           fmt::format("rank {} is claimed by two nodes, '{}' and '{}': batches from '{}' are "
                       "rejected while '{}' keeps sending (two processes were given the same "
                       "rank, or two jobs share this job id)",
                       rank, owner, node, node, owner));
  return true;
}

bool JobPipeline::StaleWorldSize(uint32_t world_size, TimePoint now, JobDelta* delta) {
  const Duration since = now - world_size_changed_at_;
  const bool changed_before = previous_world_size_ != 0;
  if (changed_before &&
      (since < options_.world_size_grace ||
       (world_size == previous_world_size_ && since < 6 * options_.world_size_grace))) {
    ++delta->stale_world_size;
    NoteOnce(1, delta,
             fmt::format("batches declare world size {} while the job changed from {} to {} "
                         "{:.1f} s ago: they are rejected (ranks of two incarnations of the job "
                         "are sending, or two jobs share this job id)",
                         world_size, previous_world_size_, aligner_->world_size(),
                         std::chrono::duration<double>(since).count()));
    return true;
  }
  return false;
}

void JobPipeline::NoteScheduler(uint32_t rank, const v1::SchedulerIdentity& s) {
  const std::string& pod = s.pod();
  if (!pod.empty() && (rank_pods_ == nullptr || (*rank_pods_)[rank] != pod)) {
    auto pods = rank_pods_ != nullptr ? std::make_shared<std::vector<std::string>>(*rank_pods_)
                                      : std::make_shared<std::vector<std::string>>(
                                            aligner_->world_size());  // rare: copy on write
    (*pods)[rank] = pod;
    rank_pods_ = std::move(pods);
  }
  if (s.scheduler() != scheduler_.scheduler || s.job() != scheduler_.job ||
      s.namespace_() != scheduler_.k8s_namespace || s.owner() != scheduler_.owner) {
    scheduler_ = {s.scheduler(), s.job(), s.namespace_(), s.owner()};
  }
}

JobDelta JobPipeline::AddBatch(const v1::Batch& batch, TimePoint now) {
  JobDelta delta;
  if (!seen_) {
    seen_ = true;
    last_progress_ = now;
  }
  const uint32_t world_size = batch.source().world_size();
  if (world_size != aligner_->world_size()) {
    if (StaleWorldSize(world_size, now, &delta)) return delta;
    const uint32_t old = aligner_->world_size();
    aligner_->Expire(TimePoint::max(), &closed_);  // flush what the old world size had
    Consume(now, &delta);
    Reset(world_size);
    previous_world_size_ = old;
    world_size_changed_at_ = now;
    ++delta.world_size_changed;
    NoteOnce(3, &delta,
             fmt::format("world size changed from {} to {}: alignment and windows restart (later "
                         "changes are counted in rankwatch_world_size_changes_total)",
                         old, world_size));
  }
  const uint32_t rank = batch.source().rank();
  const std::string& node = batch.source().node();
  if (RankClaimedElsewhere(rank, node, now, &delta)) return delta;
  rank_last_batch_[rank] = now;
  collector_dropped_records_ += batch.dropped_records();
  sharded_ = sharded_ || batch.source().sharded();
  if (!node.empty() && (*rank_nodes_)[rank] != node) {
    auto nodes = std::make_shared<std::vector<std::string>>(*rank_nodes_);  // rare: copy on write
    (*nodes)[rank] = node;
    rank_nodes_ = std::move(nodes);
  }
  if (batch.source().has_scheduler()) NoteScheduler(rank, batch.source().scheduler());
  const int64_t last_of_rank = aligner_->last_step_of(rank);
  for (const v1::StepRecord& record : batch.steps()) {
    if (last_of_rank >= 0 && record.step() > static_cast<uint64_t>(last_of_rank) &&
        record.step() - static_cast<uint64_t>(last_of_rank) > options_.max_step_jump) {
      ++delta.step_jump;
      NoteOnce(2, &delta,
               fmt::format("rank {} jumped from step {} to step {}: records more than {} steps "
                           "ahead of their rank are rejected (a step counter that was reset "
                           "or corrupted; a restarted job needs a new job id)",
                           rank, last_of_rank, record.step(), options_.max_step_jump));
      continue;
    }
    last_record_unix_ns_ = std::max(last_record_unix_ns_, record.end_unix_ns());
    if (batch.source().has_layout()) whatif_->Add(rank, batch.source().layout(), record);
    switch (aligner_->Add(ToStepSample(record, rank), now, &closed_)) {
      case AlignOutcome::kAccepted:
        ++delta.accepted;
        ++step_records_by_clock_[ClockIndex(record.clock())];
        break;
      case AlignOutcome::kDuplicate: ++delta.duplicate; break;
      case AlignOutcome::kLate: ++delta.late; break;
      case AlignOutcome::kRankOutOfRange: ++delta.rank_out_of_range; break;
    }
  }
  if (batch.final() && !finished_ranks_[rank]) {
    finished_ranks_[rank] = true;
    ++finished_count_;
  }
  Consume(now, &delta);
  return delta;
}

JobDelta JobPipeline::Tick(TimePoint now) {
  JobDelta delta;
  aligner_->Expire(now, &closed_);
  Consume(now, &delta);
  CountHang(now);
  return delta;
}

void JobPipeline::CountHang(TimePoint now) {
  const StepDiagnosisOptions& o = options_.diagnosis;
  if (!seen_ || window_->size() < o.min_steps || finished_count_ == aligner_->world_size()) return;
  const double since = std::chrono::duration<double>(now - HangClockStart()).count();
  const double timeout = std::max(o.hang_timeout_steps * lost_->last_median_step_seconds(),
                                  std::chrono::duration<double>(o.hang_timeout_min).count());
  if (since <= timeout) return;
  lost_->AddHang(since - hang_counted_seconds_, aligner_->world_size());
  hang_counted_seconds_ = since;
}

void JobPipeline::NoteEvidenceBusy(const std::vector<uint32_t>& ranks, TimePoint now) {
  const uint32_t world = aligner_->world_size();
  if (ranks.empty() || world == 0 || finished_count_ == world) return;
  int64_t lowest = INT64_MAX;
  for (uint32_t r = 0; r < world; ++r) lowest = std::min(lowest, aligner_->last_step_of(r));
  for (uint32_t r : ranks) {
    if (r < world && aligner_->last_step_of(r) == lowest) {
      evidence_busy_at_ = std::max(evidence_busy_at_, now);
      hang_counted_seconds_ = 0;  // what was counted stays counted; the clock starts again
      return;
    }
  }
}

void JobPipeline::Consume(TimePoint now, JobDelta* delta) {
  bool ends_hang = false;
  if (!closed_.empty()) {
    CountHang(now);  // up to the step that ends the hang
    ends_hang = hang_counted_seconds_ > 0;
    last_progress_ = now;
    hang_counted_seconds_ = 0;
  }
  for (AlignedStep& step : closed_) {
    window_->Add(step);
    lost_->AddStep(window_->steps().back(), BlockedModelOf(*window_, options_.diagnosis, sharded_),
                   ends_hang);
    ends_hang = false;
    if (const MemoryWindow::Step* m = memory_window_->Add(step)) {
      memory_trend_->Add(*m, memory_window_.get());
    }
    if (options_.record_changes) {
      state::v1::WhatIfStepOps stored;
      if (whatif_->Aligned(step.step, &stored)) {
        stored.set_world_size(aligner_->world_size());
        unsaved_whatif_steps_.push_back(std::move(stored));
      }
    } else {
      whatif_->Aligned(step.step);
    }
    ++aligned_steps_;
    ++delta->aligned;
    if (step.timed_out) {
      ++timed_out_steps_;
      ++delta->aligned_timed_out;
    }
    // A pipeline job's straggler is the what-if's, with an onset of its own.
    const uint32_t every =
        options_.onset_check_steps > 0
            ? options_.onset_check_steps
            : static_cast<uint32_t>(std::max<size_t>(1, options_.window.steps / 10));
    if (aligned_steps_ % every == 0 && !whatif_->active()) CheckOnset();
    // Encoded when a checkpoint takes it: most steps of a fast job leave the windows first.
    if (options_.record_changes) unsaved_steps_.push_back(std::move(step));
  }
  if (!closed_.empty()) whatif_->Evaluate();
  if (options_.record_changes && !closed_.empty()) {
    const uint64_t keep = KeepFromStep();
    while (!unsaved_steps_.empty() && unsaved_steps_.front().step < keep) {
      unsaved_steps_.pop_front();
    }
    const uint64_t whatif_keep = whatif_->window_first_step();
    while (!unsaved_whatif_steps_.empty() && unsaved_whatif_steps_.front().step() < whatif_keep) {
      unsaved_whatif_steps_.pop_front();
    }
  }
  closed_.clear();
}

uint64_t JobPipeline::KeepFromStep() const {
  uint64_t keep = UINT64_MAX;
  if (!window_->empty()) keep = std::min(keep, window_->first_step());
  if (!memory_window_->steps().empty()) keep = std::min(keep, memory_window_->steps().front().step);
  return keep == UINT64_MAX ? 0 : keep;
}

void JobPipeline::CheckOnset() {
  if (window_->size() < options_.diagnosis.min_steps) return;
  HangInput hang;  // a step just aligned: no hang
  (void)DiagnoseStepTime(*window_, *rank_nodes_, hang, options_.diagnosis, sharded_,
                         &straggler_onset_);
}

namespace {

// A pipeline job's straggler verdict is the what-if's: the flat diagnosis compares ranks that do
// different work (the last stage's ranks have the most own time in a balanced 1F1B step), so
// its straggler labels are replaced by what the what-if says — balanced, or a straggler whose
// culprit, note and next step are the what-if verdict's.
void SupersedeStraggler(const whatif::WhatIfSnapshot& w, StepDiagnosis* d) {
  const whatif::WhatIfVerdict& v = w.verdict;
  const bool straggler = d->label == StepLabel::kStraggler ||
                         d->label == StepLabel::kInputStraggler ||
                         d->label == StepLabel::kComputeStraggler;
  if (v.verdict == whatif::Verdict::kNone) return;
  const bool finding = whatif::IsFinding(v);
  if (!straggler && !finding) return;
  if (straggler && !finding) {
    d->label = StepLabel::kBalanced;
    d->severity = Severity::kInfo;
  } else if (finding) {
    // A finding of the what-if is a straggler even where the flat scores saw none (a long
    // stage, a moving slow replica); input-bound and the other labels give way to it.
    if (d->label == StepLabel::kHang) return;
    d->label = StepLabel::kStraggler;
    d->severity = v.severity;
  }
  d->cause = StragglerCause::kNone;
  d->straggler = StragglerTest{};  // the flat test's evidence is not the what-if's
  d->scope = v.ranks.empty() ? CulpritScope::kNone : CulpritScope::kRank;
  d->culprit_ranks = v.ranks;
  d->culprit_node.clear();
  d->culprit_phase = Phase::kStep;
  d->note = "pipeline job, what-if " + std::string(whatif::VerdictName(v.verdict)) + ": " + v.note;
  d->next_step = v.next_step;
  if (!finding || w.result.steps == 0) {
    NoteTiming(d);
    return;
  }
  // The finding's evidence as a straggler's: what a step loses to it over the what-if's window,
  // and since when (the what-if's held onset).
  StragglerTest& t = d->straggler;
  t.present = true;
  t.rank = v.ranks.empty() ? 0 : v.ranks.front();
  t.steps = w.result.steps;
  t.excess_seconds = std::max(0.0, w.result.actual_us - w.result.ideal_us) * 1e-6;
  t.lost_rank_seconds_per_step = v.lost_rank_seconds / static_cast<double>(w.result.steps);
  t.since_step = w.since_step;
  t.onset_in_window = w.onset_known;
  d->note += w.onset_known ? fmt::format("; since step {}", w.since_step)
                           : fmt::format("; since step {} or earlier", w.since_step);
  NoteTiming(d);
}

}  // namespace

const std::string& JobSnapshot::NodeOf(uint32_t rank) const {
  static const std::string kUnknown;
  return rank_nodes && rank < rank_nodes->size() ? (*rank_nodes)[rank] : kUnknown;
}

const std::string& JobSnapshot::PodOf(uint32_t rank) const {
  static const std::string kUnknown;
  return rank_pods && rank < rank_pods->size() ? (*rank_pods)[rank] : kUnknown;
}

JobSnapshot JobPipeline::Snapshot(TimePoint now) const {
  JobSnapshot s;
  s.training_job = training_job_;
  s.world_size = aligner_->world_size();
  s.ranks_seen = aligner_->ranks_seen();
  s.aligned_steps = aligned_steps_;
  s.timed_out_steps = timed_out_steps_;
  s.last_record_unix_ns = last_record_unix_ns_;
  if (!window_->empty()) {
    s.has_window = true;
    s.window_first_step = window_->first_step();
    s.window_last_step = window_->last_step();
    s.window_steps = static_cast<uint32_t>(window_->size());
    s.last_ranks_present = window_->last_ranks_present();
  }
  s.finished = finished_count_ == s.world_size;
  HangInput hang;
  // A job whose every rank ended cleanly is done, not hung.
  hang.seconds_since_last_aligned =
      s.finished ? 0 : std::chrono::duration<double>(now - HangClockStart()).count();
  hang.last_step_by_rank.resize(s.world_size);
  for (uint32_t r = 0; r < s.world_size; ++r) hang.last_step_by_rank[r] = aligner_->last_step_of(r);
  // The held onset as of the last check, applied to this window without changing it.
  step_time::OnsetHold onset = straggler_onset_;
  s.step = DiagnoseStepTime(*window_, *rank_nodes_, hang, options_.diagnosis, sharded_, &onset);
  s.lost = lost_->Summary();
  s.input_lost_messages = input_lost_messages_;
  s.collector_dropped_records = collector_dropped_records_;
  s.step_records_by_clock = step_records_by_clock_;
  for (int p = 0; p < kPhaseCount; ++p) s.phases[p] = s.step.phases[p].stat;
  s.memory = DiagnoseMemory(*memory_window_, memory_trend_.get(), options_.memory);
  s.rank_nodes = rank_nodes_;
  s.rank_pods = rank_pods_;
  s.scheduler = scheduler_;
  s.whatif = whatif_->snapshot();
  if (s.whatif != nullptr) SupersedeStraggler(*s.whatif, &s.step);
  s.rank_totals = std::make_shared<const std::vector<StepWindow::RankTotals>>(window_->totals());
  s.rank_peak_allocated = std::make_shared<const std::vector<double>>(
      memory_window_->rank_peaks(MemoryKind::kAllocated));
  s.rank_peak_reserved = std::make_shared<const std::vector<double>>(
      memory_window_->rank_peaks(MemoryKind::kReserved));
  if (memory_trend_->steps() > 0) {
    auto points = std::make_shared<std::vector<MemoryTrend::Point>>();
    memory_trend_->Points(s.memory.kind, points.get());
    s.memory_trend_points = std::move(points);
  }
  return s;
}

JobCheckpoint JobPipeline::TakeCheckpoint(TimePoint now, int64_t wall_now_unix_ns) {
  JobCheckpoint c;
  state::v1::JobMeta& m = c.meta;
  m.set_training_job(training_job_);
  m.set_world_size(aligner_->world_size());
  m.set_aligned_steps(aligned_steps_);
  m.set_timed_out_steps(timed_out_steps_);
  m.set_last_record_unix_ns(last_record_unix_ns_);
  m.set_last_progress_unix_ns(wall_now_unix_ns - (now - last_progress_).count());
  m.set_checkpoint_unix_ns(wall_now_unix_ns);
  for (const std::string& node : *rank_nodes_) m.add_rank_nodes(node);
  if (rank_pods_ != nullptr) {
    for (const std::string& pod : *rank_pods_) m.add_rank_pods(pod);
  }
  if (!scheduler_.empty()) {
    state::v1::JobSchedulerState* js = m.mutable_scheduler();
    js->set_scheduler(scheduler_.scheduler);
    js->set_job(scheduler_.job);
    js->set_namespace_(scheduler_.k8s_namespace);
    js->set_owner(scheduler_.owner);
  }
  for (uint32_t r = 0; r < finished_ranks_.size(); ++r) {
    if (finished_ranks_[r]) m.add_finished_ranks(r);
  }
  *m.mutable_aligner() = aligner_->ExportState(now, wall_now_unix_ns);
  *m.mutable_memory_trend() = memory_trend_->ExportState();
  *m.mutable_lost_time() = lost_->ExportState();
  m.set_sharded(sharded_);
  m.set_hang_counted_ns(std::llround(hang_counted_seconds_ * 1e9));
  m.set_input_lost_messages(input_lost_messages_);
  m.set_collector_dropped_records(collector_dropped_records_);
  if (step_records_by_clock_ != std::array<uint64_t, 3>{}) {
    state::v1::StepRecordsByClock* c = m.mutable_step_records();
    c->set_host(step_records_by_clock_[0]);
    c->set_device(step_records_by_clock_[1]);
    c->set_device_missing(step_records_by_clock_[2]);
  }
  if (whatif_->active()) whatif_->ExportState(m.mutable_whatif());
  if (!straggler_onset_.culprit().empty()) straggler_onset_.Export(m.mutable_straggler_onset());
  c.new_steps.reserve(unsaved_steps_.size());
  for (const AlignedStep& step : unsaved_steps_) c.new_steps.push_back(EncodeStep(step));
  unsaved_steps_.clear();
  c.new_whatif_steps.assign(std::make_move_iterator(unsaved_whatif_steps_.begin()),
                            std::make_move_iterator(unsaved_whatif_steps_.end()));
  unsaved_whatif_steps_.clear();
  c.whatif_keep_from_step = whatif_->window_first_step();
  // Stored steps before the oldest step either window still holds are no longer needed.
  c.keep_from_step = KeepFromStep();
  return c;
}

absl::StatusOr<std::unique_ptr<JobPipeline>> JobPipeline::Restore(
    const state::v1::JobMeta& m, const std::vector<state::v1::StoredStep>& steps,
    JobPipelineOptions options, TimePoint now, int64_t wall_now_unix_ns,
    const std::vector<state::v1::WhatIfStepOps>& whatif_steps) {
  if (m.world_size() == 0 || m.rank_nodes_size() != static_cast<int>(m.world_size())) {
    return absl::DataLossError("stored job '" + m.training_job() + "' is inconsistent");
  }
  auto p = std::make_unique<JobPipeline>(m.training_job(), m.world_size(), options);
  // The job's clocks resume where the checkpoint left them: `now` stands for the moment it was
  // taken, so a daemon's downtime (or a partition's move) does not age its pending steps.
  if (m.checkpoint_unix_ns() != 0) wall_now_unix_ns = m.checkpoint_unix_ns();
  auto aligner = StepAligner::FromState(m.aligner(), options.align, now, wall_now_unix_ns);
  if (!aligner.ok()) return aligner.status();
  p->aligner_ = std::move(*aligner);
  p->aligned_steps_ = m.aligned_steps();
  p->timed_out_steps_ = m.timed_out_steps();
  p->last_record_unix_ns_ = m.last_record_unix_ns();
  p->seen_ = true;
  p->last_progress_ = now - Duration(wall_now_unix_ns - m.last_progress_unix_ns());
  p->rank_nodes_ = std::make_shared<const std::vector<std::string>>(m.rank_nodes().begin(),
                                                                    m.rank_nodes().end());
  // Pods and the scheduler came later: state written before has none.
  if (m.rank_pods_size() == static_cast<int>(m.world_size())) {
    p->rank_pods_ = std::make_shared<const std::vector<std::string>>(m.rank_pods().begin(),
                                                                     m.rank_pods().end());
  }
  if (m.has_scheduler()) {
    p->scheduler_ = {m.scheduler().scheduler(), m.scheduler().job(), m.scheduler().namespace_(),
                     m.scheduler().owner()};
  }
  for (uint32_t r : m.finished_ranks()) {
    if (r >= m.world_size()) return absl::DataLossError("stored finished rank out of range");
    if (!p->finished_ranks_[r]) ++p->finished_count_;
    p->finished_ranks_[r] = true;
  }
  // The lifetime memory trend as checkpointed; state written before it existed has none: then
  // it starts from the stored steps.
  const bool has_trend = m.has_memory_trend();
  if (has_trend) {
    auto trend = MemoryTrend::FromState(m.memory_trend(), options.memory_trend, m.world_size());
    if (!trend.ok()) return trend.status();
    p->memory_trend_ = std::make_unique<MemoryTrend>(std::move(*trend));
  }
  p->sharded_ = m.sharded();
  p->input_lost_messages_ = m.input_lost_messages();
  p->collector_dropped_records_ = m.collector_dropped_records();
  p->step_records_by_clock_ = {m.step_records().host(), m.step_records().device(),
                               m.step_records().device_missing()};
  p->hang_counted_seconds_ = static_cast<double>(std::max<int64_t>(0, m.hang_counted_ns())) * 1e-9;
  if (absl::Status s = p->lost_->ImportState(m.lost_time()); !s.ok()) return s;
  AlignedStep step;
  for (const state::v1::StoredStep& stored : steps) {
    if (absl::Status s = DecodeStep(stored, &step); !s.ok()) return s;
    if (step.world_size != m.world_size()) continue;  // from before an elastic restart
    p->window_->Add(step);
    const MemoryWindow::Step* memory = p->memory_window_->Add(step);
    // Steps the checkpointed trend holds already are not added twice.
    if (memory != nullptr && (!has_trend || p->memory_trend_->steps() == 0 ||
                              memory->step > p->memory_trend_->last_step())) {
      p->memory_trend_->Add(*memory, p->memory_window_.get());
    }
  }
  // The window part of the lost time, from the restored window (its totals are stored).
  const BlockedModel model = BlockedModelOf(*p->window_, options.diagnosis, p->sharded_);
  for (const StepWindow::Step& s : p->window_->steps()) p->lost_->AddWindowOnly(s, model);
  // The what-if's window from its stored steps, and the onsets held; state written before they
  // were checkpointed has none: the what-if then starts again from new steps.
  if (m.has_whatif()) {
    if (absl::Status s = p->whatif_->Restore(m.whatif(), whatif_steps, m.world_size()); !s.ok()) {
      return s;
    }
  }
  if (m.has_straggler_onset()) p->straggler_onset_.Import(m.straggler_onset());
  return p;
}

}  // namespace rankwatch
