// MetricsHttpServer: serves the registry at GET /metrics (Prometheus text format) and a
// liveness answer at GET /healthz, on its own threads. With a KernelSnapshotStore it also serves
// each job's live kernel results as JSON at GET /kernel?training_job=J (GET /kernel lists the
// jobs; an unknown job is 404). Answers above 1 KiB are gzip-compressed (zlib's fastest level)
// for clients that accept gzip and sent uncompressed to others; cpp-httplib's own compression
// (brotli at its slowest level for any client offering "br") is never used.
//
// Thread-safe. Start once, Stop once (the destructor stops).
#pragma once

#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "common/listen_address.h"
#include "metrics/prometheus_registry.h"
#include "serving/kernel_snapshot_store.h"

namespace httplib {
class Server;
}

namespace rankwatch {

// Binds `server` to `address` (port 0 picks a free port); the bound address, or Unavailable
// naming `what` ("metrics", "the web UI").
absl::StatusOr<ListenAddress> BindHttpServer(httplib::Server* server, const ListenAddress& address,
                                             const std::string& what);

class MetricsHttpServer {
 public:
  // Binds `address` (port 0 picks a free port) and starts serving `registry`.
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(
      const ListenAddress& address, const PrometheusRegistry* registry,
      const KernelSnapshotStore* kernel = nullptr);
  ~MetricsHttpServer();

  // The bound address, with the real port.
  const ListenAddress& address() const { return address_; }
  void Stop();

 private:
  MetricsHttpServer() = default;

  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  ListenAddress address_;
};

}  // namespace rankwatch
