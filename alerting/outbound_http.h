// Outbound HTTP: the client side of the daemon's alert deliveries (Alertmanager pushes,
// alerting/alertmanager_push.h, and action webhooks, alerting/alert_actions.h). One POST at a time
// through an HttpTransport — cpp-httplib's client (Debian's build, with OpenSSL: https verifies
// the server against a CA file or the system's CAs), or a fake in tests — with basic or bearer
// authentication read from files (never the command line; read again at each request, so a
// rotated secret is picked up), and the HMAC signature of webhook bodies.
//
// Thread-safety: the free functions are pure or read files; an HttpTransport is used by one
// thread (each delivery thread makes its own).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace rankwatch {

// An http or https URL, split.
struct HttpUrl {
  std::string scheme;  // "http" or "https"
  std::string host;
  int port = 0;      // the scheme's default when the URL names none
  std::string path;  // "/..." ("/" when the URL has none)
  // "scheme://host:port" (an IPv6 host in brackets).
  std::string origin() const {
    const bool v6 = host.find(':') != std::string::npos;
    return scheme + "://" + (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
  }
};
// Accepts http(s)://host[:port][/path]; no user information (credentials go in files).
absl::StatusOr<HttpUrl> ParseHttpUrl(std::string_view url);

using HttpHeaders = std::vector<std::pair<std::string, std::string>>;

struct HttpResult {
  int status = 0;     // the HTTP status; 0 when no answer came
  std::string error;  // why no answer came (connection refused, timeout, TLS, ...)
  std::string body;   // the answer's body (the first KiB)
  bool ok() const { return status >= 200 && status < 300; }
  // Worth trying again: no answer, 408, 429 or a 5xx. Other 4xx are the request's fault.
  bool retryable() const { return status == 0 || status == 408 || status == 429 || status >= 500; }
  // One line: "HTTP 503: <body>" or the error.
  std::string Describe() const;
};

class HttpTransport {
 public:
  virtual ~HttpTransport() = default;
  // POSTs `body` (JSON) to `url`; `headers` are added to the request.
  virtual HttpResult Post(const std::string& url, const std::string& body,
                          const HttpHeaders& headers) = 0;
};

struct OutboundHttpOptions {
  std::string ca_file;                      // PEM CA for https servers; empty: the system's CAs
  std::string basic_auth_file;              // "user:password" on one line; empty: none
  std::string bearer_token_file;            // a token on one line; empty: none
  std::chrono::milliseconds timeout{3000};  // to connect, and to read and write each time
};

// cpp-httplib's client.
std::unique_ptr<HttpTransport> MakeHttpTransport(OutboundHttpOptions options);

// The file's text without a trailing line break (a secret). Unreadable or empty: an error
// naming the file.
absl::StatusOr<std::string> ReadSecretFile(const std::string& path);

// HMAC-SHA256 of `data` keyed with `key`, as 64 lowercase hex digits (OpenSSL).
std::string HmacSha256Hex(std::string_view key, std::string_view data);

// RFC 3339 UTC with milliseconds: "2026-11-27T14:03:05.123Z".
std::string Rfc3339(int64_t unix_ns);

// A delivery thread: calls `round(now, wall clock in Unix ns)` every `period` until Stop(),
// which waits for the round in progress. Start once. Thread-safe.
class DeliveryLoop {
 public:
  using Round = std::function<void(std::chrono::steady_clock::time_point, int64_t)>;
  ~DeliveryLoop() { Stop(); }
  void Start(std::chrono::milliseconds period, Round round);
  void Stop();

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;  // guarded by mu_
  std::thread thread_;
};

}  // namespace rankwatch
