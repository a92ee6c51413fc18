#include "serving/diagnosis_proto.h"

#include <cmath>

namespace rankwatch {
namespace {

void FillPhase(v1::Phase phase, const SignalEvidence& e, const JobSnapshot& s,
               v1::PhaseStats* out) {
  out->set_phase(phase);
  out->set_median_seconds(e.stat.median_seconds);
  out->set_worst_seconds(e.stat.worst_seconds);
  out->set_worst_rank(e.stat.worst_rank);
  out->set_skew(e.stat.skew);
  for (const RankExcess& x : e.top) {
    v1::Offender* o = out->add_top_offenders();
    o->set_rank(x.rank);
    o->set_node(s.NodeOf(x.rank));
    o->set_pod(s.PodOf(x.rank));
    o->set_excess_seconds(x.excess_seconds);
  }
}

void FillMemoryStats(const MemoryKindEvidence& e, v1::MemoryStats* out) {
  out->set_median_peak_bytes(e.median_peak_bytes);
  out->set_worst_peak_bytes(e.worst_peak_bytes);
  out->set_worst_rank(e.worst_rank);
  out->set_skew(e.skew);
}

void FillMemory(const JobSnapshot& s, v1::MemoryDiagnosis* out) {
  const MemoryDiagnosis& m = s.memory;
  out->set_label(ToProto(m.label));
  out->set_severity(ToProto(m.severity));
  v1::Window* w = out->mutable_window();
  w->set_first_step(m.first_step);
  w->set_last_step(m.last_step);
  w->set_steps(m.window_steps);
  w->set_world_size(s.world_size);
  w->set_ranks_present(s.last_ranks_present);
  const MemoryKindEvidence& allocated = m.kinds[static_cast<int>(MemoryKind::kAllocated)];
  const MemoryKindEvidence& reserved = m.kinds[static_cast<int>(MemoryKind::kReserved)];
  if (allocated.present) FillMemoryStats(allocated, out->mutable_allocated());
  if (reserved.present) FillMemoryStats(reserved, out->mutable_reserved());
  const MemoryKindEvidence& e = m.kinds[static_cast<int>(m.kind)];
  out->set_pressure(e.pressure);
  out->set_device_capacity_bytes(m.capacity_bytes);
  out->set_creep_bytes_per_step(e.creep_bytes_per_step);
  if (e.projected_steps_to_full) out->set_projected_steps_to_full(*e.projected_steps_to_full);
  out->set_worst_growth(e.worst_growth);
  out->set_median_growth(e.median_growth);
  out->set_note(m.note);
  out->set_next_step(m.next_step);
  out->set_lifetime_trend(m.lifetime_trend);
  if (e.trend.present) {
    out->set_trend_steps(e.trend.steps);
    out->set_trend_bytes_per_step(e.trend.bytes_per_step());
    out->set_trend_steady(e.trend.steady);
  }
  if (m.creep_scope == CreepScope::kRank) out->set_creep_rank(m.creep_rank);
  out->set_creep_all_ranks(m.creep_scope == CreepScope::kJob);
  for (const RankTrendEvidence& t : e.rank_trends) {
    v1::RankMemoryTrend* o = out->add_rank_trends();
    o->set_rank(t.rank);
    o->set_node(s.NodeOf(t.rank));
    o->set_bytes_per_step(t.bytes_per_step());
    o->set_growth(t.growth);
    o->set_steady(t.steady);
    if (t.projected_steps_to_full) o->set_projected_steps_to_full(*t.projected_steps_to_full);
    o->set_steps(t.steps);
  }
  out->set_trend_ranks_followed(e.ranks_followed);
}

}  // namespace

v1::MemoryDiagnosisLabel ToProto(MemoryLabel label) {
  switch (label) {
    case MemoryLabel::kNoData: return v1::MEMORY_NO_DATA;
    case MemoryLabel::kHighPressure: return v1::MEMORY_HIGH_PRESSURE;
    case MemoryLabel::kImbalance: return v1::MEMORY_IMBALANCE;
    case MemoryLabel::kCreep: return v1::MEMORY_CREEP;
    case MemoryLabel::kCreepEarly: return v1::MEMORY_CREEP_EARLY;
    case MemoryLabel::kBalanced: return v1::MEMORY_BALANCED;
  }
  return v1::MEMORY_DIAGNOSIS_UNSPECIFIED;
}

v1::StepDiagnosisLabel ToProto(StepLabel label) {
  switch (label) {
    case StepLabel::kNoData: return v1::STEP_NO_DATA;
    case StepLabel::kHang: return v1::STEP_HANG;
    case StepLabel::kStraggler: return v1::STEP_STRAGGLER;
    case StepLabel::kInputStraggler: return v1::STEP_INPUT_STRAGGLER;
    case StepLabel::kComputeStraggler: return v1::STEP_COMPUTE_STRAGGLER;
    case StepLabel::kInputBound: return v1::STEP_INPUT_BOUND;
    case StepLabel::kWaitHeavy: return v1::STEP_WAIT_HEAVY;
    case StepLabel::kComputeBound: return v1::STEP_COMPUTE_BOUND;
    case StepLabel::kBalanced: return v1::STEP_BALANCED;
    case StepLabel::kIncompleteData: return v1::STEP_INCOMPLETE_DATA;
  }
  return v1::STEP_DIAGNOSIS_UNSPECIFIED;
}

v1::Severity ToProto(Severity s) {
  switch (s) {
    case Severity::kInfo: return v1::SEVERITY_INFO;
    case Severity::kWarn: return v1::SEVERITY_WARN;
    case Severity::kCrit: return v1::SEVERITY_CRIT;
  }
  return v1::SEVERITY_UNSPECIFIED;
}

v1::Phase ToProto(Phase p) {
  switch (p) {
    case Phase::kDataloader: return v1::PHASE_DATALOADER;
    case Phase::kForward: return v1::PHASE_FORWARD;
    case Phase::kBackward: return v1::PHASE_BACKWARD;
    case Phase::kOptimizer: return v1::PHASE_OPTIMIZER;
    case Phase::kForwardBackward: return v1::PHASE_FORWARD_BACKWARD;
    case Phase::kCollective: return v1::PHASE_COLLECTIVE;
    case Phase::kWait: return v1::PHASE_WAIT;
    case Phase::kStep: return v1::PHASE_STEP;
  }
  return v1::PHASE_UNSPECIFIED;
}

void ToProto(const JobSnapshot& s, int64_t evaluated_unix_ns, v1::Diagnosis* out) {
  out->set_training_job(s.training_job);
  out->set_evaluated_unix_ns(evaluated_unix_ns);
  out->set_aligned_steps(s.aligned_steps);
  const StepDiagnosis& d = s.step;
  v1::StepDiagnosis* step = out->mutable_step();
  step->set_label(ToProto(d.label));
  step->set_severity(ToProto(d.severity));
  v1::Window* w = step->mutable_window();
  w->set_first_step(s.window_first_step);
  w->set_last_step(s.window_last_step);
  w->set_steps(s.window_steps);
  w->set_ranks_present(s.last_ranks_present);
  w->set_world_size(s.world_size);
  for (int p = 0; p < kPhaseCount; ++p) {
    if (d.phases[p].stat.present) {
      FillPhase(ToProto(static_cast<Phase>(p)), d.phases[p], s, step->add_phases());
    }
  }
  if (d.compute.stat.present) FillPhase(v1::PHASE_COMPUTE, d.compute, s, step->add_phases());
  if (d.own.stat.present) FillPhase(v1::PHASE_OWN, d.own, s, step->add_phases());
  if (d.outside.stat.present) FillPhase(v1::PHASE_OUTSIDE, d.outside, s, step->add_phases());
  if (d.gc.time.stat.present) {
    FillPhase(v1::PHASE_GC, d.gc.time, s, step->add_phases());
    v1::GcEvidence* gc = step->mutable_gc();
    gc->set_ranks_reporting(d.gc.time.stat.ranks);
    gc->set_median_seconds(d.gc.time.stat.median_seconds);
    gc->set_median_collections(d.gc.median_collections);
    gc->set_rank(d.gc.rank);
    gc->set_seconds(d.gc.rank_seconds);
    gc->set_collections(d.gc.rank_collections);
  }
  step->mutable_shares()->set_input(d.input_share);
  step->mutable_shares()->set_wait(d.wait_share);
  step->mutable_shares()->set_compute(d.compute_share);
  step->mutable_scores()->set_input(d.input_score);
  step->mutable_scores()->set_compute(d.compute_score);
  step->mutable_scores()->set_own(d.own_score);
  step->set_cause(static_cast<v1::StragglerCause>(static_cast<int>(d.cause)));
  step->set_sharded(d.sharded);
  for (const MissingSignal& m : d.missing) {
    v1::MissingSignal* out_m = step->add_missing();
    out_m->set_phase(ToProto(m.phase));
    out_m->set_ranks_reporting(m.reporting);
    out_m->set_ranks(m.ranks);
    for (uint32_t r : m.missing_ranks) out_m->add_missing_ranks(r);
  }
  switch (d.scope) {
    case CulpritScope::kNone: break;
    case CulpritScope::kRank: step->set_scope(v1::SCOPE_RANK); break;
    case CulpritScope::kNode: step->set_scope(v1::SCOPE_NODE); break;
  }
  for (uint32_t r : d.culprit_ranks) step->add_culprit_ranks(r);
  if (s.rank_pods != nullptr) {
    for (uint32_t r : d.culprit_ranks) step->add_culprit_pods(s.PodOf(r));
  }
  step->set_culprit_node(d.culprit_node);
  if (d.scope != CulpritScope::kNone && d.label != StepLabel::kHang) {
    step->set_culprit_phase(d.cause == StragglerCause::kOutside ? v1::PHASE_OUTSIDE
                            : d.cause == StragglerCause::kGc    ? v1::PHASE_GC
                            : d.cause == StragglerCause::kNone  ? v1::PHASE_OWN
                                                                : ToProto(d.culprit_phase));
  }
  if (d.straggler.present) {
    const StragglerTest& t = d.straggler;
    v1::StragglerEvidence* e = step->mutable_straggler();
    e->set_rank(t.rank);
    e->set_excess_seconds(t.excess_seconds);
    e->set_noise_seconds(t.noise_seconds);
    e->set_z(std::isfinite(t.z) ? t.z : (t.z > 0 ? 1e9 : 0.0));
    e->set_steps(t.steps);
    e->set_lost_rank_seconds_per_step(t.lost_rank_seconds_per_step);
    e->set_since_step(t.since_step);
    e->set_onset_in_window(t.onset_in_window);
    e->set_from_statistical_test(d.from_statistical_test);
    e->set_pattern(std::string(StragglerPatternName(t.pattern)));
    e->set_period_steps(t.period_steps);
    e->set_stall_seconds(t.stall_seconds);
    e->set_stalls(t.stalls);
    e->set_drift_seconds_per_step(t.drift_seconds_per_step);
  }
  v1::TimingEvidence* timing = step->mutable_timing();
  timing->set_clock(std::string(TimingClockName(d.timing.clock)));
  timing->set_device_steps(d.timing.device_steps);
  timing->set_host_steps(d.timing.host_steps);
  timing->set_device_missing_steps(d.timing.device_missing_steps);
  step->set_note(d.note);
  step->set_next_step(d.next_step);
  if (d.label == StepLabel::kHang) {
    v1::HangEvidence* h = step->mutable_hang();
    h->set_seconds_since_last_aligned(d.seconds_since_last_aligned);
    for (uint32_t r : d.hang_suspects) h->add_suspect_ranks(r);
    h->set_whole_job_stalled(d.whole_job_stalled);
    h->set_lowest_last_step(d.lowest_last_step < 0 ? 0 : d.lowest_last_step);
  }
  FillMemory(s, out->mutable_memory());
  ToProto(s, out->mutable_lost_time());
  out->set_input_lost_messages(s.input_lost_messages);
  out->set_collector_dropped_records(s.collector_dropped_records);
  if (!s.scheduler.empty()) ToProto(s.scheduler, out->mutable_scheduler());
  if (s.whatif != nullptr) ToProto(*s.whatif, out->mutable_whatif());
}

void ToProto(const whatif::WhatIfSnapshot& w, v1::WhatIf* out) {
  const whatif::WindowResult& r = w.result;
  const whatif::WhatIfVerdict& v = w.verdict;
  out->set_verdict(std::string(whatif::VerdictName(v.verdict)));
  out->set_severity(ToProto(v.severity));
  out->set_data_parallel_size(w.layout.dp);
  out->set_pipeline_size(w.layout.pp);
  out->set_tensor_parallel_size(w.layout.tp);
  out->set_steps(r.steps);
  out->set_first_step(r.first_step);
  out->set_last_step(r.last_step);
  out->set_slowdown(r.slowdown);
  out->set_measured_step_ms(r.measured_us / 1e3);
  out->set_actual_step_ms(r.actual_us / 1e3);
  out->set_ideal_step_ms(r.ideal_us / 1e3);
  out->set_lost_rank_seconds(v.lost_rank_seconds);
  const whatif::Decomposition& d = r.decomposition;
  for (double x : d.by_dp_rank) out->add_slowdown_by_data_rank(x);
  for (double x : d.by_stage) out->add_slowdown_by_stage(x);
  for (const auto& [name, x] : d.by_op_group) {
    v1::WhatIf::Group* g = out->add_slowdown_by_op_group();
    g->set_name(name);
    g->set_slowdown(x);
  }
  for (const auto& [worker, x] : d.by_worker) {
    v1::WhatIf::Worker* o = out->add_slowdown_by_worker();
    o->set_data_rank(worker % std::max<uint32_t>(1, w.layout.dp));
    o->set_stage(worker / std::max<uint32_t>(1, w.layout.dp));
    o->set_slowdown(x);
    if (worker < w.worker_ranks.size()) {
      for (uint32_t rank : w.worker_ranks[worker]) o->add_ranks(rank);
    }
  }
  out->set_m_w(r.m_w);
  out->set_m_s(r.m_s_last);
  out->set_m_s_stage(r.m_s_stage);
  out->set_m_s_worst(r.m_s);
  out->set_culprit_data_rank(v.data_rank);
  out->set_culprit_stage(v.stage);
  for (uint32_t rank : v.ranks) out->add_culprit_ranks(rank);
  out->set_op_group(v.op_group);
  out->set_explained(v.explained);
  out->set_move_fraction(v.move_fraction);
  out->set_note(v.note);
  out->set_next_step(v.next_step);
  for (const whatif::StepResult& sr : r.per_step) {
    v1::WhatIf::StepPoint* p = out->add_per_step();
    p->set_step(sr.step);
    p->set_slowdown(sr.slowdown);
    for (double x : sr.decomposition.by_dp_rank) p->add_slowdown_by_data_rank(x);
    for (double x : sr.decomposition.by_stage) p->add_slowdown_by_stage(x);
  }
  out->set_analysed_steps(w.analysed_steps);
  out->set_skipped_steps(w.skipped_steps);
  out->set_skipped_reason(w.last_error);
  out->set_since_step(w.since_step);
  out->set_onset_known(w.onset_known);
}

void ToProto(const JobScheduler& scheduler, v1::SchedulerIdentity* out) {
  out->set_scheduler(scheduler.scheduler);
  out->set_job(scheduler.job);
  out->set_namespace_(scheduler.k8s_namespace);
  out->set_owner(scheduler.owner);
}

void ToProto(const JobSnapshot& s, v1::LostTime* lost) {
  const LostTimeSummary& l = s.lost;
  lost->set_window_rank_seconds(l.window_rank_seconds);
  lost->set_window_straggler_rank_seconds(l.window_straggler_rank_seconds);
  lost->set_total_rank_seconds(l.total_rank_seconds);
  lost->set_total_straggler_rank_seconds(l.total_straggler_rank_seconds);
  lost->set_total_hang_rank_seconds(l.total_hang_rank_seconds);
  for (const RankCost& c : l.top) {
    v1::RankCost* out_c = lost->add_top();
    out_c->set_rank(c.rank);
    out_c->set_node(s.NodeOf(c.rank));
    out_c->set_pod(s.PodOf(c.rank));
    out_c->set_window_rank_seconds(c.window_rank_seconds);
    out_c->set_total_rank_seconds(c.total_rank_seconds);
  }
}

void ToProto(const AlertEvent& e, v1::Alert* out) {
  out->set_id(e.id);
  out->set_training_job(e.training_job);
  out->set_kind(static_cast<v1::AlertKind>(static_cast<int>(e.kind) + 1));
  out->set_subject(e.subject);
  out->set_state(static_cast<v1::AlertState>(static_cast<int>(e.state) + 1));
  out->set_severity(ToProto(e.severity));
  out->set_cause(static_cast<v1::StragglerCause>(static_cast<int>(e.cause)));
  out->set_scope(e.subject.rfind("rank:", 0) == 0   ? v1::SCOPE_RANK
                 : e.subject.rfind("node:", 0) == 0 ? v1::SCOPE_NODE
                                                    : v1::SCOPE_JOB);
  out->set_at_unix_ns(e.at_unix_ns);
  if (e.evidence) ToProto(*e.evidence, e.evidence->evaluated_unix_ns, out->mutable_evidence());
}

}  // namespace rankwatch
