#include "benchmarks/accuracy_pipeline.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <utility>

#include "collectors/simulator/fleet_model.h"
#include "operators/step_time_diagnosis.h"
#include "operators/whatif/step_assembler.h"

namespace rankwatch::accuracy {
namespace {

constexpr uint64_t kWarmup = 32;      // healthy steps before the fault (false positives)
constexpr uint64_t kFaultSteps = 96;  // the what-if window (64) and half as much again
constexpr uint32_t kGcEvery = 4;      // a GC pause every 4th step
constexpr double kOpNoise = 0.02;     // FleetOptions' default
constexpr double kMagnitudes[] = {0.10, 0.20};

enum class Fault { kSlowWorker, kStageImbalance, kSequenceImbalance, kGc };

struct Kind {
  const char* name;
  Fault fault;
  const char* expected;  // the what-if verdict that names it
};

constexpr Kind kKinds[] = {
    {"slow-worker", Fault::kSlowWorker, "slow_worker"},
    {"stage-imbalance", Fault::kStageImbalance, "stage_imbalance"},
    {"sequence-imbalance", Fault::kSequenceImbalance, "sequence_imbalance"},
    {"gc", Fault::kGc, "gc_pauses"},
};

struct JobLayout {
  const char* name;
  PipelineSpec spec;
};

// 1F1B: the DP 4 x PP 4 x TP 2, the study's ST shape (DP 2 x PP 4), and a wide, short
// pipe. Then torch.distributed.pipelining's schedules (issue #49): interleaved 1F1B on the
// issue's shape, zero bubble with one chunk a stage (ZB-H1) and two (ZB1P), ZBV and DualPipeV.
using Sched = PipelineScheduleKind;
const JobLayout kLayouts[] = {
    {"dp4-pp4-tp2", {.dp = 4, .pp = 4, .tp = 2, .microbatches = 8}},
    {"dp2-pp4-tp1", {.dp = 2, .pp = 4, .tp = 1, .microbatches = 8}},
    {"dp8-pp2-tp2", {.dp = 8, .pp = 2, .tp = 2, .microbatches = 8}},
    {"dp4-pp4-tp2-interleaved",
     {.dp = 4, .pp = 4, .tp = 2, .microbatches = 8, .schedule = Sched::kInterleaved1F1B, .vpp = 2}},
    {"dp2-pp4-zbh1", {.dp = 2, .pp = 4, .microbatches = 8, .schedule = Sched::kZeroBubble}},
    {"dp2-pp4-zb1p",
     {.dp = 2, .pp = 4, .microbatches = 8, .schedule = Sched::kZeroBubble, .vpp = 2}},
    {"dp2-pp4-zbv", {.dp = 2, .pp = 4, .microbatches = 8, .schedule = Sched::kZbv, .vpp = 2}},
    {"dp4-pp4-dualpipev",
     {.dp = 4, .pp = 4, .microbatches = 8, .schedule = Sched::kDualPipeV, .vpp = 2}},
};

struct Scenario {
  const Kind* kind = nullptr;  // null: balanced
  const JobLayout* layout = nullptr;
  double magnitude = 0;
  uint64_t seed = 1;
  // The culprit: the slow worker (dp, stage), the long stage, the rank that pauses in GC (its
  // worker is (dp, stage)).
  uint32_t dp = 0, stage = 0, rank = 0;
  double parameter = 0;  // the calibrated factor, spread or pause (ms)

  std::vector<uint32_t> WorkerRanks() const {
    const PipelineSpec& p = layout->spec;
    std::vector<uint32_t> ranks;
    for (uint32_t t = 0; t < p.tp; ++t) ranks.push_back(t + p.tp * (dp + p.dp * stage));
    return ranks;
  }
};

Scenario MakeScenario(const Kind* kind, const JobLayout& layout, double magnitude, uint64_t seed) {
  const PipelineSpec& p = layout.spec;
  Scenario s{kind, &layout, magnitude, seed};
  // Over the seeds every stage (first, middle, last) and several replicas and tensor ranks.
  s.stage = static_cast<uint32_t>(seed % p.pp);
  s.dp = static_cast<uint32_t>((3 * seed + 1) % p.dp);
  s.rank = static_cast<uint32_t>(seed % p.tp) + p.tp * (s.dp + p.dp * s.stage);
  return s;
}

std::string FaultText(const Scenario& s, double x) {
  switch (s.kind->fault) {
    case Fault::kSlowWorker:
      return fmt::format("slow-worker:dp={},pp={},factor={}:{}", s.dp, s.stage, x, kWarmup);
    case Fault::kStageImbalance:
      return fmt::format("stage-imbalance:stage={},factor={}:{}", s.stage, x, kWarmup);
    case Fault::kSequenceImbalance:
      return fmt::format("sequence-imbalance:spread={}:{}", x, kWarmup);
    case Fault::kGc:
      return fmt::format("gc:rank={},every={},ms={}:{}", s.rank, kGcEvery, x, kWarmup);
  }
  return "";
}

FleetOptions Options(const Scenario& s, double noise, std::optional<double> parameter) {
  FleetOptions o;
  o.training_job = "pipeline";
  o.parallel = s.layout->spec;
  o.ranks = s.layout->spec.world_size();
  o.report_collective = true;
  o.seed = s.seed;
  o.op_noise = noise;
  if (s.kind != nullptr && parameter.has_value()) {
    auto fault = ParseFaultSpec(FaultText(s, *parameter));
    if (!fault.ok()) {
      std::fprintf(stderr, "accuracy_benchmark: %s\n",
                   std::string(fault.status().message()).c_str());
      std::abort();
    }
    o.faults.push_back(*fault);
  }
  if (absl::Status st = CheckFleetOptions(o); !st.ok()) {
    std::fprintf(stderr, "accuracy_benchmark: %s\n", std::string(st.message()).c_str());
    std::abort();
  }
  return o;
}

// Means over the fault's steps of the noiseless job: its step, its forward and backward ops
// (every worker's, from its tensor rank 0), per model chunk. A zero-bubble schedule's backward
// ops are the input-gradient part where a weight-gradient op of the same microbatch and chunk
// follows, full backwards (DualPipeV's) where none does.
struct JobMeans {
  double step_ns = 0, forward_us = 0, backward_us = 0, input_us = 0, weight_us = 0;
};

JobMeans Measure(const FleetOptions& o) {
  FleetModel model(o);
  const PipelineSpec& p = *o.parallel;
  std::vector<v1::StepRecord> records;
  std::vector<bool> reported;
  JobMeans m;
  double forwards = 0, backwards = 0, inputs = 0, weights = 0;
  for (uint64_t step = kWarmup; step < kWarmup + kFaultSteps; ++step) {
    model.Step(step, &records, &reported);
    m.step_ns += static_cast<double>(records[0].step_time_ns()) / kFaultSteps;
    for (uint32_t r = 0; r < records.size(); r += p.tp) {
      std::set<std::pair<uint32_t, uint32_t>> split;  // (microbatch, chunk) with a weight op
      for (const v1::OpRecord& op : records[r].ops()) {
        if (op.type() == v1::OP_BACKWARD_WEIGHT_COMPUTE) {
          split.emplace(op.microbatch(), op.model_chunk());
          m.weight_us += static_cast<double>(op.duration_us());
          ++weights;
        }
      }
      for (const v1::OpRecord& op : records[r].ops()) {
        const auto us = static_cast<double>(op.duration_us());
        if (op.type() == v1::OP_FORWARD_COMPUTE) {
          m.forward_us += us;
          ++forwards;
        } else if (op.type() == v1::OP_BACKWARD_COMPUTE &&
                   split.contains({op.microbatch(), op.model_chunk()})) {
          m.input_us += us;
          ++inputs;
        } else if (op.type() == v1::OP_BACKWARD_COMPUTE) {
          m.backward_us += us;
          ++backwards;
        }
      }
    }
  }
  m.forward_us /= forwards;
  m.backward_us = backwards > 0 ? m.backward_us / backwards : 0;
  m.input_us = inputs > 0 ? m.input_us / inputs : 0;
  m.weight_us = weights > 0 ? m.weight_us / weights : 0;
  return m;
}

// The slowdown S the fault causes, as the what-if study defines it, without noise: the job's
// mean step over the step of the same job with every forward and every backward at its kind's
// mean duration (the faults leave communication and the optimizer alone); a full backward
// beside split ones is ideally a mean input and a mean weight backward, as the what-if model
// takes it. A GC pause is part of the forward it interrupts, so the ideal spreads it over every
// forward. Also the slowdown against the job without the fault (`*job`).
double TrueSlowdown(const Scenario& s, double parameter, double* job = nullptr) {
  const JobMeans m = Measure(Options(s, 0, parameter));
  FleetOptions ideal = Options(s, 0, std::nullopt);
  FleetOptions::PipelineCosts costs = NominalPipelineCosts(ideal);
  const double chunks = s.layout->spec.vpp;  // the costs are a stage's, an op is a chunk's
  costs.forward = m.forward_us * chunks;
  costs.backward_input = m.input_us * chunks;
  costs.weight = m.weight_us * chunks;
  costs.backward = m.weight_us > 0 ? costs.backward_input + costs.weight : m.backward_us * chunks;
  ideal.pipeline_costs = costs;
  FleetModel model(ideal);
  std::vector<v1::StepRecord> records;
  std::vector<bool> reported;
  model.Step(kWarmup, &records, &reported);
  if (job != nullptr) *job = m.step_ns / Measure(Options(s, 0, std::nullopt)).step_ns;
  return m.step_ns / static_cast<double>(records[0].step_time_ns());
}

// The parameter at which TrueSlowdown is 1 + magnitude (bisection; S grows with it).
double Calibrate(const Scenario& s) {
  const double target = 1 + s.magnitude;
  double lo = 0, hi = 0;
  switch (s.kind->fault) {
    case Fault::kSlowWorker:
    case Fault::kStageImbalance: lo = 1, hi = 8; break;
    case Fault::kSequenceImbalance: lo = 0, hi = 0.99; break;
    case Fault::kGc: lo = 0, hi = 16.0 * kGcEvery * FleetOptions{}.step_ms; break;
  }
  if (TrueSlowdown(s, hi) < target) {
    std::fprintf(stderr, "accuracy_benchmark: %s cannot slow %s by %.0f%%\n", s.kind->name,
                 s.layout->name, 100 * s.magnitude);
    std::abort();
  }
  for (int i = 0; i < 30; ++i) {
    const double mid = (lo + hi) / 2;
    (TrueSlowdown(s, mid) < target ? lo : hi) = mid;
  }
  return hi;
}

// What one of the daemon's per-job operators says after a step.
struct Reading {
  std::string label;                  // its label (and cause or culprit kind)
  bool finding = false;               // it names a cause: neither balanced nor undecided
  bool right = false;                 // the scenario's cause with the scenario's culprit
  bool names_something_else = false;  // a finding with another cause or culprit
  double slowdown = 0;                // the what-if S; 0: the reader has none
};

class Reader {
 public:
  virtual ~Reader() = default;
  virtual void Add(uint64_t step, const FleetModel& model,
                   const std::vector<v1::StepRecord>& records) = 0;
  virtual Reading Read(const Scenario& s) = 0;
};

bool IsStraggler(StepLabel l) {
  return l == StepLabel::kStraggler || l == StepLabel::kInputStraggler ||
         l == StepLabel::kComputeStraggler;
}

// Today's step-time diagnosis (DiagnoseStepTime over a StepWindow of the ranks' phases), as
// rankwatchd runs it for every job: right only when it names exactly a slow worker's ranks.
class FlatReader : public Reader {
 public:
  explicit FlatReader(const FleetModel& model)
      : ranks_(model.options().ranks), window_(ranks_, {.steps = 100}) {
    for (uint32_t r = 0; r < ranks_; ++r) nodes_.push_back(model.NodeName(r));
  }
  void Add(uint64_t step, const FleetModel&, const std::vector<v1::StepRecord>& records) override {
    AlignedStep a{step, ranks_, false, {}};
    for (uint32_t r = 0; r < ranks_; ++r) a.samples.push_back(ToStepSample(records[r], r));
    window_.Add(a);
  }
  Reading Read(const Scenario& s) override {
    const StepDiagnosis d = DiagnoseStepTime(window_, nodes_, {}, {});
    Reading out;
    out.label = std::string(StepLabelName(d.label));
    if (!IsStraggler(d.label)) return out;
    out.label += "/" + std::string(StragglerCauseName(d.cause));
    out.finding = true;
    out.right = s.kind != nullptr && s.kind->fault == Fault::kSlowWorker &&
                d.culprit_ranks == s.WorkerRanks();
    out.names_something_else = !out.right;
    return out;
  }

 private:
  uint32_t ranks_;
  StepWindow window_;
  std::vector<std::string> nodes_;
};

// The what-if verdict (operators/whatif/): the job's StepAssembler, as the job's JobPipeline
// runs it — every rank's record with its layout, the step aligned, then evaluated.
class WhatIfReader : public Reader {
 public:
  explicit WhatIfReader(const FleetModel&) : assembler_(whatif::AssemblerOptions{}) {}
  void Add(uint64_t step, const FleetModel& model,
           const std::vector<v1::StepRecord>& records) override {
    for (uint32_t r = 0; r < records.size(); ++r) assembler_.Add(r, model.LayoutOf(r), records[r]);
    assembler_.Aligned(step);
    assembler_.Evaluate();
  }
  Reading Read(const Scenario& s) override {
    Reading out;
    const auto snapshot = assembler_.snapshot();
    if (snapshot == nullptr) return {.label = "none"};
    const whatif::WhatIfVerdict& v = snapshot->verdict;
    out.label = std::string(whatif::VerdictName(v.verdict));
    out.slowdown = v.slowdown;
    out.finding = v.verdict != whatif::Verdict::kNone && v.verdict != whatif::Verdict::kBalanced;
    if (!out.finding || s.kind == nullptr) {
      out.names_something_else = out.finding && v.verdict != whatif::Verdict::kUnattributed;
      return out;
    }
    const bool worker =
        v.data_rank == static_cast<int32_t>(s.dp) && v.stage == static_cast<int32_t>(s.stage);
    switch (s.kind->fault) {
      case Fault::kSlowWorker:
        out.right = v.verdict == whatif::Verdict::kSlowWorker && worker;
        break;
      case Fault::kStageImbalance:
        out.right = v.verdict == whatif::Verdict::kStageImbalance &&
                    v.stage == static_cast<int32_t>(s.stage);
        break;
      case Fault::kSequenceImbalance:
        out.right = v.verdict == whatif::Verdict::kSequenceImbalance;
        break;
      case Fault::kGc:
        out.right = v.verdict == whatif::Verdict::kGcPauses && worker &&
                    std::find(v.ranks.begin(), v.ranks.end(), s.rank) != v.ranks.end();
        break;
    }
    out.names_something_else = !out.right && v.verdict != whatif::Verdict::kUnattributed;
    return out;
  }

 private:
  whatif::StepAssembler assembler_;
};

struct Outcome {
  bool detected = false;
  bool wrong = false;           // something else named after the onset
  bool false_positive = false;  // a finding before the onset, or in a balanced run
  uint64_t steps_to_detect = 0;
  std::string final_label;
  double final_slowdown = 0;
};

using ReaderFactory = std::unique_ptr<Reader> (*)(const FleetModel&);

struct ReaderKind {
  const char* name;
  ReaderFactory make;
};

const ReaderKind kReaders[] = {
    {"what-if",
     [](const FleetModel& m) -> std::unique_ptr<Reader> {
       return std::make_unique<WhatIfReader>(m);
     }},
    {"step-time",
     [](const FleetModel& m) -> std::unique_ptr<Reader> {
       return std::make_unique<FlatReader>(m);
     }},
};
constexpr size_t kReaderCount = std::size(kReaders);

// One run: the job with noise, every reader fed every step and read after it.
std::vector<Outcome> Run(const Scenario& s) {
  FleetModel model(Options(s, kOpNoise, s.kind ? std::optional(s.parameter) : std::nullopt));
  std::vector<std::unique_ptr<Reader>> readers;
  for (const ReaderKind& k : kReaders) readers.push_back(k.make(model));
  std::vector<Outcome> out(kReaderCount);
  std::vector<v1::StepRecord> records;
  std::vector<bool> reported;
  for (uint64_t step = 0; step < kWarmup + kFaultSteps; ++step) {
    model.Step(step, &records, &reported);
    for (size_t i = 0; i < kReaderCount; ++i) {
      readers[i]->Add(step, model, records);
      const Reading r = readers[i]->Read(s);
      Outcome& o = out[i];
      o.final_label = r.label;
      o.final_slowdown = r.slowdown;
      if (!r.finding) continue;
      if (s.kind == nullptr || step < kWarmup) {
        o.false_positive = true;
        continue;
      }
      o.wrong = o.wrong || r.names_something_else;
      if (r.right && !o.detected) {
        o.detected = true;
        o.steps_to_detect = step - kWarmup + 1;
      }
    }
  }
  return out;
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

std::string Distribution(const std::map<std::string, int>& counts) {
  std::string out;
  for (const auto& [label, n] : counts)
    out += (out.empty() ? "" : ", ") + fmt::format("{} {}", label, n);
  return out.empty() ? "-" : out;
}

struct Totals {
  int runs = 0, detected = 0, wrong = 0;
  std::vector<double> steps;
};

bool Selected(const PipelineAccuracyOptions& options, const JobLayout& layout) {
  return options.layouts.empty() || std::find(options.layouts.begin(), options.layouts.end(),
                                              layout.name) != options.layouts.end();
}

}  // namespace

bool IsPipelineLayout(const std::string& name) {
  return std::any_of(std::begin(kLayouts), std::end(kLayouts),
                     [&](const JobLayout& l) { return name == l.name; });
}

bool IsPipelineKind(const std::string& name) {
  return std::any_of(std::begin(kKinds), std::end(kKinds),
                     [&](const Kind& k) { return name == k.name; });
}

void RunPipelineAccuracy(const PipelineAccuracyOptions& options) {
  std::printf(
      "\npipeline-parallel jobs: %llu healthy steps, then the fault for %llu steps. mag: the "
      "slowdown S the fault causes; columns: runs, right verdict and culprit, something else "
      "named, median steps to the right one; medians of the reader's S at the last step, of the "
      "job's slowdown against the job without the fault, of the fault's parameter\n",
      static_cast<unsigned long long>(kWarmup), static_cast<unsigned long long>(kFaultSteps));
  struct Row {
    std::string key;  // kind, layout, magnitude
    std::vector<Totals> by_reader = std::vector<Totals>(kReaderCount);
    std::vector<std::vector<double>> slowdowns = std::vector<std::vector<double>>(kReaderCount);
    std::vector<double> parameters;
    std::vector<double> job_slowdowns;  // against the job without the fault
  };
  std::vector<Row> rows;
  std::vector<std::map<std::string, Totals>> by_kind(kReaderCount);
  std::vector<std::map<std::string, std::map<std::string, int>>> final_labels(kReaderCount);
  for (const Kind& kind : kKinds) {
    if (!options.kinds.empty() &&
        std::find(options.kinds.begin(), options.kinds.end(), kind.name) == options.kinds.end()) {
      continue;
    }
    for (const JobLayout& layout : kLayouts) {
      if (!Selected(options, layout)) continue;
      for (double mag : kMagnitudes) {
        Row row;
        row.key = fmt::format("{:<19} {:<23} {:4.0f}%", kind.name, layout.name, mag * 100);
        for (int seed = 1; seed <= options.seeds; ++seed) {
          Scenario s = MakeScenario(&kind, layout, mag, static_cast<uint64_t>(seed));
          s.parameter = Calibrate(s);
          row.parameters.push_back(s.parameter);
          double job = 0;
          TrueSlowdown(s, s.parameter, &job);
          row.job_slowdowns.push_back(job);
          const std::vector<Outcome> outcomes = Run(s);
          for (size_t i = 0; i < kReaderCount; ++i) {
            const Outcome& o = outcomes[i];
            for (Totals* t : {&row.by_reader[i], &by_kind[i][kind.name]}) {
              ++t->runs;
              t->detected += o.detected;
              t->wrong += o.wrong || o.false_positive;
              if (o.detected) t->steps.push_back(static_cast<double>(o.steps_to_detect));
            }
            row.slowdowns[i].push_back(o.final_slowdown);
            ++final_labels[i][kind.name][o.final_label];
          }
        }
        rows.push_back(std::move(row));
      }
    }
  }
  for (size_t i = 0; i < kReaderCount; ++i) {
    std::printf("\n%s: %-19s %-23s %5s %6s %9s %9s %7s %8s %8s  parameter\n", kReaders[i].name,
                "kind", "layout", "mag", "runs", "detected", "wrong", "median", "S seen", "job");
    for (const Row& row : rows) {
      const Totals& t = row.by_reader[i];
      const double slowdown = Median(row.slowdowns[i]);
      std::printf("%*s  %s %6d %8.1f%% %8.1f%% %7.1f %8s %8.3f  %.4g\n",
                  static_cast<int>(std::string(kReaders[i].name).size()), "", row.key.c_str(),
                  t.runs, 100.0 * t.detected / t.runs, 100.0 * t.wrong / t.runs, Median(t.steps),
                  slowdown > 0 ? fmt::format("{:.3f}", slowdown).c_str() : "-",
                  Median(row.job_slowdowns), Median(row.parameters));
    }
    for (const auto& [kind, counts] : final_labels[i]) {
      std::printf("%s: %-19s at the last step: %s\n", kReaders[i].name, kind.c_str(),
                  Distribution(counts).c_str());
    }
  }
  // Balanced jobs: any finding at any step is a false positive.
  std::vector<int> false_positives(kReaderCount, 0);
  std::vector<std::map<std::string, int>> balanced_labels(kReaderCount);
  int balanced_runs = 0;
  for (const JobLayout& layout : kLayouts) {
    if (!Selected(options, layout)) continue;
    for (int seed = 1; seed <= 3 * options.seeds; ++seed) {
      const Scenario s = MakeScenario(nullptr, layout, 0, static_cast<uint64_t>(seed));
      const std::vector<Outcome> outcomes = Run(s);
      ++balanced_runs;
      for (size_t i = 0; i < kReaderCount; ++i) {
        false_positives[i] += outcomes[i].false_positive;
        ++balanced_labels[i][outcomes[i].final_label];
      }
    }
  }
  std::string json;
  for (size_t i = 0; i < kReaderCount; ++i) {
    std::printf("%s: balanced runs %d, with a finding at any step %d; at the last step: %s\n",
                kReaders[i].name, balanced_runs, false_positives[i],
                Distribution(balanced_labels[i]).c_str());
    std::string kinds;
    int runs = 0, detected = 0, wrong = 0;
    for (const auto& [kind, t] : by_kind[i]) {
      runs += t.runs;
      detected += t.detected;
      wrong += t.wrong;
      kinds += fmt::format(
          "{}\"{}\": {{\"runs\": {}, \"detection_rate\": {:.4f}, \"wrong_runs\": {}, "
          "\"median_steps_to_detect\": {:.1f}}}",
          kinds.empty() ? "" : ", ", kind, t.runs,
          t.runs ? static_cast<double>(t.detected) / t.runs : 0.0, t.wrong, Median(t.steps));
    }
    json += fmt::format(
        "{}\"{}\": {{\"detection_rate_at_10pct_plus\": {:.4f}, \"wrong_runs\": {}, "
        "\"fault_runs\": {}, \"false_positive_runs\": {}, \"balanced_runs\": {}, "
        "\"by_kind\": {{{}}}}}",
        json.empty() ? "" : ", ", kReaders[i].name,
        runs ? static_cast<double>(detected) / runs : 0.0, wrong, runs, false_positives[i],
        balanced_runs, kinds);
  }
  std::printf("{\"pipeline\": {%s}}\n", json.c_str());
}

}  // namespace rankwatch::accuracy
