#include "serving/queries.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <chrono>
#include <cmath>
#include <future>

#include "common/wall_clock.h"
#include "evidence/capture_store.h"
#include "fleet/node_view.h"
#include "operators/step_codec.h"
#include "operators/step_time_diagnosis.h"
#include "serving/diagnosis_proto.h"
#include "serving/timeline.h"
#include "state/job_state_store.h"

namespace rankwatch {
namespace {

// The service of type T a part offers, or null.
template <typename T>
const T* Served(const QuerySources& s) {
  return s.parts == nullptr ? nullptr : s.parts->Find<T>();
}

absl::Status NoJob(const std::string& job) {
  return absl::NotFoundError("no training job '" + job + "'");
}

void FillKernel(const kernel::RankKernelSummary& r, const kernel::KernelJobSnapshot& job,
                v1::RankKernel* out) {
  const kernel::KernelStepSummary& t = r.total;
  out->set_steps(r.steps);
  out->set_first_step(r.first_step);
  out->set_last_step(r.last_step);
  out->set_gpu_ops(t.gpu_ops);
  out->set_kernel_seconds(t.kernel_ns * 1e-9);
  out->set_idle_seconds(t.idle_ns * 1e-9);
  out->set_compute_seconds(t.compute_ns * 1e-9);
  out->set_non_compute_seconds(t.non_compute_ns * 1e-9);
  out->set_communication_seconds(t.comm_ns * 1e-9);
  out->set_comm_overlap_seconds(t.comm_overlap_ns * 1e-9);
  out->set_idle_share(r.idle_share);
  out->set_communication_share(r.comm_share);
  out->set_idle_host_wait_seconds(t.idle_us[0] * 1e-6);
  out->set_idle_kernel_wait_seconds(t.idle_us[1] * 1e-6);
  out->set_idle_other_seconds(t.idle_us[2] * 1e-6);
  out->set_launches(t.launches);
  if (t.launches > 0) out->set_launch_delay_max_seconds(t.delay_max_us * 1e-6);
  for (const kernel::KernelOutlier& o : job.outliers) {
    if (o.rank == r.rank) out->add_outliers(o.note);
  }
}

// --- the heatmap's stages (Queries::GetHeatmap) ---------------------------------------------

// A metric's name: its phase's, upper case ("DATALOADER").
std::string MetricName(Phase p) {
  std::string n(PhaseName(p));
  for (char& c : n) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return n;
}

// The heatmap of `job` before its steps: its ranks, their nodes, the culprits.
JobHeatmap HeatmapOfJob(const std::string& job, const JobSnapshot& snapshot,
                        std::optional<uint32_t> rank) {
  JobHeatmap h;
  h.training_job = job;
  h.rank = rank;
  h.world_size = snapshot.world_size;
  h.culprit_ranks = snapshot.step.culprit_ranks;
  for (uint32_t r = 0; r < snapshot.world_size; ++r) h.rank_nodes.push_back(snapshot.NodeOf(r));
  return h;
}

// The phase a metric shows; -1: own time ("OWN"). InvalidArgument for another name.
absl::StatusOr<int> PhaseOfMetric(const std::string& metric) {
  int phase = -1;
  for (int p = 0; p < kPhaseCount; ++p) {
    if (MetricName(static_cast<Phase>(p)) == metric) phase = p;
  }
  if (phase < 0 && metric != "OWN") {
    return absl::InvalidArgumentError("no metric '" + metric +
                                      "' (STEP, OWN or a phase: DATALOADER, FORWARD, ...)");
  }
  return phase;
}

// Stored steps, each reduced to the metric's column: a value a rank (NaN where none).
struct HeatmapSteps {
  absl::Status status;
  std::vector<uint64_t> steps;
  std::vector<bool> timed_out;
  std::vector<uint32_t> ranks;  // rank-steps of each step, for max_rank_steps
  std::vector<std::vector<float>> columns;
  uint32_t present = 0;    // phases any rank reported
  bool truncated = false;  // older steps were left out (KeepNewestThatFit)
};

// Steps [first, last] of the job, each decoded and reduced to the metric's column at once: the
// decoded samples of a whole window would take ~100 bytes a rank-step.
HeatmapSteps ReadColumns(const StateStore& store, const std::string& job, uint32_t n, int phase,
                         const BlockedModel& blocked, uint64_t first, uint64_t last) {
  HeatmapSteps half;
  auto stored = job_state::ReadStepRange(store, job, first, last);
  if (!stored.ok()) {
    half.status = stored.status();
    return half;
  }
  AlignedStep step;
  for (const state::v1::StoredStep& st : *stored) {
    if (absl::Status d = DecodeStep(st, &step); !d.ok()) {
      half.status = absl::DataLossError("stored step " + std::to_string(st.step()) + " of job '" +
                                        job + "': " + std::string(d.message()));
      return half;
    }
    half.steps.push_back(step.step);
    half.timed_out.push_back(step.timed_out);
    half.ranks.push_back(static_cast<uint32_t>(step.samples.size()));
    std::vector<float>& column = half.columns.emplace_back(n, NAN);
    for (const StepSample& sample : step.samples) {
      half.present |= sample.present;
      if (sample.rank >= n) continue;
      if (phase >= 0) {
        if (sample.Has(static_cast<Phase>(phase))) {
          column[sample.rank] = static_cast<float>(static_cast<double>(sample.ns[phase]) * 1e-6);
        }
        continue;
      }
      std::array<double, kPhaseCount> v{};
      for (int p = 0; p < kPhaseCount; ++p) v[p] = static_cast<double>(sample.ns[p]) * 1e-6;
      column[sample.rank] = static_cast<float>(
          OwnTime(v, sample.present, blocked, static_cast<double>(sample.gc_ns) * 1e-6));
    }
  }
  return half;
}

// The window's steps, read and decoded in two halves at once (a 16,384-rank window is ~60 MB
// of stored columns), the older half on a thread of its own.
absl::StatusOr<HeatmapSteps> ReadWindowColumns(const StateStore& store, const std::string& job,
                                               const JobSnapshot& snapshot, int phase) {
  const uint32_t n = snapshot.world_size;
  const BlockedModel& blocked = snapshot.step.blocked;
  const uint64_t first = snapshot.window_first_step, last = snapshot.window_last_step;
  const uint64_t middle = first + (last - first) / 2;
  std::future<HeatmapSteps> older_future = std::async(std::launch::async, [&] {
    return ReadColumns(store, job, n, phase, blocked, first, middle);
  });
  HeatmapSteps newer = ReadColumns(store, job, n, phase, blocked, middle + 1, last);
  HeatmapSteps older = older_future.get();
  if (!older.status.ok()) return older.status;
  if (!newer.status.ok()) return newer.status;
  HeatmapSteps all = std::move(older);
  all.steps.insert(all.steps.end(), newer.steps.begin(), newer.steps.end());
  all.timed_out.insert(all.timed_out.end(), newer.timed_out.begin(), newer.timed_out.end());
  all.ranks.insert(all.ranks.end(), newer.ranks.begin(), newer.ranks.end());
  for (auto& c : newer.columns) all.columns.push_back(std::move(c));
  all.present |= newer.present;
  return all;
}

// Keeps the newest steps whose rank-steps fit in `max_rank_steps`.
void KeepNewestThatFit(uint32_t max_rank_steps, HeatmapSteps* s) {
  size_t begin = s->ranks.size();
  uint64_t rank_steps = 0;
  while (begin > 0 && rank_steps + s->ranks[begin - 1] <= max_rank_steps) {
    rank_steps += s->ranks[--begin];
  }
  s->truncated = begin > 0;
  const auto cut = static_cast<std::ptrdiff_t>(begin);
  s->steps.erase(s->steps.begin(), s->steps.begin() + cut);
  s->timed_out.erase(s->timed_out.begin(), s->timed_out.begin() + cut);
  s->ranks.erase(s->ranks.begin(), s->ranks.begin() + cut);
  s->columns.erase(s->columns.begin(), s->columns.begin() + cut);
}

// The metrics the steps hold: STEP and OWN (own time needs the step time and a blocked model)
// first, then each phase any rank reported.
std::vector<std::string> MetricsPresent(uint32_t present, bool own_known) {
  std::vector<std::string> metrics;
  if (present & (1u << static_cast<int>(Phase::kStep))) {
    metrics.push_back("STEP");
    if (own_known) metrics.push_back("OWN");
  }
  for (int p = 0; p < kPhaseCount; ++p) {
    if (p != static_cast<int>(Phase::kStep) && (present & (1u << p))) {
      metrics.push_back(MetricName(static_cast<Phase>(p)));
    }
  }
  return metrics;
}

// One rank's values, step by step, and each step's median over every rank that reported it.
void FillRankValues(const std::vector<std::vector<float>>& columns, uint32_t rank, JobHeatmap* h) {
  std::vector<float> column;
  for (const std::vector<float>& step : columns) {
    h->values.push_back(step[rank]);
    column.clear();
    for (float v : step) {
      if (!std::isnan(v)) column.push_back(v);
    }
    float median = NAN;
    if (!column.empty()) {
      auto mid = column.begin() + static_cast<std::ptrdiff_t>(column.size() / 2);
      std::nth_element(column.begin(), mid, column.end());
      median = *mid;
    }
    h->medians.push_back(median);
  }
}

// Every rank's values: rank-major, a row of steps per rank.
void FillGrid(const std::vector<std::vector<float>>& columns, uint32_t ranks, JobHeatmap* h) {
  const size_t steps = columns.size();
  h->values.assign(static_cast<size_t>(ranks) * steps, NAN);
  for (size_t s = 0; s < steps; ++s) {
    for (uint32_t r = 0; r < ranks; ++r) h->values[r * steps + s] = columns[s][r];
  }
}

}  // namespace

v1::ListJobsResponse Queries::ListJobs() const {
  v1::ListJobsResponse response;
  for (const auto& [job, snapshot] : *s_.snapshots->Get()) {
    const JobSnapshot& s = *snapshot;
    v1::JobSummary* j = response.add_jobs();
    j->set_training_job(job);
    j->set_world_size(s.world_size);
    j->set_ranks_seen(s.ranks_seen);
    j->set_aligned_steps(s.aligned_steps);
    j->set_last_aligned_step(s.window_last_step);
    j->set_last_record_unix_ns(s.last_record_unix_ns);
    j->set_step_label(ToProto(s.step.label));
    j->set_memory_label(ToProto(s.memory.label));
    j->set_step_severity(ToProto(s.step.severity));
    j->set_memory_severity(ToProto(s.memory.severity));
    for (uint32_t r : s.step.culprit_ranks) j->add_culprit_ranks(r);
    if (s.rank_pods != nullptr) {
      for (uint32_t r : s.step.culprit_ranks) j->add_culprit_pods(s.PodOf(r));
    }
    if (!s.scheduler.empty()) ToProto(s.scheduler, j->mutable_scheduler());
    j->set_step_skew(s.phases[static_cast<int>(Phase::kStep)].skew);
    j->set_wait_share(s.step.wait_share);
    j->set_input_share(s.step.input_share);
    ToProto(s, j->mutable_lost_time());
    if (s_.alerts != nullptr) {
      for (const std::string& id : s_.alerts->Firing(job)) j->add_firing_alerts(id);
    }
  }
  return response;
}

absl::StatusOr<v1::Diagnosis> Queries::GetDiagnosis(const std::string& job) const {
  auto snapshots = s_.snapshots->Get();
  auto it = snapshots->find(job);
  if (it == snapshots->end()) return NoJob(job);
  v1::Diagnosis response;
  ToProto(*it->second, it->second->evaluated_unix_ns, &response);
  if (const auto& points = it->second->memory_trend_points; points != nullptr) {
    for (const MemoryTrend::Point& p : *points) {
      v1::MemoryTrendPoint* out = response.mutable_memory()->add_trend_points();
      out->set_step(p.step);
      out->set_worst_bytes(p.worst);
      out->set_median_bytes(p.median);
    }
  }
  if (s_.parts != nullptr) {
    for (const DiagnosisContributor* part : s_.parts->diagnosis()) {
      part->AddTo(*it->second, &response);
    }
  }
  return response;
}

absl::StatusOr<v1::RankDetail> Queries::GetRankDetail(const std::string& job, uint32_t rank) const {
  auto snapshots = s_.snapshots->Get();
  auto it = snapshots->find(job);
  if (it == snapshots->end()) return NoJob(job);
  const JobSnapshot& s = *it->second;
  if (rank >= s.world_size) {
    return absl::OutOfRangeError("training job '" + s.training_job + "' has " +
                                 std::to_string(s.world_size) + " ranks");
  }
  v1::RankDetail response;
  response.set_training_job(s.training_job);
  response.set_rank(rank);
  response.set_node(s.NodeOf(rank));
  response.set_pod(s.PodOf(rank));
  response.set_last_step(s.window_last_step);
  response.set_window_steps(s.window_steps);
  if (s.rank_totals && rank < s.rank_totals->size()) {
    const auto& totals = (*s.rank_totals)[rank];
    for (int p = 0; p < kPhaseCount; ++p) {
      const double mean = WindowMean(totals, static_cast<Phase>(p));  // NaN: not reported
      if (std::isnan(mean)) continue;
      v1::RankPhase* phase = response.add_phases();
      phase->set_phase(ToProto(static_cast<Phase>(p)));
      phase->set_seconds(mean);
      phase->set_excess_seconds(mean - s.phases[p].median_seconds);
    }
  }
  if (s.rank_peak_allocated && rank < s.rank_peak_allocated->size()) {
    response.set_peak_allocated_bytes((*s.rank_peak_allocated)[rank]);
  }
  if (s.rank_peak_reserved && rank < s.rank_peak_reserved->size()) {
    response.set_peak_reserved_bytes((*s.rank_peak_reserved)[rank]);
  }
  if (s_.kernels != nullptr) {
    if (auto kernels = s_.kernels->Get(s.training_job)) {
      if (const kernel::RankKernelSummary* r = kernels->Rank(rank)) {
        FillKernel(*r, *kernels, response.mutable_kernel());
      }
    }
  }
  return response;
}

absl::StatusOr<v1::ListCapturesResponse> Queries::ListCaptures(const std::string& job) const {
  const CaptureStore* captures = Served<CaptureStore>(s_);
  if (captures == nullptr) return absl::UnavailableError("captures are off");
  v1::ListCapturesResponse response;
  for (v1::Capture& c : captures->List(job)) *response.add_captures() = std::move(c);
  return response;
}

absl::StatusOr<v1::GetCaptureResponse> Queries::GetCapture(const std::string& id,
                                                           bool with_events) const {
  const CaptureStore* captures = Served<CaptureStore>(s_);
  if (captures == nullptr) return absl::UnavailableError("captures are off");
  std::vector<v1::CaptureTrace> traces;
  auto c = captures->Get(id, with_events ? &traces : nullptr);
  if (!c) return absl::NotFoundError("no capture '" + id + "'");
  v1::GetCaptureResponse response;
  *response.mutable_capture() = std::move(*c);
  for (v1::CaptureTrace& t : traces) *response.add_traces() = std::move(t);
  return response;
}

absl::StatusOr<v1::Timeline> Queries::GetTimeline(const v1::GetTimelineRequest& request) const {
  if (s_.state == nullptr) return absl::UnavailableError("no state store");
  auto snapshots = s_.snapshots->Get();
  auto it = snapshots->find(request.training_job());
  if (it == snapshots->end()) return NoJob(request.training_job());
  return BuildTimeline(*it->second, request, *s_.state, s_.alerts, Served<CaptureStore>(s_));
}

absl::StatusOr<JobHeatmap> Queries::GetHeatmap(const std::string& job, const std::string& metric,
                                               uint32_t max_rank_steps,
                                               std::optional<uint32_t> rank) const {
  if (s_.state == nullptr) return absl::UnavailableError("no state store");
  auto snapshots = s_.snapshots->Get();
  auto it = snapshots->find(job);
  if (it == snapshots->end()) return NoJob(job);
  const JobSnapshot& snapshot = *it->second;
  if (rank && *rank >= snapshot.world_size) {
    return absl::OutOfRangeError("training job '" + job + "' has " +
                                 std::to_string(snapshot.world_size) + " ranks");
  }
  JobHeatmap h = HeatmapOfJob(job, snapshot, rank);
  if (!snapshot.has_window) return h;
  const bool own_known = snapshot.step.blocked.kind != BlockedModel::Kind::kUnknown;
  h.metric = metric.empty() ? (own_known ? "OWN" : "STEP") : metric;
  const absl::StatusOr<int> phase = PhaseOfMetric(h.metric);
  if (!phase.ok()) return phase.status();
  absl::StatusOr<HeatmapSteps> steps = ReadWindowColumns(*s_.state, job, snapshot, *phase);
  if (!steps.ok()) return steps.status();
  KeepNewestThatFit(max_rank_steps, &*steps);
  h.truncated = steps->truncated;
  h.steps = std::move(steps->steps);
  h.timed_out = std::move(steps->timed_out);
  h.metrics = MetricsPresent(steps->present, own_known);
  if (!h.steps.empty() &&
      std::find(h.metrics.begin(), h.metrics.end(), h.metric) == h.metrics.end()) {
    std::string known;
    for (const std::string& m : h.metrics) known += (known.empty() ? "" : ", ") + m;
    return absl::InvalidArgumentError("no metric '" + h.metric + "' in the steps of job '" + job +
                                      "' (" + known + ")");
  }
  if (rank) {
    FillRankValues(steps->columns, *rank, &h);
  } else {
    FillGrid(steps->columns, snapshot.world_size, &h);
  }
  return h;
}

absl::StatusOr<std::vector<v1::Alert>> Queries::RecentAlerts(const std::string& job,
                                                             size_t max) const {
  if (s_.alerts == nullptr) return absl::UnavailableError("alerts are not enabled");
  {
    auto snapshots = s_.snapshots->Get();
    if (snapshots->find(job) == snapshots->end()) return NoJob(job);
  }
  // The alerts kept in memory for resuming subscribers (the newest few thousand of every job);
  // older ones stay in the alert log, for WatchAlerts.
  constexpr uint64_t kScan = 4096;
  const uint64_t last = s_.alerts->last_sequence();
  AlertFilter filter;
  filter.training_job = job;
  std::vector<v1::Alert> out;
  s_.alerts->Backlog(last > kScan ? last - kScan : 0, last + 1, filter,
                     [&](std::shared_ptr<const v1::Alert> a) { out.push_back(*a); });
  std::reverse(out.begin(), out.end());
  if (out.size() > max) out.resize(max);
  return out;
}

absl::StatusOr<v1::ListNodesResponse> Queries::ListNodes(
    const v1::ListNodesRequest& request) const {
  const NodeView* nodes = Served<NodeView>(s_);
  if (nodes == nullptr) {
    return absl::UnavailableError(
        "the fleet view of nodes is not enabled in this rankwatchd (see --nodes-topic)");
  }
  const int64_t now = WallNowUnixNs();
  return nodes->ListNodes(request, now);
}

absl::StatusOr<v1::ListNodesResponse> Queries::GetNode(const std::string& node) const {
  v1::ListNodesRequest request;
  request.set_node(node);
  auto answer = ListNodes(request);
  if (!answer.ok() || answer->nodes_size() > 0) return answer;
  // "7d", "24h", "90m": the horizon as the daemon's flags write it.
  const int64_t h = answer->horizon_seconds();
  const std::string horizon = h >= 3 * 86400 && h % 86400 == 0 ? std::to_string(h / 86400) + "d"
                              : h > 0 && h % 3600 == 0         ? std::to_string(h / 3600) + "h"
                              : h > 0 && h % 60 == 0           ? std::to_string(h / 60) + "m"
                                                               : std::to_string(h) + "s";
  return absl::NotFoundError("no record of node '" + node + "' within the last " + horizon +
                             (answer->complete() ? ""
                                                 : " (the daemon is still reading the nodes "
                                                   "topic: the view is not complete yet)"));
}

}  // namespace rankwatch
