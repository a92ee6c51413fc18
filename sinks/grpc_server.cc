#include "sinks/grpc_server.h"

#include <cmath>

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include <chrono>
#include <fstream>
#include <sstream>

#include "rankwatch/v1/service.grpc.pb.h"
#include "sinks/diagnosis_proto.h"
#include "sinks/timeline.h"

namespace rankwatch {
namespace {

constexpr char kServiceName[] = "rankwatch.v1.RankWatch";
constexpr char kStateServiceName[] = "rankwatch.state";

class RankWatchService final : public v1::RankWatch::Service {
 public:
  RankWatchService(const SnapshotStore* snapshots, AlertHub* alerts,
                   const KernelSnapshotStore* kernels, CaptureStore* captures,
                   const HangInspector* hang, const StateStore* state)
      : snapshots_(snapshots),
        alerts_(alerts),
        kernels_(kernels),
        captures_(captures),
        hang_(hang),
        state_(state) {}

  grpc::Status ListJobs(grpc::ServerContext*, const v1::ListJobsRequest*,
                        v1::ListJobsResponse* response) override {
    for (const auto& [job, snapshot] : *snapshots_->Get()) {
      const JobSnapshot& s = *snapshot;
      v1::JobSummary* j = response->add_jobs();
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
      if (alerts_ != nullptr) {
        for (const std::string& id : alerts_->Firing(job)) j->add_firing_alerts(id);
      }
    }
    return grpc::Status::OK;
  }

  grpc::Status GetDiagnosis(grpc::ServerContext*, const v1::GetDiagnosisRequest* request,
                            v1::Diagnosis* response) override {
    auto snapshots = snapshots_->Get();
    auto it = snapshots->find(request->training_job());
    if (it == snapshots->end()) {
      return {grpc::StatusCode::NOT_FOUND, "no training job '" + request->training_job() + "'"};
    }
    ToProto(*it->second, it->second->evaluated_unix_ns, response);
    if (captures_ != nullptr) {
      if (auto c = captures_->LatestComparison(request->training_job(), kEvidenceCaptureRows)) {
        *response->mutable_capture() = std::move(*c);
      }
    }
    if (hang_ != nullptr && it->second->step.label == StepLabel::kHang) {
      if (auto s = hang_->Get(request->training_job())) {
        *response->mutable_hang_stacks() = std::move(*s);
      }
    }
    return grpc::Status::OK;
  }

  grpc::Status GetRankDetail(grpc::ServerContext*, const v1::GetRankDetailRequest* request,
                             v1::RankDetail* response) override {
    auto snapshots = snapshots_->Get();
    auto it = snapshots->find(request->training_job());
    if (it == snapshots->end()) {
      return {grpc::StatusCode::NOT_FOUND, "no training job '" + request->training_job() + "'"};
    }
    const JobSnapshot& s = *it->second;
    const uint32_t rank = request->rank();
    if (rank >= s.world_size) {
      return {grpc::StatusCode::OUT_OF_RANGE, "training job '" + s.training_job + "' has " +
                                                  std::to_string(s.world_size) + " ranks"};
    }
    response->set_training_job(s.training_job);
    response->set_rank(rank);
    response->set_node(s.NodeOf(rank));
    response->set_pod(s.PodOf(rank));
    response->set_last_step(s.window_last_step);
    response->set_window_steps(s.window_steps);
    if (s.rank_totals && rank < s.rank_totals->size()) {
      const auto& totals = (*s.rank_totals)[rank];
      for (int p = 0; p < kPhaseCount; ++p) {
        const double mean = WindowMean(totals, static_cast<Phase>(p));  // NaN: not reported
        if (std::isnan(mean)) continue;
        v1::RankPhase* phase = response->add_phases();
        phase->set_phase(ToProto(static_cast<Phase>(p)));
        phase->set_seconds(mean);
        phase->set_excess_seconds(mean - s.phases[p].median_seconds);
      }
    }
    if (s.rank_peak_allocated && rank < s.rank_peak_allocated->size()) {
      response->set_peak_allocated_bytes((*s.rank_peak_allocated)[rank]);
    }
    if (s.rank_peak_reserved && rank < s.rank_peak_reserved->size()) {
      response->set_peak_reserved_bytes((*s.rank_peak_reserved)[rank]);
    }
    if (kernels_ != nullptr) {
      if (auto job = kernels_->Get(s.training_job)) {
        if (const kernel::RankKernelSummary* r = job->Rank(rank)) {
          FillKernel(*r, *job, response->mutable_kernel());
        }
      }
    }
    return grpc::Status::OK;
  }

  grpc::Status WatchAlerts(grpc::ServerContext* context, const v1::WatchAlertsRequest* request,
                           grpc::ServerWriter<v1::Alert>* writer) override {
    if (alerts_ == nullptr) return {grpc::StatusCode::UNAVAILABLE, "alerts are not enabled"};
    AlertFilter filter;
    filter.training_job = request->training_job();
    for (int k : request->kinds()) filter.kinds.insert(k);
    filter.min_severity = request->min_severity();
    // Subscribe first, so nothing falls between the stored backlog and the live alerts.
    std::unique_ptr<AlertHub::Subscription> sub =
        alerts_->Subscribe(filter, [context] { context->TryCancel(); });
    uint64_t last_sent = request->after_sequence();
    bool writing = true;
    alerts_->Backlog(request->after_sequence(), sub->live_from(), filter,
                     [&](std::shared_ptr<const v1::Alert> a) {
                       if (writing && writer->Write(*a)) {
                         last_sent = a->sequence();
                       } else {
                         writing = false;
                       }
                     });
    if (!writing || context->IsCancelled())
      return {grpc::StatusCode::CANCELLED, "client went away"};
    if (request->backlog_only()) return grpc::Status::OK;
    while (true) {
      std::shared_ptr<const v1::Alert> alert;
      switch (sub->Next(std::chrono::milliseconds(500), &alert)) {
        case AlertHub::Subscription::Wait::kAlert:
          if (alert->sequence() <= last_sent) break;
          if (!writer->Write(*alert)) return {grpc::StatusCode::CANCELLED, "client went away"};
          last_sent = alert->sequence();
          break;
        case AlertHub::Subscription::Wait::kTimeout:
          if (context->IsCancelled()) return {grpc::StatusCode::CANCELLED, "client went away"};
          break;
        case AlertHub::Subscription::Wait::kOverflow:
          return {grpc::StatusCode::RESOURCE_EXHAUSTED,
                  "subscriber too slow: resume with after_sequence=" + std::to_string(last_sent)};
        case AlertHub::Subscription::Wait::kClosed:
          return {grpc::StatusCode::UNAVAILABLE,
                  "server shutting down: resume with after_sequence=" + std::to_string(last_sent)};
      }
    }
  }

  grpc::Status RequestCapture(grpc::ServerContext*, const v1::RequestCaptureRequest* request,
                              v1::Capture* response) override {
    if (captures_ == nullptr) {
      return {grpc::StatusCode::UNAVAILABLE, "captures are off (rankwatchd --control-topic \"\")"};
    }
    auto snapshots = snapshots_->Get();
    auto it = snapshots->find(request->training_job());
    if (it == snapshots->end()) {
      return {grpc::StatusCode::NOT_FOUND, "no training job '" + request->training_job() + "'"};
    }
    const JobSnapshot& s = *it->second;
    std::vector<uint32_t> ranks(request->ranks().begin(), request->ranks().end());
    int32_t culprit = -1, reference = -1;
    if (ranks.empty()) {
      const auto pair = CaptureStore::CulpritAndReference(s);
      if (!pair) {
        return {grpc::StatusCode::FAILED_PRECONDITION,
                "training job '" + s.training_job +
                    "' names no culprit rank now: say which ranks to capture"};
      }
      ranks = {pair->first, pair->second};
      culprit = static_cast<int32_t>(pair->first);
      reference = static_cast<int32_t>(pair->second);
    } else if (request->has_reference_rank()) {
      culprit = static_cast<int32_t>(ranks.front());
      reference = static_cast<int32_t>(request->reference_rank());
      ranks.push_back(request->reference_rank());
    }
    const int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                            std::chrono::system_clock::now().time_since_epoch())
                            .count();
    auto c = captures_->Request(s.training_job, std::move(ranks), culprit, reference,
                                request->steps(), "rankwatch capture", "", &s, now);
    if (!c.ok()) return ToGrpc(c.status());
    *response = std::move(*c);
    return grpc::Status::OK;
  }

  grpc::Status GetCapture(grpc::ServerContext*, const v1::GetCaptureRequest* request,
                          v1::GetCaptureResponse* response) override {
    if (captures_ == nullptr) return {grpc::StatusCode::UNAVAILABLE, "captures are off"};
    std::vector<v1::CaptureTrace> traces;
    auto c = captures_->Get(request->id(), request->with_events() ? &traces : nullptr);
    if (!c) return {grpc::StatusCode::NOT_FOUND, "no capture '" + request->id() + "'"};
    *response->mutable_capture() = std::move(*c);
    for (v1::CaptureTrace& t : traces) *response->add_traces() = std::move(t);
    return grpc::Status::OK;
  }

  grpc::Status ListCaptures(grpc::ServerContext*, const v1::ListCapturesRequest* request,
                            v1::ListCapturesResponse* response) override {
    if (captures_ == nullptr) return {grpc::StatusCode::UNAVAILABLE, "captures are off"};
    for (v1::Capture& c : captures_->List(request->training_job())) {
      *response->add_captures() = std::move(c);
    }
    return grpc::Status::OK;
  }

  grpc::Status GetTimeline(grpc::ServerContext*, const v1::GetTimelineRequest* request,
                           v1::Timeline* response) override {
    if (state_ == nullptr) return {grpc::StatusCode::UNAVAILABLE, "no state store"};
    auto snapshots = snapshots_->Get();
    auto it = snapshots->find(request->training_job());
    if (it == snapshots->end()) {
      return {grpc::StatusCode::NOT_FOUND, "no training job '" + request->training_job() + "'"};
    }
    auto timeline = BuildTimeline(*it->second, *request, *state_, alerts_, captures_);
    if (!timeline.ok()) return ToGrpc(timeline.status());
    *response = std::move(*timeline);
    return grpc::Status::OK;
  }

 private:
  static grpc::Status ToGrpc(const absl::Status& s) {
    switch (s.code()) {
      case absl::StatusCode::kInvalidArgument:
        return {grpc::StatusCode::INVALID_ARGUMENT, std::string(s.message())};
      case absl::StatusCode::kResourceExhausted:
        return {grpc::StatusCode::RESOURCE_EXHAUSTED, std::string(s.message())};
      case absl::StatusCode::kUnavailable:
        return {grpc::StatusCode::UNAVAILABLE, std::string(s.message())};
      default: return {grpc::StatusCode::INTERNAL, std::string(s.message())};
    }
  }

  static void FillKernel(const kernel::RankKernelSummary& r, const kernel::KernelJobSnapshot& job,
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

  const SnapshotStore* snapshots_;
  AlertHub* alerts_;
  const KernelSnapshotStore* kernels_;
  CaptureStore* captures_;
  const HangInspector* hang_;
  const StateStore* state_;
};

absl::StatusOr<std::string> ReadPem(const std::string& path, const char* what) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  if (!in || text.str().empty()) {
    return absl::InvalidArgumentError(std::string("cannot read the gRPC TLS ") + what + " " + path);
  }
  return text.str();
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> Credentials(const GrpcTlsOptions& tls) {
  if (tls.cert_file.empty() && tls.key_file.empty() && tls.client_ca_file.empty()) {
    return grpc::InsecureServerCredentials();
  }
  if (tls.cert_file.empty() || tls.key_file.empty()) {
    return absl::InvalidArgumentError("gRPC TLS needs both a certificate and a key file");
  }
  auto cert = ReadPem(tls.cert_file, "certificate");
  if (!cert.ok()) return cert.status();
  auto key = ReadPem(tls.key_file, "key");
  if (!key.ok()) return key.status();
  grpc::SslServerCredentialsOptions ssl;
  ssl.pem_key_cert_pairs.push_back({*key, *cert});
  if (!tls.client_ca_file.empty()) {
    auto ca = ReadPem(tls.client_ca_file, "client CA");
    if (!ca.ok()) return ca.status();
    ssl.pem_root_certs = *ca;
    ssl.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  return grpc::SslServerCredentials(ssl);
}

}  // namespace

absl::StatusOr<std::unique_ptr<GrpcServer>> GrpcServer::Start(const GrpcServerOptions& options) {
  auto credentials = Credentials(options.tls);
  if (!credentials.ok()) return credentials.status();
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  auto self = std::unique_ptr<GrpcServer>(new GrpcServer());
  self->service_ =
      std::make_unique<RankWatchService>(options.snapshots, options.alerts, options.kernels,
                                         options.captures, options.hang, options.state);
  self->alerts_ = options.alerts;
  grpc::ServerBuilder builder;
  int port = 0;
  const ListenAddress& address = options.address;
  const std::string host =
      address.host.find(':') != std::string::npos ? "[" + address.host + "]" : address.host;
  builder.AddListeningPort(host + ":" + std::to_string(address.port), *credentials, &port);
  builder.RegisterService(self->service_.get());
  self->server_ = builder.BuildAndStart();
  if (!self->server_ || port == 0) {
    return absl::UnavailableError("cannot listen for gRPC on " + address.ToString());
  }
  self->address_ = address;
  self->address_.port = port;
  self->SetServing(true);
  self->SetStateHealthy(true);
  return self;
}

GrpcServer::~GrpcServer() { Stop(); }

void GrpcServer::SetServing(bool serving) {
  if (!server_) return;
  if (auto* health = server_->GetHealthCheckService()) {
    health->SetServingStatus(serving);
  }
}

void GrpcServer::SetStateHealthy(bool healthy) {
  if (!server_) return;
  if (auto* health = server_->GetHealthCheckService()) {
    health->SetServingStatus("", healthy);
    health->SetServingStatus(kStateServiceName, healthy);
    health->SetServingStatus(kServiceName, true);
  }
}

void GrpcServer::Stop() {
  if (!server_) return;
  if (alerts_ != nullptr) alerts_->Close();
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  server_->Wait();
  server_.reset();
}

}  // namespace rankwatch
