#include "serving/kernel_json.h"

#include <cmath>
#include <cstdio>

#include "common/json_string.h"

namespace rankwatch {
namespace {

std::string Num(double x) {
  if (!std::isfinite(x)) return "null";
  char buf[40];
  std::snprintf(buf, sizeof(buf), "%.17g", x);
  return buf;
}

std::string Str(const std::string& s) { return JsonString(s); }

std::string Uint(uint64_t x) { return std::to_string(x); }

std::string StepJson(const kernel::KernelStepSummary& s) {
  std::string types = "{";
  for (const auto& [label, ns] : s.kernel_type_ns) {
    types += (types.size() > 1 ? ", " : "") + Str(label) + ": " + Num(ns / 1e3);
  }
  types += "}";
  return "{\"rank\": " + Uint(s.rank) + ", \"step\": " + std::to_string(s.step) +
         ", \"gpu_ops\": " + Uint(s.gpu_ops) + ", \"kernel_time_us\": " + Num(s.kernel_ns / 1e3) +
         ", \"idle_time_us\": " + Num(s.idle_ns / 1e3) +
         ", \"compute_time_us\": " + Num(s.compute_ns / 1e3) +
         ", \"non_compute_time_us\": " + Num(s.non_compute_ns / 1e3) +
         ", \"comm_time_us\": " + Num(s.comm_ns / 1e3) +
         ", \"comm_comp_overlap_ratio\": " + Num(s.comm_comp_overlap_ratio()) +
         ", \"launches\": " + Uint(s.launches) + ", \"short_kernels\": " + Uint(s.short_kernels) +
         ", \"runtime_outliers\": " + Uint(s.runtime_outliers) +
         ", \"launch_delay_outliers\": " + Uint(s.launch_delay_outliers) +
         ", \"idle\": {\"host_wait_us\": " + Num(s.idle_us[0]) +
         ", \"kernel_wait_us\": " + Num(s.idle_us[1]) + ", \"other_us\": " + Num(s.idle_us[2]) +
         "}" + ", \"kernel_type_us\": " + types +
         ", \"launch_delay_us\": {\"p50\": " + Num(s.delay_p50_us) +
         ", \"p90\": " + Num(s.delay_p90_us) + ", \"p99\": " + Num(s.delay_p99_us) +
         ", \"max\": " + Num(s.delay_max_us) + "}}";
}

}  // namespace

std::string KernelJobJson(const kernel::KernelJobSnapshot& s) {
  std::string out =
      "{\"training_job\": " + Str(s.training_job) + ", \"world_size\": " + Uint(s.world_size) +
      ", \"steps_analyzed\": " + Uint(s.steps_closed) +
      ",\n \"events\": {\"accepted\": " + Uint(s.events_accepted) +
      ", \"late\": " + Uint(s.events_late) + ", \"unstepped\": " + Uint(s.events_unstepped) +
      ", \"over_limit\": " + Uint(s.events_over_limit) + "},\n";
  out += " \"gpu_time_ratio\": {\"idle\": " + Num(s.gpu_idle_ratio) +
         ", \"compute\": " + Num(s.gpu_compute_ratio) +
         ", \"non_compute\": " + Num(s.gpu_non_compute_ratio) + "},\n";
  out += " \"idle_time_ratio\": {\"host_wait\": " + Num(s.idle_host_wait_ratio) +
         ", \"kernel_wait\": " + Num(s.idle_kernel_wait_ratio) +
         ", \"other\": " + Num(s.idle_other_ratio) + "},\n";
  out += " \"kernel_time_ratio\": {";
  for (size_t i = 0; i < s.kernel_type_ratio.size(); ++i) {
    out += (i ? ", " : "") + Str(s.kernel_type_ratio[i].first) + ": " +
           Num(s.kernel_type_ratio[i].second);
  }
  out += "},\n \"comm_comp_overlap_ratio\": ";
  out += s.has_overlap
             ? "{\"median\": " + Num(s.overlap_median) + ", \"min\": " + Num(s.overlap_min) +
                   ", \"max\": " + Num(s.overlap_max) + "}"
             : std::string("null");
  out += ",\n \"launch_delay_seconds\": ";
  out += s.has_launches
             ? "{\"0.5\": " + Num(s.delay_p50_s) + ", \"0.9\": " + Num(s.delay_p90_s) +
                   ", \"0.99\": " + Num(s.delay_p99_s) + ", \"max\": " + Num(s.delay_max_s) + "}"
             : std::string("null");
  out += ",\n \"outliers\": [";
  for (size_t i = 0; i < s.outliers.size(); ++i) {
    const auto& o = s.outliers[i];
    out += std::string(i ? ", " : "") + "{\"rank\": " + Uint(o.rank) +
           ", \"signal\": " + Str(o.signal) + ", \"share\": " + Num(o.share) +
           ", \"median\": " + Num(o.median) + ", \"note\": " + Str(o.note) + "}";
  }
  out += "],\n \"ranks\": [";
  for (size_t i = 0; i < s.ranks.size(); ++i) {
    const auto& r = s.ranks[i];
    out += std::string(i ? "," : "") + "\n  {\"rank\": " + Uint(r.rank) +
           ", \"steps\": " + Uint(r.steps) + ", \"first_step\": " + std::to_string(r.first_step) +
           ", \"last_step\": " + std::to_string(r.last_step) +
           ", \"steps_analyzed\": " + Uint(r.steps_closed_total) +
           ", \"idle_share\": " + Num(r.idle_share) + ", \"comm_share\": " + Num(r.comm_share) +
           ",\n   \"total\": " + StepJson(r.total) + ",\n   \"recent_steps\": [";
    for (size_t k = 0; k < r.recent.size(); ++k)
      out += std::string(k ? ",\n    " : "\n    ") + StepJson(r.recent[k]);
    out += "]}";
  }
  out += "]}\n";
  return out;
}

std::string KernelJobListJson(const std::vector<std::string>& jobs) {
  std::string out = "{\"jobs\": [";
  for (size_t i = 0; i < jobs.size(); ++i) out += (i ? ", " : "") + Str(jobs[i]);
  return out + "]}\n";
}

}  // namespace rankwatch
