// GrpcServer: the rankwatch.v1.RankWatch service plus gRPC health checking and server
// reflection, on its own threads.
//
// ListJobs and GetDiagnosis answer from the SnapshotStore. GetRankDetail and WatchAlerts return UNIMPLEMENTED until issue #5.
//
// Thread-safe.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "sinks/listen_address.h"
#include "sinks/snapshot_store.h"

namespace grpc {
class Server;
class Service;
}  // namespace grpc

namespace rankwatch {

class GrpcServer {
 public:
  static absl::StatusOr<std::unique_ptr<GrpcServer>> Start(const ListenAddress& address,
                                                           const SnapshotStore* snapshots);
  ~GrpcServer();

  const ListenAddress& address() const { return address_; }
  // Sets every service's health to SERVING (true) or NOT_SERVING.
  void SetServing(bool serving);
  // Stops accepting calls and waits up to 2 s for running ones.
  void Stop();

 private:
  GrpcServer() = default;

  std::unique_ptr<grpc::Service> service_;
  std::unique_ptr<grpc::Server> server_;
  ListenAddress address_;
};

}  // namespace rankwatch
