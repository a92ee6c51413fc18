// Accuracy of the step-time diagnosis on simulated fleets (issue #3, acceptance 3).
//
// Matrix: fault kind (one slow rank in compute, one slow rank in input, one slow node in
// compute, one slow rank outside every measured phase: slow-host, host code between forward and
// backward) x magnitude (5, 10, 20, 30, 50% of the nominal step added on the culprit) x job size
// (8, 64, 512 ranks; node faults only where a job has several nodes) x synchronisation (DDP with
// collective times, DDP without, none) x seeds. Each run has 100 healthy steps (a full window),
// then the fault from step 100 for 100 steps; the diagnosis is evaluated after every aligned
// step, as rankwatchd does.
//
// --long-steps N: besides, one balanced 512-rank job per synchronisation runs N steps, and the
// evaluations that name a straggler are counted per balanced rank-step (the false-positive rate
// of a long run).
//
// Reports per cell: detection rate (the right label naming the right culprit within the 100
// steps), wrong-culprit rate (a straggler label naming anyone else at any step), and the
// median steps from onset to detection; and false positives: balanced runs (no fault) with a
// straggler label at any step. Prints a table, the labels the diagnosis gave (at detection, and
// at the last step of the fault) per kind and synchronisation for magnitudes >= 20%, and a JSON
// summary line (all kinds, and per kind).
//
// Then the pipeline-parallel jobs of issue #34 (benchmarks/accuracy_pipeline.h): a slow worker,
// an imbalanced stage, sequence imbalance, GC pauses at 10 and 20 % slowdown, and balanced jobs.
//
// Usage: accuracy_benchmark [--seeds 3] [--kind NAME]... [--layout NAME]... [--long-steps N]
//                           [--flat-only | --pipeline-only]
// (kinds: compute, input, node-compute, host; slow-worker, stage-imbalance, sequence-imbalance,
// gc; --layout: the pipeline layouts, accuracy_pipeline.h). The flat part runs unless only
// pipeline kinds are named, and the other way round.
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "benchmarks/accuracy_pipeline.h"
#include "collectors/simulator/fleet_model.h"
#include "operators/step_time_diagnosis.h"

namespace rankwatch {
namespace {

constexpr uint64_t kWarmup = 100;
constexpr uint64_t kFaultSteps = 100;

struct Kind {
  const char* name;
  const char* fault;     // KIND:TARGET, magnitude appended
  double share_of_step;  // nominal share of the step the fault multiplies (1: it adds M x step)
  StepLabel expected;
  StepLabel also_accepted;  // a second label that counts as detection (= expected if none)
  bool node;
};

// slow-host: the rank's own excess is outside every measured phase (the time sits in its step
// time only), so the spec's own-time score names it; the label is `straggler` with cause
// "outside" by the spec's second wave, `compute_straggler` is accepted too (both name rank 3).
// The shares come from the simulator, so that a fault adds `magnitude` of the step whatever the
// nominal split (the dataloader was 10% of the step before 9194ab1, 5% since).
constexpr double kComputeShare = PhaseShares::kForward + PhaseShares::kBackward;
constexpr Kind kKinds[] = {
    {"compute", "slow-compute:3", kComputeShare, StepLabel::kComputeStraggler,
     StepLabel::kComputeStraggler, false},
    {"input", "slow-input:3", PhaseShares::kDataloader, StepLabel::kInputStraggler,
     StepLabel::kInputStraggler, false},
    {"node-compute", "slow-compute:node0", kComputeShare, StepLabel::kComputeStraggler,
     StepLabel::kComputeStraggler, true},
    {"host", "slow-host:3", 1.00, StepLabel::kStraggler, StepLabel::kComputeStraggler, false},
};

struct Sync {
  const char* name;
  FleetOptions::Sync sync;
  bool collective;
};

constexpr Sync kSyncs[] = {
    {"ddp+collective", FleetOptions::Sync::kDdp, true},
    {"ddp", FleetOptions::Sync::kDdp, false},
    {"none", FleetOptions::Sync::kNone, true},
};

bool IsStraggler(StepLabel l) {
  return l == StepLabel::kStraggler || l == StepLabel::kInputStraggler ||
         l == StepLabel::kComputeStraggler;
}

// "straggler/outside": the label, and for straggler labels where the excess sits.
std::string LabelName(const StepDiagnosis& d) {
  std::string name(StepLabelName(d.label));
  if (IsStraggler(d.label)) name += "/" + std::string(StragglerCauseName(d.cause));
  return name;
}

struct Outcome {
  bool detected = false;
  bool wrong_culprit = false;
  bool false_positive = false;  // straggler label before the onset (or in a balanced run)
  uint64_t steps_to_detect = 0;
  std::string detected_label;  // when the right culprit was first named ("label/cause")
  std::string final_label;     // at the last step of the fault
};

Outcome Run(uint32_t ranks, const Sync& sync, const Kind* kind, double magnitude, uint64_t seed,
            uint64_t steps = kWarmup + kFaultSteps, uint64_t* straggler_evaluations = nullptr) {
  FleetOptions o;
  o.ranks = ranks;
  o.sync = sync.sync;
  o.report_collective = sync.collective;
  o.seed = seed;
  if (kind != nullptr) {
    // The fault multiplies a phase; scale it so the culprit gains `magnitude` of a step.
    const double m = magnitude / kind->share_of_step;
    o.faults.push_back(*ParseFaultSpec(fmt::format("{}:{}:{}", kind->fault, m, kWarmup)));
  }
  FleetModel model(o);
  StepWindow window(ranks, {.steps = 100});
  std::vector<std::string> nodes;
  for (uint32_t r = 0; r < ranks; ++r) nodes.push_back(model.NodeName(r));
  const std::vector<uint32_t> node0 = [&] {
    std::vector<uint32_t> v;
    for (uint32_t r = 0; r < std::min(ranks, o.ranks_per_node); ++r) v.push_back(r);
    return v;
  }();
  std::vector<v1::StepRecord> rec;
  std::vector<bool> rep;
  Outcome out;
  for (uint64_t s = 0; s < steps; ++s) {
    model.Step(s, &rec, &rep);
    AlignedStep a{s, ranks, false, {}};
    for (uint32_t r = 0; r < ranks; ++r) a.samples.push_back(ToStepSample(rec[r], r));
    window.Add(a);
    const StepDiagnosis d = DiagnoseStepTime(window, nodes, {}, {});
    out.final_label = LabelName(d);
    if (!IsStraggler(d.label)) continue;
    if (straggler_evaluations != nullptr) ++*straggler_evaluations;
    if (kind == nullptr || s < kWarmup) {
      out.false_positive = true;
      continue;
    }
    // Wrong: naming any rank outside the injected set. For a node fault, naming one of the
    // node's ranks alone (while the others are still below the threshold) is imprecise but
    // not wrong; detection needs the node itself.
    const std::vector<uint32_t> truth = kind->node ? node0 : std::vector<uint32_t>{3};
    for (uint32_t r : d.culprit_ranks) {
      if (std::find(truth.begin(), truth.end(), r) == truth.end()) out.wrong_culprit = true;
    }
    const bool exact = kind->node ? (d.scope == CulpritScope::kNode && d.culprit_node == "node-0" &&
                                     d.culprit_ranks == node0)
                                  : d.culprit_ranks == truth;
    if (exact && !out.detected && (d.label == kind->expected || d.label == kind->also_accepted)) {
      out.detected = true;
      out.steps_to_detect = s - kWarmup + 1;
      out.detected_label = LabelName(d);
    }
  }
  return out;
}

using LabelCounts = std::map<std::string, int>;

std::string Distribution(const LabelCounts& counts) {
  std::string out;
  for (const auto& [label, n] : counts) {
    if (!out.empty()) out += ", ";
    out += fmt::format("{} {}", label, n);
  }
  return out.empty() ? "-" : out;
}

struct KindTotals {
  int runs = 0, detected = 0, wrong = 0;
  std::vector<double> steps;
};

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

}  // namespace
}  // namespace rankwatch

// The flat data-parallel matrix (the table, the labels, the balanced runs, the JSON line).
static void RunFlat(int seeds, const std::vector<std::string>& only, uint64_t long_steps) {
  using namespace rankwatch;
  const uint32_t sizes[] = {8, 64, 512};
  const double magnitudes[] = {0.05, 0.10, 0.20, 0.30, 0.50};

  std::printf("%-13s %-15s %5s %6s %9s %9s %7s\n", "kind", "sync", "mag", "runs", "detected",
              "wrong", "median");
  int at20_runs = 0, at20_detected = 0, wrong_total = 0, runs_total = 0;
  std::vector<double> at20_steps;
  std::map<std::string, KindTotals> by_kind;  // magnitudes >= 20%
  std::vector<std::string> label_lines;
  for (const Kind& kind : kKinds) {
    if (!only.empty() && std::find(only.begin(), only.end(), kind.name) == only.end()) continue;
    for (const Sync& sync : kSyncs) {
      LabelCounts at_detection{}, at_end{};
      for (double mag : magnitudes) {
        int runs = 0, detected = 0, wrong = 0;
        std::vector<double> steps;
        for (uint32_t size : sizes) {
          if (kind.node && size <= 8) continue;  // one node is the whole job: no straggler
          for (int seed = 1; seed <= seeds; ++seed) {
            const Outcome o = Run(size, sync, &kind, mag, static_cast<uint64_t>(seed));
            ++runs;
            detected += o.detected;
            wrong += o.wrong_culprit || o.false_positive;
            if (o.detected) steps.push_back(static_cast<double>(o.steps_to_detect));
            if (mag >= 0.20) {
              if (o.detected) ++at_detection[o.detected_label];
              ++at_end[o.final_label];
              KindTotals& t = by_kind[kind.name];
              ++t.runs;
              t.detected += o.detected;
              t.wrong += o.wrong_culprit || o.false_positive;
              if (o.detected) t.steps.push_back(static_cast<double>(o.steps_to_detect));
            }
          }
        }
        std::printf("%-13s %-15s %4.0f%% %6d %8.1f%% %8.1f%% %7.1f\n", kind.name, sync.name,
                    mag * 100, runs, 100.0 * detected / runs, 100.0 * wrong / runs, Median(steps));
        runs_total += runs;
        wrong_total += wrong;
        if (mag >= 0.20) {
          at20_runs += runs;
          at20_detected += detected;
          at20_steps.insert(at20_steps.end(), steps.begin(), steps.end());
        }
      }
      label_lines.push_back(fmt::format("{:<13} {:<15} at detection: {}; at the last step: {}",
                                        kind.name, sync.name, Distribution(at_detection),
                                        Distribution(at_end)));
    }
  }
  std::printf(
      "\nlabels (label/cause) of the runs at >= 20%%: when the right culprit was first named; at "
      "the last fault step\n");
  for (const std::string& line : label_lines) std::printf("%s\n", line.c_str());
  int balanced_runs = 0, false_positives = 0;
  for (const Sync& sync : kSyncs) {
    for (uint32_t size : sizes) {
      for (int seed = 1; seed <= seeds * 3; ++seed) {
        ++balanced_runs;
        false_positives += Run(size, sync, nullptr, 0, static_cast<uint64_t>(seed)).false_positive;
      }
    }
  }
  std::printf("\nbalanced runs: %d, with a straggler label at any step: %d\n", balanced_runs,
              false_positives);
  if (long_steps > 0) {
    for (const Sync& sync : kSyncs) {
      constexpr uint32_t kLongRanks = 512;
      uint64_t named = 0;
      Run(kLongRanks, sync, nullptr, 0, 1000, long_steps, &named);
      const double rank_steps = static_cast<double>(kLongRanks) * static_cast<double>(long_steps);
      std::printf(
          "long balanced run, %s: %u ranks x %llu steps, %llu evaluations named a "
          "straggler: %.3f per 100,000 rank-steps\n",
          sync.name, kLongRanks, static_cast<unsigned long long>(long_steps),
          static_cast<unsigned long long>(named), 1e5 * static_cast<double>(named) / rank_steps);
    }
  }
  std::printf(
      "{\"detection_rate_at_20pct_plus\": %.4f, \"median_steps_to_detect_at_20pct_plus\": %.1f, "
      "\"wrong_culprit_runs\": %d, \"fault_runs\": %d, \"false_positive_runs\": %d, "
      "\"balanced_runs\": %d, \"by_kind_at_20pct_plus\": {%s}}\n",
      at20_runs ? static_cast<double>(at20_detected) / at20_runs : 0.0, Median(at20_steps),
      wrong_total, runs_total, false_positives, balanced_runs,
      [&] {
        std::string kinds;
        for (const Kind& kind : kKinds) {
          if (!by_kind.contains(kind.name)) continue;
          const KindTotals& t = by_kind[kind.name];
          if (!kinds.empty()) kinds += ", ";
          kinds += fmt::format(
              "\"{}\": {{\"runs\": {}, \"detection_rate\": {:.4f}, \"wrong_culprit_runs\": {}, "
              "\"median_steps_to_detect\": {:.1f}}}",
              kind.name, t.runs, t.runs ? static_cast<double>(t.detected) / t.runs : 0.0, t.wrong,
              Median(t.steps));
        }
        return kinds;
      }()
          .c_str());
}

int main(int argc, char** argv) {
  using namespace rankwatch;
  int seeds = 3;
  uint64_t long_steps = 0;
  std::vector<std::string> only;  // --kind: run only these flat kinds (default: every kind)
  accuracy::PipelineAccuracyOptions pipeline;
  bool flat_only = false, pipeline_only = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--flat-only") == 0) flat_only = true;
    if (std::strcmp(argv[i], "--pipeline-only") == 0) pipeline_only = true;
    if (i + 1 == argc) break;
    if (std::strcmp(argv[i], "--seeds") == 0) seeds = std::max(1, std::atoi(argv[i + 1]));
    if (std::strcmp(argv[i], "--long-steps") == 0)
      long_steps = std::strtoull(argv[i + 1], nullptr, 10);
    if (std::strcmp(argv[i], "--kind") == 0) {
      (accuracy::IsPipelineKind(argv[i + 1]) ? pipeline.kinds : only).push_back(argv[i + 1]);
    }
    if (std::strcmp(argv[i], "--layout") == 0 && accuracy::IsPipelineLayout(argv[i + 1])) {
      pipeline.layouts.push_back(argv[i + 1]);
    }
  }
  pipeline.seeds = seeds;
  const bool run_flat = !pipeline_only && (!only.empty() || pipeline.kinds.empty());
  const bool run_pipeline = !flat_only && (!pipeline.kinds.empty() || only.empty());
  if (run_flat) RunFlat(seeds, only, long_steps);
  if (run_pipeline) accuracy::RunPipelineAccuracy(pipeline);
  return 0;
}
