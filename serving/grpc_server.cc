#include "serving/grpc_server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include <chrono>
#include <fstream>
#include <sstream>

#include "alerting/alert_actions.h"
#include "common/wall_clock.h"
#include "evidence/capture_ranks.h"
#include "evidence/capture_store.h"
#include "rankwatch/v1/service.grpc.pb.h"
#include "serving/diagnosis_proto.h"
#include "serving/queries.h"
#include "serving/status_codes.h"

namespace rankwatch {
namespace {

constexpr char kServiceName[] = "rankwatch.v1.RankWatch";
constexpr char kStateServiceName[] = "rankwatch.state";

class RankWatchService final : public v1::RankWatch::Service {
 public:
  RankWatchService(const QuerySources& sources, AlertHub* alerts, CaptureStore* captures)
      : queries_(sources),
        snapshots_(sources.snapshots),
        state_(sources.state),
        alerts_(alerts),
        captures_(captures) {}

  grpc::Status ListJobs(grpc::ServerContext*, const v1::ListJobsRequest*,
                        v1::ListJobsResponse* response) override {
    *response = queries_.ListJobs();
    return grpc::Status::OK;
  }

  grpc::Status GetDiagnosis(grpc::ServerContext*, const v1::GetDiagnosisRequest* request,
                            v1::Diagnosis* response) override {
    return Answer(queries_.GetDiagnosis(request->training_job()), response);
  }

  grpc::Status GetRankDetail(grpc::ServerContext*, const v1::GetRankDetailRequest* request,
                             v1::RankDetail* response) override {
    return Answer(queries_.GetRankDetail(request->training_job(), request->rank()), response);
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
    auto target = ChooseCaptureRanks(*request, s);
    if (!target.ok()) return ToGrpc(target.status());
    const int64_t now = WallNowUnixNs();
    auto c =
        captures_->Request(s.training_job, std::move(target->ranks), target->culprit,
                           target->reference, request->steps(), "rankwatch capture", "", &s, now);
    if (!c.ok()) return ToGrpc(c.status());
    *response = std::move(*c);
    return grpc::Status::OK;
  }

  grpc::Status ListActions(grpc::ServerContext*, const v1::ListActionsRequest* request,
                           v1::ListActionsResponse* response) override {
    if (state_ == nullptr) return {grpc::StatusCode::UNAVAILABLE, "no state store"};
    auto actions = StoredActions(*state_, request->training_job(), 1000);
    if (!actions.ok()) return ToGrpc(actions.status());
    for (v1::AlertAction& a : *actions) *response->add_actions() = std::move(a);
    return grpc::Status::OK;
  }

  grpc::Status GetCapture(grpc::ServerContext*, const v1::GetCaptureRequest* request,
                          v1::GetCaptureResponse* response) override {
    return Answer(queries_.GetCapture(request->id(), request->with_events()), response);
  }

  grpc::Status ListCaptures(grpc::ServerContext*, const v1::ListCapturesRequest* request,
                            v1::ListCapturesResponse* response) override {
    return Answer(queries_.ListCaptures(request->training_job()), response);
  }

  grpc::Status GetTimeline(grpc::ServerContext*, const v1::GetTimelineRequest* request,
                           v1::Timeline* response) override {
    return Answer(queries_.GetTimeline(*request), response);
  }

  grpc::Status ListNodes(grpc::ServerContext*, const v1::ListNodesRequest* request,
                         v1::ListNodesResponse* response) override {
    return Answer(queries_.ListNodes(*request), response);
  }

 private:
  template <typename T>
  static grpc::Status Answer(absl::StatusOr<T> answer, T* response) {
    if (!answer.ok()) return ToGrpc(answer.status());
    *response = std::move(*answer);
    return grpc::Status::OK;
  }

  const Queries queries_;
  const SnapshotStore* snapshots_;
  const StateStore* state_;  // the action records (ListActions)
  AlertHub* alerts_;
  CaptureStore* captures_;
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
  const PartServices* parts = options.sources.parts;
  CaptureStore* captures = parts == nullptr ? nullptr : parts->Find<CaptureStore>();
  self->service_ = std::make_unique<RankWatchService>(options.sources, options.alerts, captures);
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
