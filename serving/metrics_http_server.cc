#include "serving/metrics_http_server.h"

#include <httplib.h>
#include <zlib.h>

#include <algorithm>
#include <memory>

#include "serving/kernel_json.h"

namespace rankwatch {
namespace {

// Whether the request's Accept-Encoding lists gzip with a weight above 0.
bool AcceptsGzip(const httplib::Request& req) {
  const std::string& accepted = req.get_header_value("Accept-Encoding");
  size_t at = 0;
  while (at < accepted.size()) {
    size_t end = accepted.find(',', at);
    if (end == std::string::npos) end = accepted.size();
    std::string item = accepted.substr(at, end - at);
    at = end + 1;
    item.erase(std::remove(item.begin(), item.end(), ' '), item.end());
    const size_t semicolon = item.find(';');
    const std::string coding = item.substr(0, semicolon);
    if (coding != "gzip" && coding != "x-gzip") continue;
    if (semicolon == std::string::npos) return true;
    const std::string params = item.substr(semicolon + 1);
    // "q=0", "q=0.0", "q=0.000" refuse it.
    if (params.rfind("q=", 0) == 0 && params.find_first_not_of("0.", 2) == std::string::npos)
      return false;
    return true;
  }
  return false;
}

// `body` as a gzip stream at zlib's fastest level; empty on failure.
std::string Gzip(const std::string& body) {
  z_stream z{};
  if (deflateInit2(&z, Z_BEST_SPEED, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK) return {};
  std::string out(deflateBound(&z, body.size()), '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(body.data()));
  z.avail_in = static_cast<uInt>(body.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  const int rc = deflate(&z, Z_FINISH);
  out.resize(z.total_out);
  deflateEnd(&z);
  return rc == Z_STREAM_END ? out : std::string();
}

// Sets the response to `body`, compressed here with gzip when the client takes it. cpp-httplib
// would otherwise compress text and JSON itself, and with brotli at its slowest level whenever a
// client (every browser) accepts "br": seconds of CPU for a few MiB of metrics. A body set
// through a content provider of known length is sent as it is.
void SetBody(const httplib::Request& req, httplib::Response& res, std::string body,
             const char* content_type) {
  constexpr size_t kCompressAbove = 1024;
  res.set_header("Vary", "Accept-Encoding");
  if (body.size() > kCompressAbove && AcceptsGzip(req)) {
    std::string compressed = Gzip(body);
    if (!compressed.empty()) {
      body.swap(compressed);
      res.set_header("Content-Encoding", "gzip");
    }
  }
  if (body.empty()) {
    res.set_content(body, content_type);
    return;
  }
  auto shared = std::make_shared<std::string>(std::move(body));
  res.set_content_provider(shared->size(), content_type,
                           [shared](size_t offset, size_t length, httplib::DataSink& sink) {
                             return sink.write(shared->data() + offset,
                                               std::min(length, shared->size() - offset));
                           });
}

}  // namespace

absl::StatusOr<ListenAddress> BindHttpServer(httplib::Server* server, const ListenAddress& address,
                                             const std::string& what) {
  ListenAddress bound = address;
  if (address.port == 0) {
    bound.port = server->bind_to_any_port(address.host);
  } else if (server->bind_to_port(address.host, address.port)) {
    bound.port = address.port;
  } else {
    bound.port = -1;
  }
  if (bound.port <= 0) {
    return absl::UnavailableError("cannot listen for " + what + " on " + address.ToString());
  }
  return bound;
}

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    const ListenAddress& address, const PrometheusRegistry* registry,
    const KernelSnapshotStore* kernel) {
  auto self = std::unique_ptr<MetricsHttpServer>(new MetricsHttpServer());
  self->server_ = std::make_unique<httplib::Server>();
  httplib::Server& s = *self->server_;
  s.Get("/metrics", [registry](const httplib::Request& req, httplib::Response& res) {
    SetBody(req, res, registry->Render(), "text/plain; version=0.0.4; charset=utf-8");
  });
  s.Get("/healthz", [](const httplib::Request& req, httplib::Response& res) {
    SetBody(req, res, "ok\n", "text/plain");
  });
  if (kernel != nullptr) {
    s.Get("/kernel", [kernel](const httplib::Request& req, httplib::Response& res) {
      if (!req.has_param("training_job")) {
        std::vector<std::string> jobs;
        for (const auto& [job, snapshot] : *kernel->GetAll()) jobs.push_back(job);
        SetBody(req, res, KernelJobListJson(jobs), "application/json");
        return;
      }
      auto snapshot = kernel->Get(req.get_param_value("training_job"));
      if (snapshot == nullptr) {
        res.status = 404;
        SetBody(req, res, "{\"error\": \"no kernel events for this training job\"}\n",
                "application/json");
        return;
      }
      SetBody(req, res, KernelJobJson(*snapshot), "application/json");
    });
  }
  s.Get("/", [](const httplib::Request& req, httplib::Response& res) {
    SetBody(req, res, "rankwatchd: metrics at /metrics\n", "text/plain");
  });
  auto bound = BindHttpServer(&s, address, "metrics");
  if (!bound.ok()) return bound.status();
  self->address_ = *bound;
  self->thread_ = std::thread([server = self->server_.get()] { server->listen_after_bind(); });
  return self;
}

MetricsHttpServer::~MetricsHttpServer() { Stop(); }

void MetricsHttpServer::Stop() {
  if (server_) server_->stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace rankwatch
