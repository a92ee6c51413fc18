#include "metrics/kernel_metrics.h"

namespace rankwatch {

KernelMetrics::KernelMetrics(PrometheusRegistry* r, JobExportGate* gate) : gate_(gate) {
  gpu_time_ =
      r->Gauge("rankwatch_gpu_time_ratio",
               "Share of GPU time (first kernel start to last end, per rank and step, summed "
               "over ranks and their recent steps) that is idle, compute or non-compute.",
               {"training_job", "category"});
  idle_time_ =
      r->Gauge("rankwatch_idle_time_ratio",
               "Share of per-stream idle time by reason: host_wait (launched after the GPU "
               "went idle), kernel_wait (gap under 30 us), other.",
               {"training_job", "reason"});
  kernel_time_ = r->Gauge("rankwatch_kernel_time_ratio",
                          "Share of kernel time per kernel type and overlap combination (HTA's "
                          "kernel-type breakdown), over all ranks and their recent steps.",
                          {"training_job", "type"});
  overlap_ = r->Gauge("rankwatch_comm_comp_overlap_ratio",
                      "Share of communication-kernel time overlapped by computation, per rank over "
                      "its recent steps: median, min and max across ranks.",
                      {"training_job", "stat"});
  launch_delay_ =
      r->Gauge("rankwatch_launch_delay_seconds",
               "Kernel launch delay (launch call end to kernel start): median over the "
               "(rank, step) windows of each window's quantile; max: the largest delay.",
               {"training_job", "quantile"});
  outlier_rank_ = r->Gauge("rankwatch_kernel_outlier_rank",
                           "Rank whose idle or communication share of GPU time stands apart from "
                           "the median across ranks (present only while one does).",
                           {"training_job", "signal"});
  outlier_share_ = r->Gauge("rankwatch_kernel_outlier_share_ratio",
                            "Share of GPU time of the rank named by rankwatch_kernel_outlier_rank.",
                            {"training_job", "signal"});
  steps_ =
      r->Counter("rankwatch_kernel_steps_analyzed_total",
                 "(rank, step) windows of kernel events analysed since the job was first seen.",
                 {"training_job"});
  dropped_ = r->Counter("rankwatch_kernel_events_dropped_total",
                        "Kernel events not analysed: late (step already closed), unstepped (no "
                        "step), over_limit (step too large).",
                        {"training_job", "reason"});
}

void KernelMetrics::Publish(const kernel::KernelJobSnapshot& s) {
  const std::string& job = s.training_job;
  if (gate_ != nullptr &&
      gate_->Evaluate(job, s.ranks.size() >= 2 || s.steps_closed >= gate_->options().min_steps) !=
          JobExportGate::State::kExported) {
    return;
  }
  steps_->WithLabels({job})->Set(static_cast<double>(s.steps_closed));
  dropped_->WithLabels({job, "late"})->Set(static_cast<double>(s.events_late));
  dropped_->WithLabels({job, "unstepped"})->Set(static_cast<double>(s.events_unstepped));
  dropped_->WithLabels({job, "over_limit"})->Set(static_cast<double>(s.events_over_limit));
  if (s.ranks.empty()) return;
  gpu_time_->WithLabels({job, "idle"})->Set(s.gpu_idle_ratio);
  gpu_time_->WithLabels({job, "compute"})->Set(s.gpu_compute_ratio);
  gpu_time_->WithLabels({job, "non_compute"})->Set(s.gpu_non_compute_ratio);
  idle_time_->WithLabels({job, "host_wait"})->Set(s.idle_host_wait_ratio);
  idle_time_->WithLabels({job, "kernel_wait"})->Set(s.idle_kernel_wait_ratio);
  idle_time_->WithLabels({job, "other"})->Set(s.idle_other_ratio);
  std::vector<MetricFamily::Row> types;
  for (const auto& [type, ratio] : s.kernel_type_ratio) types.push_back({{job, type}, ratio});
  kernel_time_->SetSeriesOf(job, types);
  if (s.has_overlap) {
    overlap_->WithLabels({job, "median"})->Set(s.overlap_median);
    overlap_->WithLabels({job, "min"})->Set(s.overlap_min);
    overlap_->WithLabels({job, "max"})->Set(s.overlap_max);
  }
  if (s.has_launches) {
    launch_delay_->WithLabels({job, "0.5"})->Set(s.delay_p50_s);
    launch_delay_->WithLabels({job, "0.9"})->Set(s.delay_p90_s);
    launch_delay_->WithLabels({job, "0.99"})->Set(s.delay_p99_s);
    launch_delay_->WithLabels({job, "max"})->Set(s.delay_max_s);
  }
  for (const char* signal : {"idle", "communication"}) {
    const kernel::KernelOutlier* top = nullptr;
    for (const auto& o : s.outliers) {
      if (o.signal == signal) {
        top = &o;  // outliers are sorted by deviation: the first is the one apart the most
        break;
      }
    }
    if (top != nullptr) {
      outlier_rank_->WithLabels({job, signal})->Set(top->rank);
      outlier_share_->WithLabels({job, signal})->Set(top->share);
    } else {
      outlier_rank_->RemoveSeries({job, signal});
      outlier_share_->RemoveSeries({job, signal});
    }
  }
}

void KernelMetrics::RemoveJob(const std::string& job) {
  for (MetricFamily* f : {gpu_time_, idle_time_, kernel_time_, overlap_, launch_delay_,
                          outlier_rank_, outlier_share_, steps_, dropped_}) {
    f->RemoveWhereFirstLabel(job);
  }
}

}  // namespace rankwatch
