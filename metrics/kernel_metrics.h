// KernelMetrics: the Prometheus families of the live GPU-timeline analyses, one
// value set per job with bounded cardinality (no rank label except the outlier gauge's value):
//
//   rankwatch_gpu_time_ratio{training_job,category}        idle | compute | non_compute
//   rankwatch_idle_time_ratio{training_job,reason}         host_wait | kernel_wait | other
//   rankwatch_kernel_time_ratio{training_job,type}         COMPUTATION, COMMUNICATION, MEMORY and
//                                                          their "X overlapping Y" combinations (≤
//                                                          7)
//   rankwatch_comm_comp_overlap_ratio{training_job,stat}   median | min | max across ranks
//   rankwatch_launch_delay_seconds{training_job,quantile}  0.5 | 0.9 | 0.99 | max
//   rankwatch_kernel_outlier_rank{training_job,signal}     idle | communication: the rank apart
//   rankwatch_kernel_outlier_share_ratio{training_job,signal}  that rank's share of GPU time
//   rankwatch_kernel_steps_analyzed_total{training_job}
//   rankwatch_kernel_events_dropped_total{training_job,reason}  late | unstepped | over_limit
//
// A job's series are published only while `gate` exports it (metrics/job_export_gate.h): kernel
// results from at least two ranks, or over JobExportOptions::min_steps (rank, step) windows,
// make an id a job.
//
// Thread-safe (see PrometheusRegistry).
#pragma once

#include <string>

#include "metrics/job_export_gate.h"
#include "metrics/prometheus_registry.h"
#include "operators/kernel/kernel_job_summary.h"

namespace rankwatch {

class KernelMetrics {
 public:
  // `gate` (null: every job is exported) outlives this.
  KernelMetrics(PrometheusRegistry* registry, JobExportGate* gate);

  void Publish(const kernel::KernelJobSnapshot& snapshot);
  void RemoveJob(const std::string& job);

 private:
  MetricFamily* gpu_time_;
  MetricFamily* idle_time_;
  MetricFamily* kernel_time_;
  MetricFamily* overlap_;
  MetricFamily* launch_delay_;
  MetricFamily* outlier_rank_;
  MetricFamily* outlier_share_;
  MetricFamily* steps_;
  MetricFamily* dropped_;
  JobExportGate* gate_;
};

}  // namespace rankwatch
