// WebServer: rankwatchd's read-only web UI at /ui/ and its JSON API at /api/v1/, on an HTTP
// listener of its own (--ui-listen), over TLS with the gRPC service's certificate when one is
// configured (then plaintext is refused).
//
// The API answers with the protobuf JSON mapping (lowerCamelCase names, 64-bit integers as
// strings, enums by name, default values printed) of the same messages the gRPC service sends,
// built by the same Queries (serving/queries.h):
//
//   GET /api/v1/jobs                           ListJobsResponse
//   GET /api/v1/jobs/<job>                     Diagnosis
//   GET /api/v1/jobs/<job>/ranks/<rank>        RankDetail
//   GET /api/v1/jobs/<job>/alerts[?max=N]      {"alerts": [Alert, ...]}, newest first
//                                              (N <= 1000, default 100)
//   GET /api/v1/jobs/<job>/captures            ListCapturesResponse
//   GET /api/v1/jobs/<job>/timeline[?first_step=A&last_step=B&max_rank_steps=N]   Timeline
//   GET /api/v1/jobs/<job>/heatmap[?max_rank_steps=N]   the window's steps, rank by rank,
//                                              as compact arrays (below)
//   GET /api/v1/captures/<id>[?events=true]    GetCaptureResponse
//   GET /api/v1/nodes[?limit=N]                ListNodesResponse: the top nodes (ListNodes)
//   GET /api/v1/nodes/<node>                   ListNodesResponse: the node with its jobs; 404
//                                              when the view holds no record of it
//
// The UI's pages — /ui/ (every job), /ui/jobs/<job>, /ui/jobs/<job>/ranks/<rank>, /ui/nodes/
// (the fleet view of nodes), /ui/nodes/<node> — are one page compiled into the binary
// (serving/ui/), which reads the API; no file or network access beyond this server. Errors: an
// unknown path, job or node is 404, a bad parameter 400, a method other than GET or HEAD 405, a
// feature turned off 503; each with {"error": "..."}.
//
// Thread-safe. Start once, Stop once (the destructor stops).
#pragma once

#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "common/listen_address.h"
#include "serving/queries.h"

namespace httplib {
class Server;
}

namespace rankwatch {

struct WebTlsOptions {
  std::string cert_file;       // PEM certificate chain; empty: plaintext
  std::string key_file;        // its private key
  std::string client_ca_file;  // set: clients must present a certificate this CA signed
};

struct WebServerOptions {
  ListenAddress address;
  QuerySources sources;  // `sources.snapshots` required
  WebTlsOptions tls;
};

class WebServer {
 public:
  // Binds the address (port 0 picks a free one). Unreadable TLS files are InvalidArgument.
  static absl::StatusOr<std::unique_ptr<WebServer>> Start(const WebServerOptions& options);
  ~WebServer();

  const ListenAddress& address() const { return address_; }
  bool tls() const { return tls_; }
  void Stop();

 private:
  WebServer() = default;

  std::unique_ptr<Queries> queries_;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  ListenAddress address_;
  bool tls_ = false;
};

}  // namespace rankwatch
