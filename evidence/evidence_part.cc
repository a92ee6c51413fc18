#include "evidence/evidence_part.h"

#include <chrono>
#include <utility>

#include "metrics/prometheus_registry.h"

namespace rankwatch {

absl::Status EvidencePart::Start(PartContext& context) {
  const PartEnvironment& env = context.environment();
  const auto deadline = std::chrono::duration_cast<std::chrono::seconds>(options_.capture_deadline);
  FlightRecorderInspectorOptions fr_options;
  fr_options.settle =
      std::chrono::duration_cast<std::chrono::milliseconds>(options_.flight_recorder_settle);
  // Requests go on the control topic, never blocking: a full local queue refuses the request.
  if (!options_.control_topic.empty()) {
    auto producer =
        ControlRequestProducer::Create({env.brokers, options_.control_topic, deadline, env.kafka});
    if (!producer.ok()) return producer.status();
    producer_ = std::move(*producer);
    ControlRequestProducer* p = producer_.get();
    auto send = [p](const std::string& key, const std::string& payload) {
      return p->Send(key, payload);
    };
    CaptureStoreOptions capture_options;
    capture_options.default_steps = static_cast<uint32_t>(options_.capture_steps);
    capture_options.auto_capture = options_.auto_capture;
    capture_options.auto_interval =
        std::chrono::duration_cast<std::chrono::seconds>(options_.capture_interval);
    capture_options.answer_deadline = deadline;
    captures_ = std::make_unique<CaptureStore>(capture_options, send);
    if (options_.hang_stacks) hang_ = std::make_unique<HangInspector>(HangInspectorOptions{}, send);
    if (options_.flight_recorder) {
      flight_recorder_ = std::make_unique<FlightRecorderInspector>(fr_options, send);
    }
  }
  if (flight_recorder_ == nullptr) {
    flight_recorder_ = std::make_unique<FlightRecorderInspector>(fr_options, nullptr);
  }
  if (hang_ != nullptr) context.HookTick(hang_.get());
  context.HookTick(flight_recorder_.get());
  if (captures_ != nullptr) context.HookTick(captures_.get());
  if (captures_ != nullptr) context.services().Offer<CaptureStore>(captures_.get());
  if (hang_ != nullptr) context.services().Offer<HangInspector>(hang_.get());
  context.services().AddDiagnosis(this);
  RegisterMetrics(env.registry);
  return absl::OkStatus();
}

void EvidencePart::AddTo(const JobSnapshot& job, v1::Diagnosis* diagnosis) const {
  const std::string& name = job.training_job;
  if (captures_ != nullptr) {
    if (auto c = captures_->LatestComparison(name, kEvidenceCaptureRows)) {
      *diagnosis->mutable_capture() = std::move(*c);
    }
  }
  if (hang_ != nullptr && job.step.label == StepLabel::kHang) {
    if (auto s = hang_->Get(name)) *diagnosis->mutable_hang_stacks() = std::move(*s);
  }
  if (auto v = flight_recorder_->Get(name)) *diagnosis->mutable_flight_recorder() = std::move(*v);
}

void EvidencePart::RegisterMetrics(PrometheusRegistry* r) const {
  MetricFamily* hang_stacks = r->Counter(
      "rankwatch_hang_stacks_total",
      "Stacks requests to the ranks of hung jobs: requested, send_failed, and settled complete "
      "(every rank's stacks) or partial (some ranks missing at the deadline).",
      {"result"});
  MetricCell* hang_requested = hang_stacks->WithLabels({"requested"});
  MetricCell* hang_send_failed = hang_stacks->WithLabels({"send_failed"});
  MetricCell* hang_complete = hang_stacks->WithLabels({"complete"});
  MetricCell* hang_partial = hang_stacks->WithLabels({"partial"});
  MetricFamily* fr_dumps = r->Counter(
      "rankwatch_flight_recorder_dumps_total",
      "PyTorch Flight Recorder dumps the node agents published: kept, or dropped (over the "
      "inspector's bounds on jobs and bytes).",
      {"result"});
  MetricCell* fr_kept = fr_dumps->WithLabels({"kept"});
  MetricCell* fr_dropped = fr_dumps->WithLabels({"dropped"});
  MetricFamily* fr_requests =
      r->Counter("rankwatch_flight_recorder_requests_total",
                 "Flight Recorder dump requests to the ranks of hung jobs: requested, send_failed.",
                 {"result"});
  MetricCell* fr_requested = fr_requests->WithLabels({"requested"});
  MetricCell* fr_send_failed = fr_requests->WithLabels({"send_failed"});
  MetricCell* fr_analyses =
      r->Counter("rankwatch_flight_recorder_analyses_total",
                 "Analyses of a job's Flight Recorder dumps (each gives a verdict).", {})
          ->WithLabels({});
  const HangInspector* hang = hang_.get();
  const FlightRecorderInspector* fr = flight_recorder_.get();
  r->OnScrape([=] {
    if (hang != nullptr) {
      const HangInspectorCounters h = hang->counters();
      hang_requested->Set(static_cast<double>(h.requests));
      hang_send_failed->Set(static_cast<double>(h.send_failures));
      hang_complete->Set(static_cast<double>(h.settled_all));
      hang_partial->Set(static_cast<double>(h.settled_partial));
    }
    const FlightRecorderInspectorCounters f = fr->counters();
    fr_kept->Set(static_cast<double>(f.dumps));
    fr_dropped->Set(static_cast<double>(f.dumps_dropped));
    fr_requested->Set(static_cast<double>(f.requests));
    fr_send_failed->Set(static_cast<double>(f.send_failures));
    fr_analyses->Set(static_cast<double>(f.analyses));
  });
}

}  // namespace rankwatch
