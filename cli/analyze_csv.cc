#include "cli/analyze_csv.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <tuple>

namespace rankwatch {
namespace {

using kernel::Describe;

std::string Quote(const std::string& s) {
  if (s.find_first_of(",\"\n\r") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) {
    if (c == '"') out += '"';
    out += c;
  }
  return out + "\"";
}

std::string Row(const std::vector<std::string>& fields) {
  std::string line;
  for (size_t i = 0; i < fields.size(); ++i) {
    if (i) line += ',';
    line += fields[i];
  }
  return line + "\n";
}

std::vector<std::string> DescribeFields(const Describe& d, int round_digits = -1) {
  auto f = [&](double x) { return round_digits < 0 ? PyFloat(x) : PyRound(x, round_digits); };
  return {f(d.count), f(d.mean), f(d.std), f(d.min), f(d.p25), f(d.p50), f(d.p75), f(d.max)};
}

// ns -> µs as the trace wrote it: an integer when whole.
std::string Micros(int64_t ns) {
  if (ns % 1000 == 0) return std::to_string(ns / 1000);
  return PyFloat(static_cast<double>(ns) / 1000.0);
}

class CsvFile {
 public:
  CsvFile(const std::filesystem::path& path, const std::string& header) : path_(path) {
    out_ += header + "\n";
  }
  void Add(const std::vector<std::string>& fields) { out_ += Row(fields); }
  absl::Status Close() {
    std::ofstream f(path_, std::ios::binary | std::ios::trunc);
    f << out_;
    f.close();
    if (!f) return absl::UnavailableError(path_.string() + ": cannot write");
    return absl::OkStatus();
  }

 private:
  std::filesystem::path path_;
  std::string out_;
};

}  // namespace

std::string PyFloat(double x) {
  if (std::isnan(x)) return "";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, x, std::chars_format::scientific);
  std::string sci(buf, end);  // [-]d[.ddd]e[+-]XX
  const size_t e = sci.find('e');
  const int exp = std::stoi(sci.substr(e + 1));
  std::string mant = sci.substr(0, e);
  const bool neg = mant[0] == '-';
  if (neg) mant.erase(0, 1);
  std::string digits;
  for (char c : mant) {
    if (c != '.') digits += c;
  }
  std::string out;
  if (exp < -4 || exp >= 16) {
    out = digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char eb[16];
    std::snprintf(eb, sizeof eb, "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    out += eb;
  } else if (exp < 0) {
    out = "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
  } else {
    const size_t int_len = static_cast<size_t>(exp) + 1;
    if (digits.size() <= int_len) {
      out = digits + std::string(int_len - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, int_len) + "." + digits.substr(int_len);
    }
  }
  return neg ? "-" + out : out;
}

std::string PyRound(double x, int digits) {
  if (std::isnan(x)) return "";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, x);
  return PyFloat(std::strtod(buf, nullptr));
}

absl::Status WriteAnalyzeCsv(const AnalyzeCsvInput& in, const std::filesystem::path& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::UnavailableError(dir.string() + ": " + ec.message());

  CsvFile temporal(dir / "temporal_breakdown.csv",
                   "rank,idle_time(us),compute_time(us),non_compute_time(us),kernel_time(us),"
                   "idle_time_pctg,compute_time_pctg,non_compute_time_pctg");
  CsvFile overlap(dir / "comm_comp_overlap.csv", "rank,comp_comm_overlap_pctg");
  CsvFile idle(dir / "idle_time_breakdown.csv",
               "rank,stream,idle_category,idle_time,idle_time_ratio");
  CsvFile idle_stats(dir / "idle_time_interval_stats.csv",
                     "idle_category,rank,stream,count,mean,std,min,25%,50%,75%,max");
  CsvFile launches(dir / "cuda_kernel_launch_stats.csv",
                   "rank,correlation,cpu_duration,gpu_duration,launch_delay");
  const std::string rc = PyFloat(in.runtime_cutoff_us), lc = PyFloat(in.launch_delay_cutoff_us);
  auto trim = [](std::string s) {
    return s.size() > 2 && s.ends_with(".0") ? s.substr(0, s.size() - 2) : s;
  };
  CsvFile launch_summary(
      dir / "cuda_kernel_launch_stats_summary.csv",
      "rank,n_launches,short_kernels(cpu_duration<=" + trim(rc) +
          " & gpu_duration<cpu_duration),runtime_outliers(cpu_duration>" + trim(rc) +
          "),launch_delay_outliers(launch_delay>" + trim(lc) +
          "),cpu_duration_mean,cpu_duration_p50,gpu_duration_mean,gpu_duration_p50,"
          "launch_delay_mean,launch_delay_p50,launch_delay_max");
  CsvFile queue(
      dir / "queue_length_summary.csv",
      "rank,stream,queue_length_count,queue_length_mean,queue_length_std,queue_length_min,"
      "queue_length_25%,queue_length_50%,queue_length_75%,queue_length_max");
  CsvFile memory(dir / "memory_bw_summary.csv",
                 "rank,name,memory_bw_gbps_count,memory_bw_gbps_mean,memory_bw_gbps_std,"
                 "memory_bw_gbps_min,memory_bw_gbps_25%,memory_bw_gbps_50%,memory_bw_gbps_75%,"
                 "memory_bw_gbps_max");
  std::map<std::string, int64_t> type_sums;
  std::vector<std::string> type_order;
  std::vector<kernel::KernelStatRow> kernels, kernels_all;

  for (const kernel::RankKernelReport& r : in.reports) {
    const std::string rank = std::to_string(r.rank);
    const auto& t = r.temporal;
    const double k = static_cast<double>(t.kernel_ns);
    auto us = [](int64_t ns) { return PyFloat(static_cast<double>(ns) / 1000.0); };
    temporal.Add({rank, us(t.idle_ns), us(t.compute_ns), us(t.non_compute_ns), us(t.kernel_ns),
                  PyRound(100 * (t.idle_ns / k), 2), PyRound(100 * (t.compute_ns / k), 2),
                  PyRound(100 * (t.non_compute_ns / k), 2)});
    overlap.Add({rank, PyRound(100 * r.overlap.ratio(), 2)});
    for (const kernel::IdleRow& row : r.idle) {
      const std::string cat(kernel::IdleCategoryName(row.category));
      idle.Add(
          {rank, std::to_string(row.stream), cat, PyRound(row.idle_us, 2), PyRound(row.ratio, 2)});
      std::vector<std::string> f = {cat, rank, std::to_string(row.stream)};
      for (std::string& x : DescribeFields(row.gaps_us, 2)) f.push_back(std::move(x));
      idle_stats.Add(f);
    }
    for (const kernel::LaunchRow& l : r.launches) {
      launches.Add({rank, std::to_string(l.correlation), PyFloat(l.cpu_duration_us),
                    PyFloat(l.gpu_duration_us), PyFloat(l.launch_delay_us)});
    }
    const kernel::LaunchSummary& s = r.launch_summary;
    launch_summary.Add({rank, std::to_string(s.launches), std::to_string(s.short_kernels),
                        std::to_string(s.runtime_outliers), std::to_string(s.launch_delay_outliers),
                        PyFloat(s.cpu_mean_us), PyFloat(s.cpu_p50_us), PyFloat(s.gpu_mean_us),
                        PyFloat(s.gpu_p50_us), PyFloat(s.delay_mean_us), PyFloat(s.delay_p50_us),
                        PyFloat(s.delay_max_us)});
    for (const kernel::QueueLengthRow& q : r.queue) {
      std::vector<std::string> f = {rank, std::to_string(q.stream)};
      for (std::string& x : DescribeFields(q.queue_length)) f.push_back(std::move(x));
      queue.Add(f);
    }
    for (const kernel::MemoryBandwidthRow& m : r.memory) {
      std::vector<std::string> f = {rank, Quote(m.kind)};
      for (std::string& x : DescribeFields(m.gbps)) f.push_back(std::move(x));
      memory.Add(f);
    }
    for (const auto& [label, ns] : r.kernel_type_ns) {
      if (!type_sums.contains(label)) type_order.push_back(label);
      type_sums[label] += ns;
    }
    kernels.insert(kernels.end(), r.kernels.begin(), r.kernels.end());
    kernels_all.insert(kernels_all.end(), r.kernels_all.begin(), r.kernels_all.end());
  }

  CsvFile types(dir / "gpu_kernel_breakdown_kernel_type.csv", "kernel_type,sum,percentage");
  {
    std::vector<std::pair<std::string, int64_t>> rows;
    int64_t total = 0;
    for (const std::string& label : type_order) {
      rows.emplace_back(label, type_sums[label]);
      total += type_sums[label];
    }
    std::stable_sort(rows.begin(), rows.end(),
                     [](const auto& a, const auto& b) { return a.second > b.second; });
    for (const auto& [label, ns] : rows) {
      const double us = static_cast<double>(ns) / 1000.0;
      const std::string sum = ns % 1000 == 0 ? std::to_string(ns / 1000) : PyFloat(us);
      types.Add(
          {label, sum, PyRound(100 * (static_cast<double>(ns) / static_cast<double>(total)), 1)});
    }
  }
  auto write_kernels = [&](std::vector<kernel::KernelStatRow>& rows, const std::string& file) {
    std::stable_sort(
        rows.begin(), rows.end(),
        [](const kernel::KernelStatRow& a, const kernel::KernelStatRow& b) {
          return std::make_tuple(kernel::KernelTypeName(a.type), std::cref(a.name), a.rank) <
                 std::make_tuple(kernel::KernelTypeName(b.type), std::cref(b.name), b.rank);
        });
    CsvFile f(dir / file, "name,sum (us),max (us),min (us),stddev,mean (us),kernel_type,rank");
    for (const auto& k : rows) {
      f.Add({Quote(k.name), PyFloat(k.sum_us), PyFloat(k.max_us), PyFloat(k.min_us),
             PyFloat(k.std_us), PyFloat(k.mean_us), std::string(kernel::KernelTypeName(k.type)),
             std::to_string(k.rank)});
    }
    return f.Close();
  };

  CsvFile steps(dir / "profiler_steps.csv", "profiler_step");
  for (int64_t s : in.timelines->profiler_steps) steps.Add({std::to_string(s)});
  CsvFile stragglers(dir / "potential_stragglers.csv", "straggler_rank");
  for (uint32_t r : in.stragglers) stragglers.Add({std::to_string(r)});

  CsvFile events(
      dir / "filtered_gpu_events.csv",
      "rank,index,ts,dur,stream,correlation,index_correlation,iteration,cat,name,kernel_type");
  for (const kernel::RankTimeline& t : in.timelines->ranks) {
    std::vector<const kernel::GpuOp*> ops;
    for (const kernel::GpuOp& op : t.gpu) ops.push_back(&op);
    std::stable_sort(ops.begin(), ops.end(), [](const kernel::GpuOp* a, const kernel::GpuOp* b) {
      return a->ts != b->ts ? a->ts < b->ts : a->index < b->index;
    });
    for (const kernel::GpuOp* op : ops) {
      events.Add({std::to_string(t.rank), std::to_string(op->index), Micros(op->ts),
                  PyFloat(static_cast<double>(op->dur) / 1000.0), std::to_string(op->stream),
                  std::to_string(op->correlation), std::to_string(op->index_correlation),
                  op->iteration == kernel::kNoIteration ? "" : std::to_string(op->iteration),
                  Quote((*t.strings)[op->category]), Quote((*t.strings)[op->name]),
                  std::string(kernel::KernelTypeName(op->type))});
    }
  }

  for (CsvFile* f : {&temporal, &overlap, &idle, &idle_stats, &launches, &launch_summary, &queue,
                     &memory, &types, &steps, &stragglers, &events}) {
    if (auto s = f->Close(); !s.ok()) return s;
  }
  if (auto s = write_kernels(kernels, "gpu_kernel_breakdown_kernels.csv"); !s.ok()) return s;
  return write_kernels(kernels_all, "gpu_kernel_breakdown_kernels_all.csv");
}

}  // namespace rankwatch
