// GrpcServer: the rankwatch.v1.RankWatch service plus gRPC health checking and server
// reflection, on its own threads, over plaintext or TLS (mutual TLS with a client CA).
//
// RequestCapture asks the CaptureStore (evidence/capture_store.h) a part serves for the ranks
// evidence/capture_ranks.h chooses; GetCapture and ListCaptures read it. GetTimeline reads the
// job's stored steps from the StateStore (serving/timeline.h). ListNodes asks the NodeView a part
// serves (the fleet view of nodes, docs/fleet.md) as of the wall clock. A call whose service no
// part serves is UNAVAILABLE.
//
// ListActions reads the action policy's records of a job from the StateStore
// (alerting/alert_actions.h, StoredActions).
//
// ListJobs, GetDiagnosis and GetRankDetail answer from the SnapshotStore; WatchAlerts streams
// the AlertHub's stored alerts after the requested sequence and then live ones. A subscriber
// that falls `subscriber_queue` alerts behind is disconnected with RESOURCE_EXHAUSTED and a
// message saying where to resume; the pipeline never waits for it.
//
// Health, per service: "rankwatch.v1.RankWatch" is SERVING while queries are answered; the
// overall service "" and "rankwatch.state" turn NOT_SERVING after a storage error.
//
// Thread-safe.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "alerting/alert_hub.h"
#include "common/listen_address.h"
#include "serving/queries.h"

namespace grpc {
class Server;
class Service;
}  // namespace grpc

namespace rankwatch {

struct GrpcTlsOptions {
  std::string cert_file;       // server certificate chain (PEM); empty: plaintext
  std::string key_file;        // its private key (PEM)
  std::string client_ca_file;  // set: clients must present a certificate signed by this CA
};

struct GrpcServerOptions {
  ListenAddress address;
  // What the queries read (serving/queries.h): `sources.snapshots` is required; without
  // `sources.state` GetTimeline is UNAVAILABLE; without `sources.parts`, or a part serving
  // captures or nodes, the capture calls and ListNodes are.
  QuerySources sources;
  AlertHub* alerts = nullptr;  // WatchAlerts streams it; null: UNAVAILABLE
  GrpcTlsOptions tls;
};

class GrpcServer {
 public:
  // Unreadable certificate files are InvalidArgument naming the file.
  static absl::StatusOr<std::unique_ptr<GrpcServer>> Start(const GrpcServerOptions& options);
  ~GrpcServer();

  const ListenAddress& address() const { return address_; }
  // Every service SERVING (true) or NOT_SERVING (shutdown).
  void SetServing(bool serving);
  // After a storage error: "" and "rankwatch.state" NOT_SERVING; queries go on.
  void SetStateHealthy(bool healthy);
  // Stops accepting calls, ends alert streams, and waits up to 2 s for running calls.
  void Stop();

 private:
  GrpcServer() = default;

  std::unique_ptr<grpc::Service> service_;
  std::unique_ptr<grpc::Server> server_;
  AlertHub* alerts_ = nullptr;
  ListenAddress address_;
};

}  // namespace rankwatch
