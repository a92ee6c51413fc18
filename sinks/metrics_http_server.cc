#include "sinks/metrics_http_server.h"

#include <httplib.h>

#include "sinks/kernel_json.h"

namespace rankwatch {

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
  s.Get("/metrics", [registry](const httplib::Request&, httplib::Response& res) {
    res.set_content(registry->Render(), "text/plain; version=0.0.4; charset=utf-8");
  });
  s.Get("/healthz", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("ok\n", "text/plain");
  });
  if (kernel != nullptr) {
    s.Get("/kernel", [kernel](const httplib::Request& req, httplib::Response& res) {
      if (!req.has_param("training_job")) {
        std::vector<std::string> jobs;
        for (const auto& [job, snapshot] : *kernel->GetAll()) jobs.push_back(job);
        res.set_content(KernelJobListJson(jobs), "application/json");
        return;
      }
      auto snapshot = kernel->Get(req.get_param_value("training_job"));
      if (snapshot == nullptr) {
        res.status = 404;
        res.set_content("{\"error\": \"no kernel events for this training job\"}\n",
                        "application/json");
        return;
      }
      res.set_content(KernelJobJson(*snapshot), "application/json");
    });
  }
  s.Get("/", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("rankwatchd: metrics at /metrics\n", "text/plain");
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
