#include "sinks/grpc_server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include <chrono>

#include "rankwatch/v1/service.grpc.pb.h"
#include "sinks/diagnosis_proto.h"

namespace rankwatch {
namespace {

class RankWatchService final : public v1::RankWatch::Service {
 public:
  explicit RankWatchService(const SnapshotStore* snapshots) : snapshots_(snapshots) {}

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
    return grpc::Status::OK;
  }
  grpc::Status GetRankDetail(grpc::ServerContext*, const v1::GetRankDetailRequest*,
                             v1::RankDetail*) override {
    return {grpc::StatusCode::UNIMPLEMENTED, "rank detail arrives with issue #5"};
  }
  grpc::Status WatchAlerts(grpc::ServerContext*, const v1::WatchAlertsRequest*,
                           grpc::ServerWriter<v1::Alert>*) override {
    return {grpc::StatusCode::UNIMPLEMENTED, "alerts arrive with issue #5"};
  }

 private:
  const SnapshotStore* snapshots_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<GrpcServer>> GrpcServer::Start(const ListenAddress& address,
                                                              const SnapshotStore* snapshots) {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  auto self = std::unique_ptr<GrpcServer>(new GrpcServer());
  self->service_ = std::make_unique<RankWatchService>(snapshots);
  grpc::ServerBuilder builder;
  int port = 0;
  const std::string host = address.host.find(':') != std::string::npos
                               ? "[" + address.host + "]"
                               : address.host;
  builder.AddListeningPort(host + ":" + std::to_string(address.port),
                           grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(self->service_.get());
  self->server_ = builder.BuildAndStart();
  if (!self->server_ || port == 0) {
    return absl::UnavailableError("cannot listen for gRPC on " + address.ToString());
  }
  self->address_ = address;
  self->address_.port = port;
  self->SetServing(true);
  return self;
}

GrpcServer::~GrpcServer() { Stop(); }

void GrpcServer::SetServing(bool serving) {
  if (auto* health = server_->GetHealthCheckService()) {
    health->SetServingStatus(serving);
  }
}

void GrpcServer::Stop() {
  if (!server_) return;
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  server_->Wait();
  server_.reset();
}

}  // namespace rankwatch
