#include "serving/web_server.h"

#include <google/protobuf/util/json_util.h>
#include <httplib.h>

#include <charconv>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>

#include "common/json_string.h"
#include "serving/kernel_json.h"
#include "serving/metrics_http_server.h"
#include "serving/status_codes.h"
#include "serving/timeline.h"
#include "serving/ui_assets.h"

namespace rankwatch {
namespace {

// cpp-httplib compresses "application/json" and "text/..." answers with brotli at its highest
// quality when the client accepts it, which took 35 s for an 11.7-MB heatmap: the API's answers
// carry a charset parameter, which the library does not compress (nor does the page's script).
constexpr char kJson[] = "application/json; charset=utf-8";

std::string JsonOf(const google::protobuf::Message& m) {
  google::protobuf::util::JsonPrintOptions options;
  options.always_print_primitive_fields = true;
  std::string out;
  (void)google::protobuf::util::MessageToJsonString(m, &out, options);
  return out;
}

std::string Quoted(std::string_view text) { return JsonString(text); }

void Error(httplib::Response& res, int status, const std::string& message) {
  res.status = status;
  res.set_content("{\"error\": " + Quoted(message) + "}\n", kJson);
}

void Error(httplib::Response& res, const absl::Status& s) {
  Error(res, HttpStatusOf(s), std::string(s.message()));
}

template <typename T>
void Answer(httplib::Response& res, const absl::StatusOr<T>& answer) {
  if (!answer.ok()) return Error(res, answer.status());
  res.set_content(JsonOf(*answer), kJson);
}

// A non-negative integer query parameter in [0, max]; `fallback` when absent. Sets a 400 and
// returns nullopt when it is not one.
std::optional<uint64_t> UintParam(const httplib::Request& req, httplib::Response& res,
                                  const char* name, uint64_t fallback, uint64_t max) {
  if (!req.has_param(name)) return fallback;
  const std::string text = req.get_param_value(name);
  uint64_t value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || value > max) {
    Error(res, 400,
          std::string("parameter ") + name + " must be an integer in 0.." + std::to_string(max));
    return std::nullopt;
  }
  return value;
}

// A JobHeatmap as JSON: {"trainingJob", "worldSize", "truncated", "steps": [...], "timedOut":
// [...], "culpritRanks": [...], "rankNodes": [...], "metrics": ["STEP", "OWN", ...], "metric":
// "OWN", "values": [ms or null, ...]}, the values rank-major (rank * steps + s).
std::string HeatmapJson(const JobHeatmap& h, bool with_values = true) {
  std::string out = "{\"trainingJob\": " + Quoted(h.training_job) +
                    ", \"worldSize\": " + std::to_string(h.world_size) +
                    ", \"truncated\": " + (h.truncated ? "true" : "false") + ", \"steps\": [";
  for (size_t s = 0; s < h.steps.size(); ++s) {
    if (s > 0) out += ',';
    out += std::to_string(h.steps[s]);
  }
  out += "], \"timedOut\": [";
  for (size_t s = 0; s < h.timed_out.size(); ++s) {
    if (s > 0) out += ',';
    out += h.timed_out[s] ? "true" : "false";
  }
  out += "], \"culpritRanks\": [";
  for (size_t i = 0; i < h.culprit_ranks.size(); ++i) {
    if (i > 0) out += ',';
    out += std::to_string(h.culprit_ranks[i]);
  }
  out += "], \"rankNodes\": [";
  for (size_t i = 0; i < h.rank_nodes.size(); ++i) {
    if (i > 0) out += ',';
    out += Quoted(h.rank_nodes[i]);
  }
  out += "], \"metrics\": [";
  for (size_t i = 0; i < h.metrics.size(); ++i) {
    if (i > 0) out += ',';
    out += Quoted(h.metrics[i]);
  }
  out += "], \"metric\": " + Quoted(h.metric);
  const auto numbers = [&out](const std::vector<float>& values) {
    out.reserve(out.size() + values.size() * 7 + 4);
    char buf[32];
    out += '[';
    for (size_t i = 0; i < values.size(); ++i) {
      if (i > 0) out += ',';
      if (std::isnan(values[i])) {
        out += "null";
      } else {
        // Milliseconds to the microsecond.
        const auto [end, ec] =
            std::to_chars(buf, buf + sizeof(buf), values[i], std::chars_format::fixed, 3);
        out.append(buf, end);
      }
    }
    out += ']';
  };
  if (h.rank) {
    out += ", \"rank\": " + std::to_string(*h.rank) + ", \"medians\": ";
    numbers(h.medians);
  }
  if (!with_values) return out + "}";
  out += ", \"values\": ";
  numbers(h.values);
  return out + "}\n";
}

// The heatmap with its values as 32-bit floats, for the UI (no text to format or parse):
// a little-endian uint32 H, H bytes of the JSON above without "values", zero bytes to a
// multiple of 4, then the values (rank-major, NaN where none), little-endian.
std::string HeatmapBinary(const JobHeatmap& h) {
  static_assert(std::numeric_limits<float>::is_iec559, "IEEE floats");
  const std::string header = HeatmapJson(h, /*with_values=*/false);
  const uint32_t size = static_cast<uint32_t>(header.size());
  std::string out;
  const size_t offset = (4 + header.size() + 3) / 4 * 4;
  out.resize(offset + h.values.size() * sizeof(float), '\0');
  for (int i = 0; i < 4; ++i) out[i] = static_cast<char>((size >> (8 * i)) & 0xff);
  std::memcpy(out.data() + 4, header.data(), header.size());
  std::memcpy(out.data() + offset, h.values.data(), h.values.size() * sizeof(float));  // x86: LE
  return out;
}

void Routes(httplib::Server& s, const Queries* q) {
  // A job id may contain '/': the routes with a suffix come first, and the id is the rest.
  s.Get(R"(/api/v1/jobs/?)", [q](const httplib::Request&, httplib::Response& res) {
    res.set_content(JsonOf(q->ListJobs()), kJson);
  });
  s.Get(R"(/api/v1/jobs/(.+)/ranks/([^/]+))",
        [q](const httplib::Request& req, httplib::Response& res) {
          const std::string& text = req.matches[2];
          uint32_t rank = 0;
          const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), rank);
          if (ec != std::errc() || end != text.data() + text.size()) {
            return Error(res, 400, "a rank is a non-negative integer, not '" + text + "'");
          }
          Answer(res, q->GetRankDetail(req.matches[1], rank));
        });
  s.Get(R"(/api/v1/jobs/(.+)/alerts)", [q](const httplib::Request& req, httplib::Response& res) {
    const auto max = UintParam(req, res, "max", 100, 1000);
    if (!max) return;
    auto alerts = q->RecentAlerts(req.matches[1], *max);
    if (!alerts.ok()) return Error(res, alerts.status());
    std::string out = "{\"alerts\": [";
    for (size_t i = 0; i < alerts->size(); ++i) {
      if (i > 0) out += ",\n";
      out += JsonOf((*alerts)[i]);
    }
    res.set_content(out + "]}\n", kJson);
  });
  s.Get(R"(/api/v1/jobs/(.+)/captures)", [q](const httplib::Request& req, httplib::Response& res) {
    if (!q->GetDiagnosis(req.matches[1]).ok()) {
      return Error(res, 404, "no training job '" + req.matches[1].str() + "'");
    }
    Answer(res, q->ListCaptures(req.matches[1]));
  });
  s.Get(R"(/api/v1/jobs/(.+)/timeline)", [q](const httplib::Request& req, httplib::Response& res) {
    v1::GetTimelineRequest request;
    request.set_training_job(req.matches[1]);
    const auto first = UintParam(req, res, "first_step", 0, UINT64_MAX);
    if (!first) return;
    const auto last = UintParam(req, res, "last_step", 0, UINT64_MAX);
    if (!last) return;
    const auto max = UintParam(req, res, "max_rank_steps", 0, kMaxTimelineRankSteps);
    if (!max) return;
    // Unset bounds: the newest stored steps, as many as the window holds (as over gRPC).
    if (req.has_param("first_step")) request.set_first_step(*first);
    if (req.has_param("last_step")) request.set_last_step(*last);
    request.set_max_rank_steps(static_cast<uint32_t>(*max));
    Answer(res, q->GetTimeline(request));
  });
  s.Get(R"(/api/v1/jobs/(.+)/heatmap)", [q](const httplib::Request& req, httplib::Response& res) {
    const auto max =
        UintParam(req, res, "max_rank_steps", kMaxTimelineRankSteps, kMaxTimelineRankSteps);
    if (!max) return;
    const std::string metric = req.has_param("metric") ? req.get_param_value("metric") : "";
    std::optional<uint32_t> rank;
    if (req.has_param("rank")) {
      const auto r = UintParam(req, res, "rank", 0, UINT32_MAX);
      if (!r) return;
      rank = static_cast<uint32_t>(*r);
    }
    auto heatmap = q->GetHeatmap(req.matches[1], metric, static_cast<uint32_t>(*max), rank);
    if (!heatmap.ok()) return Error(res, heatmap.status());
    if (req.has_param("format") && req.get_param_value("format") == "f32") {
      res.set_content(HeatmapBinary(*heatmap), "application/octet-stream");
    } else {
      res.set_content(HeatmapJson(*heatmap), kJson);
    }
  });
  s.Get(R"(/api/v1/jobs/(.+))", [q](const httplib::Request& req, httplib::Response& res) {
    Answer(res, q->GetDiagnosis(req.matches[1]));
  });
  s.Get(R"(/api/v1/captures/(.+))", [q](const httplib::Request& req, httplib::Response& res) {
    const bool events = req.has_param("events") && req.get_param_value("events") == "true";
    Answer(res, q->GetCapture(req.matches[1], events));
  });
  s.Get(R"(/api/v1/nodes/?)", [q](const httplib::Request& req, httplib::Response& res) {
    const auto limit = UintParam(req, res, "limit", 0, UINT32_MAX);
    if (!limit) return;
    v1::ListNodesRequest request;
    request.set_limit(static_cast<uint32_t>(*limit));
    Answer(res, q->ListNodes(request));
  });
  s.Get(R"(/api/v1/nodes/(.+))", [q](const httplib::Request& req, httplib::Response& res) {
    Answer(res, q->GetNode(req.matches[1]));
  });
  s.Get(R"(/api/v1/.*)", [](const httplib::Request& req, httplib::Response& res) {
    Error(res, 404, "no API resource " + req.path);
  });

  // The UI: one page for every UI path (it reads the path), and its assets.
  const UiAsset* page = FindUiAsset("index.html");
  auto serve_page = [page](const httplib::Request&, httplib::Response& res) {
    res.set_header("Cache-Control", "no-cache");
    res.set_content(reinterpret_cast<const char*>(page->data), page->size, page->content_type);
  };
  s.Get("/", [](const httplib::Request&, httplib::Response& res) { res.set_redirect("/ui/"); });
  s.Get("/ui", [](const httplib::Request&, httplib::Response& res) { res.set_redirect("/ui/"); });
  s.Get("/ui/", serve_page);
  s.Get(R"(/ui/jobs/(.+))", serve_page);
  s.Get(R"(/ui/nodes/?)", serve_page);
  s.Get(R"(/ui/nodes/(.+))", serve_page);
  s.Get(R"(/ui/assets/([A-Za-z0-9_.-]+))", [](const httplib::Request& req, httplib::Response& res) {
    const UiAsset* asset = FindUiAsset(req.matches[1].str());
    if (asset == nullptr) return Error(res, 404, "no UI asset " + req.path);
    res.set_header("Cache-Control", "no-cache");
    res.set_content(reinterpret_cast<const char*>(asset->data), asset->size, asset->content_type);
  });
  s.Get(R"(/.*)", [](const httplib::Request& req, httplib::Response& res) {
    Error(res, 404, "no page " + req.path + " (the UI is at /ui/, the API at /api/v1/)");
  });
  // Read-only: every other method is refused.
  const auto refuse = [](const httplib::Request& req, httplib::Response& res) {
    res.set_header("Allow", "GET, HEAD");
    Error(res, 405, req.method + " is not allowed: the UI and the API are read-only");
  };
  s.Post(R"(/.*)", refuse);
  s.Put(R"(/.*)", refuse);
  s.Patch(R"(/.*)", refuse);
  s.Delete(R"(/.*)", refuse);
  s.Options(R"(/.*)", refuse);
  // What httplib answers by itself (a malformed request, an unsupported method): a JSON error.
  s.set_error_handler([](const httplib::Request&, httplib::Response& res) {
    if (res.body.empty()) {
      res.set_content("{\"error\": \"HTTP " + std::to_string(res.status) + "\"}\n", kJson);
    }
  });
}

bool Readable(const std::string& path) { return std::ifstream(path).good(); }

}  // namespace

absl::StatusOr<std::unique_ptr<WebServer>> WebServer::Start(const WebServerOptions& options) {
  auto self = std::unique_ptr<WebServer>(new WebServer());
  const WebTlsOptions& tls = options.tls;
  if (!tls.cert_file.empty() || !tls.key_file.empty() || !tls.client_ca_file.empty()) {
    if (tls.cert_file.empty() || tls.key_file.empty()) {
      return absl::InvalidArgumentError("the web UI's TLS needs both a certificate and a key file");
    }
    for (const std::string* f : {&tls.cert_file, &tls.key_file, &tls.client_ca_file}) {
      if (!f->empty() && !Readable(*f)) {
        return absl::InvalidArgumentError("cannot read the web UI's TLS file " + *f);
      }
    }
    auto ssl = std::make_unique<httplib::SSLServer>(
        tls.cert_file.c_str(), tls.key_file.c_str(),
        tls.client_ca_file.empty() ? nullptr : tls.client_ca_file.c_str());
    if (!ssl->is_valid()) {
      return absl::InvalidArgumentError("the web UI's TLS certificate or key is not valid (" +
                                        tls.cert_file + ", " + tls.key_file + ")");
    }
    self->server_ = std::move(ssl);
    self->tls_ = true;
  } else {
    self->server_ = std::make_unique<httplib::Server>();
  }
  self->queries_ = std::make_unique<Queries>(options.sources);
  Routes(*self->server_, self->queries_.get());
  auto bound = BindHttpServer(self->server_.get(), options.address, "the web UI");
  if (!bound.ok()) return bound.status();
  self->address_ = *bound;
  self->thread_ = std::thread([server = self->server_.get()] { server->listen_after_bind(); });
  return self;
}

WebServer::~WebServer() { Stop(); }

void WebServer::Stop() {
  if (server_) server_->stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace rankwatch
