// MindSpore step_trace_raw_<rank>_detail_time.csv and torch_npu step_trace_time.csv -> step
// records (see iteration_trace.h for the mappings).
#include <simdjson.h>
#include <algorithm>
#include <cmath>
#include <fstream>
#include <optional>
#include <regex>

#include "traces/csv_table.h"
#include "traces/iteration_trace.h"

namespace rankwatch {
namespace {

absl::StatusOr<size_t> RequireColumn(const CsvTable& t, std::string_view name) {
  if (auto c = t.Column(name)) return *c;
  return absl::InvalidArgumentError(t.name() + ": no column '" + std::string(name) + "'");
}

uint64_t Ns(double v, double scale) {
  return static_cast<uint64_t>(std::llround(std::max(0.0, v) * scale));
}

// A step number: a whole number in [0, 2^63) (converting another double is undefined).
absl::StatusOr<uint64_t> StepNumber(const CsvTable& t, size_t row, double v) {
  if (!(v >= 0 && v < 9.2e18) || v != std::floor(v)) {
    return absl::InvalidArgumentError(t.name() + ":" + std::to_string(t.line_of(row)) +
                                      ": not a step number: " + std::to_string(v));
  }
  return static_cast<uint64_t>(v);
}

}  // namespace

absl::StatusOr<IterationTrace> ReadMindSporeStepTrace(const std::filesystem::path& file) {
  auto table = CsvTable::Read(file.string());
  if (!table.ok()) return table.status();
  const CsvTable& t = *table;
  IterationTrace trace;
  trace.file = file;
  trace.format = IterationTraceFormat::kMindSporeStepTraceRaw;
  static const std::regex kName(R"(step_trace_raw_(\d+)_detail_time\.csv)");
  std::smatch m;
  const std::string name = file.filename().string();
  std::regex_match(name, m, kName);
  trace.rank = static_cast<uint32_t>(std::stoul(m[1].str()));
  trace.device = "npu:" + m[1].str();

  constexpr double kTickNs = 10;  // MindSpore writes 10 ns system-counter ticks
  size_t cols[5];
  const char* names[5] = {"step_num", "total", "iteration_interval", "fp_and_bp", "tail"};
  for (int i = 0; i < 5; ++i) {
    auto c = RequireColumn(t, names[i]);
    if (!c.ok()) return c.status();
    cols[i] = *c;
  }
  // Communication ops: a duration column `stream_*` with `<name>_start_point` and
  // `<name>_end_point` beside it (both the 2020 and the 2021+ layouts). Ops on different
  // streams overlap (their durations can add up to more than the step), so collective time
  // is the union of their [start, end] intervals; the duration is used only without them.
  struct CommOp {
    size_t duration;
    std::optional<size_t> start, end;
  };
  std::vector<CommOp> comm;
  for (size_t c = 0; c < t.header().size(); ++c) {
    const std::string& h = t.header()[c];
    if (h.starts_with("stream_") && !h.ends_with("_start_point") && !h.ends_with("_end_point")) {
      comm.push_back({c, t.Column(h + "_start_point"), t.Column(h + "_end_point")});
    }
  }
  std::vector<std::pair<double, double>> intervals;
  for (size_t row = 0; row < t.rows(); ++row) {
    if (t.Cell(row, cols[0]) == "-") continue;  // the averages row
    double v[5];
    for (int i = 0; i < 5; ++i) {
      auto n = t.Number(row, cols[i]);
      if (!n.ok()) return n.status();
      if (!n->has_value() && i != 4) {
        return absl::InvalidArgumentError(file.string() + ":" + std::to_string(t.line_of(row)) +
                                          ": column '" + names[i] + "' is empty");
      }
      v[i] = n->value_or(-1);
    }
    auto step = StepNumber(t, row, v[0]);
    if (!step.ok()) return step.status();
    v1::StepRecord r;
    r.set_step(*step);
    r.set_step_time_ns(Ns(v[1], kTickNs));
    r.set_dataloader_ns(Ns(v[2], kTickNs));
    r.set_forward_backward_ns(Ns(v[3], kTickNs));
    if (v[4] >= 0) r.set_optimizer_ns(Ns(v[4], kTickNs));  // absent in inference traces
    if (!comm.empty()) {
      double loose = 0;  // durations of ops without start and end points
      intervals.clear();
      for (const CommOp& op : comm) {
        std::optional<double> start, end;
        if (op.start && op.end) {
          auto a = t.Number(row, *op.start);
          auto b = t.Number(row, *op.end);
          if (!a.ok()) return a.status();
          if (!b.ok()) return b.status();
          start = *a;
          end = *b;
        }
        if (start && end && *end > *start) {
          intervals.emplace_back(*start, *end);
        } else if (!op.start || !op.end) {
          auto n = t.Number(row, op.duration);
          if (!n.ok()) return n.status();
          loose += n->value_or(0);
        }
      }
      std::sort(intervals.begin(), intervals.end());
      double covered = 0, cur_start = 0, cur_end = -1;
      for (const auto& [a, b] : intervals) {
        if (a > cur_end) {
          if (cur_end > cur_start) covered += cur_end - cur_start;
          cur_start = a;
          cur_end = b;
        } else {
          cur_end = std::max(cur_end, b);
        }
      }
      if (cur_end > cur_start) covered += cur_end - cur_start;
      r.set_collective_ns(Ns(covered + loose, kTickNs));
    }
    trace.steps.push_back(r);
  }
  if (trace.steps.empty()) return absl::InvalidArgumentError(file.string() + ": no step rows");
  return trace;
}

absl::StatusOr<IterationTrace> ReadTorchNpuStepTrace(const std::filesystem::path& file) {
  auto table = CsvTable::Read(file.string());
  if (!table.ok()) return table.status();
  const CsvTable& t = *table;
  IterationTrace trace;
  trace.file = file;
  trace.format = IterationTraceFormat::kTorchNpuStepTraceTime;
  // Rank: profiler_info_<rank>.json beside ASCEND_PROFILER_OUTPUT, else rank<N>_ascend_pt.
  const std::filesystem::path run_dir = file.parent_path().parent_path();
  bool have_rank = false;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(run_dir, ec)) {
    static const std::regex kInfo(R"(profiler_info_(\d+)\.json)");
    std::smatch m;
    const std::string n = entry.path().filename().string();
    if (std::regex_match(n, m, kInfo)) {
      trace.rank = static_cast<uint32_t>(std::stoul(m[1].str()));
      have_rank = true;
    }
  }
  if (!have_rank) {
    static const std::regex kDir(R"(rank(\d+)_ascend_pt)");
    std::smatch m;
    const std::string n = run_dir.filename().string();
    if (!std::regex_match(n, m, kDir)) {
      return absl::InvalidArgumentError(
          file.string() +
          ": cannot tell the rank (no "
          "profiler_info_<rank>.json, no rank<N>_ascend_pt directory)");
    }
    trace.rank = static_cast<uint32_t>(std::stoul(m[1].str()));
  }
  trace.device = "npu:" + std::to_string(trace.rank);

  const char* names[] = {"Step", "Computing", "Communication(Not Overlapped)", "Stage",
                         "Preparing"};
  size_t cols[5];
  for (int i = 0; i < 5; ++i) {
    auto c = RequireColumn(t, names[i]);
    if (!c.ok()) return c.status();
    cols[i] = *c;
  }
  constexpr double kUsNs = 1000;
  for (size_t row = 0; row < t.rows(); ++row) {
    double v[5];
    for (int i = 0; i < 5; ++i) {
      auto n = t.Number(row, cols[i]);
      if (!n.ok()) return n.status();
      v[i] = n->value_or(0);
    }
    if (!t.Number(row, cols[0]).value().has_value()) continue;  // no step id (N/A)
    // Preparing can hold an absolute timestamp in some exports: not a duration.
    if (v[4] > 1e12) v[4] = 0;
    auto step = StepNumber(t, row, v[0]);
    if (!step.ok()) return step.status();
    v1::StepRecord r;
    r.set_step(*step);
    r.set_dataloader_ns(Ns(v[4], kUsNs));
    r.set_collective_ns(Ns(v[2], kUsNs));
    r.set_forward_backward_ns(Ns(v[1] + v[2], kUsNs));
    r.set_step_time_ns(Ns(v[4] + v[3], kUsNs));
    trace.steps.push_back(r);
  }
  if (trace.steps.empty()) return absl::InvalidArgumentError(file.string() + ": no step rows");
  return trace;
}

}  // namespace rankwatch
