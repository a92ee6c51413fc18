// EvidencePart: the evidence rankwatchd fetches from a job's ranks (docs/architecture.md,
// "Evidence") as a part of the daemon (parts/daemon_part.h). It owns the control channel's
// producer and each kind of evidence — captures, hang stacks, Flight Recorder dumps — hooks them
// on the tick in the order they must run (hang stacks first, then the Flight Recorder verdict,
// so that a hang alert published again with either still gets the other, then captures, so it
// also gets the newest comparison), offers the capture store and the hang inspector to the
// queries, adds each kind to a job's diagnosis, and registers their metric families (read at
// scrape).
//
// Requests to the collectors need the control topic; without one there are no captures and no
// hang stacks, but the Flight Recorder dumps the node agents publish (PyTorch writes them on its
// watchdog timeout) are analyzed all the same.
//
// Thread-safe once started (the kinds are; queries read them from any thread).
#pragma once

#include <memory>
#include <string>

#include "evidence/capture_store.h"
#include "evidence/flight_recorder_inspector.h"
#include "evidence/hang_inspector.h"
#include "kafka/control_request_producer.h"
#include "operators/time.h"
#include "parts/daemon_part.h"

namespace rankwatch {

struct EvidencePartOptions {
  // Topic of the control channel to the collectors; empty: no requests (no captures, no hang
  // stacks). Default: "rankwatch.control".
  std::string control_topic = "rankwatch.control";
  bool auto_capture = true;  // a firing straggler alert captures culprit + typical rank
  int capture_steps = 5;     // steps a capture profiles, per rank
  Duration capture_interval = std::chrono::minutes(10);  // at most one automatic capture a job
  // The collectors must take a request this soon; it is not retried after. Default: 60 s.
  Duration capture_deadline = std::chrono::seconds(60);
  // A job diagnosed hung: its ranks are asked for their stacks (on the control topic).
  bool hang_stacks = true;
  // A job diagnosed hung: its ranks are asked for their Flight Recorder dumps (control topic).
  bool flight_recorder = true;
  // A job's Flight Recorder dumps are analyzed this long after the newest one when not every
  // rank's came. Default: 2 s.
  Duration flight_recorder_settle = std::chrono::seconds(2);
};

class EvidencePart : public DaemonPart, public DiagnosisContributor {
 public:
  explicit EvidencePart(EvidencePartOptions options) : options_(std::move(options)) {}

  std::string_view name() const override { return "evidence"; }
  absl::Status Start(PartContext& context) override;

  // The newest capture comparison, a hung job's stacks, the Flight Recorder verdict.
  void AddTo(const JobSnapshot& job, v1::Diagnosis* diagnosis) const override;

 private:
  void RegisterMetrics(PrometheusRegistry* registry) const;

  const EvidencePartOptions options_;
  std::unique_ptr<ControlRequestProducer> producer_;
  std::unique_ptr<CaptureStore> captures_;                    // null without a control topic
  std::unique_ptr<HangInspector> hang_;                       // null without one, or when off
  std::unique_ptr<FlightRecorderInspector> flight_recorder_;  // always
};

}  // namespace rankwatch
