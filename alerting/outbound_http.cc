#include "alerting/outbound_http.h"

#include <httplib.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <cctype>
#include <charconv>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <map>
#include <sstream>

#include "common/wall_clock.h"

namespace rankwatch {

absl::StatusOr<HttpUrl> ParseHttpUrl(std::string_view url) {
  HttpUrl out;
  const size_t colon = url.find("://");
  if (colon == std::string_view::npos) {
    return absl::InvalidArgumentError("'" + std::string(url) + "' is not an http(s):// URL");
  }
  out.scheme = std::string(url.substr(0, colon));
  for (char& ch : out.scheme) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  if (out.scheme != "http" && out.scheme != "https") {
    return absl::InvalidArgumentError("'" + std::string(url) +
                                      "': the scheme must be http or https");
  }
  std::string_view rest = url.substr(colon + 3);
  const size_t slash = rest.find('/');
  std::string_view authority = rest.substr(0, slash);
  out.path = slash == std::string_view::npos ? "/" : std::string(rest.substr(slash));
  if (authority.find('@') != std::string_view::npos) {
    return absl::InvalidArgumentError("'" + std::string(url) +
                                      "': credentials go in a file, not in the URL");
  }
  out.port = out.scheme == "https" ? 443 : 80;
  std::string_view host = authority;
  if (!authority.empty() && authority.front() == '[') {  // [v6]:port
    const size_t close = authority.find(']');
    if (close == std::string_view::npos) {
      return absl::InvalidArgumentError("'" + std::string(url) + "': a bad IPv6 host");
    }
    host = authority.substr(1, close - 1);
    authority = authority.substr(close + 1);
    if (!authority.empty() && authority.front() != ':') {
      return absl::InvalidArgumentError("'" + std::string(url) + "': a bad host");
    }
  } else {
    const size_t port_colon = authority.rfind(':');
    host = authority.substr(0, port_colon);
    authority = port_colon == std::string_view::npos ? "" : authority.substr(port_colon);
  }
  if (!authority.empty()) {  // ":port"
    const std::string_view digits = authority.substr(1);
    int port = 0;
    const auto [ptr, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), port);
    if (digits.empty() || ec != std::errc() || ptr != digits.data() + digits.size() || port < 1 ||
        port > 65535) {
      return absl::InvalidArgumentError("'" + std::string(url) + "': a bad port");
    }
    out.port = port;
  }
  if (host.empty()) return absl::InvalidArgumentError("'" + std::string(url) + "': no host");
  out.host = std::string(host);
  return out;
}

std::string HttpResult::Describe() const {
  if (status == 0) return error.empty() ? "no answer" : error;
  std::string line = "HTTP " + std::to_string(status);
  if (!body.empty()) {
    std::string text = body.substr(0, 200);
    for (char& ch : text) {
      if (ch == '\n' || ch == '\r') ch = ' ';
    }
    line += ": " + text;
  }
  return line;
}

absl::StatusOr<std::string> ReadSecretFile(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) return absl::InvalidArgumentError("cannot read '" + path + "'");
  std::stringstream text;
  text << file.rdbuf();
  std::string secret = text.str();
  while (!secret.empty() && (secret.back() == '\n' || secret.back() == '\r')) secret.pop_back();
  if (secret.empty()) return absl::InvalidArgumentError("'" + path + "' is empty");
  return secret;
}

std::string HmacSha256Hex(std::string_view key, std::string_view data) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(data.data()), data.size(), digest, &length);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string hex;
  hex.reserve(length * 2);
  for (unsigned int i = 0; i < length; ++i) {
    hex += kHex[digest[i] >> 4];
    hex += kHex[digest[i] & 0xf];
  }
  return hex;
}

std::string Rfc3339(int64_t unix_ns) {
  const std::time_t seconds = static_cast<std::time_t>(unix_ns / 1'000'000'000);
  const int millis = static_cast<int>((unix_ns % 1'000'000'000) / 1'000'000);
  std::tm tm{};
  gmtime_r(&seconds, &tm);
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, millis);
  return buf;
}

void DeliveryLoop::Start(std::chrono::milliseconds period, Round round) {
  thread_ = std::thread([this, period, round = std::move(round)] {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_) {
      lock.unlock();
      round(std::chrono::steady_clock::now(), WallNowUnixNs());
      lock.lock();
      cv_.wait_for(lock, period, [this] { return stop_; });
    }
  });
}

void DeliveryLoop::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

namespace {

class HttplibTransport : public HttpTransport {
 public:
  explicit HttplibTransport(OutboundHttpOptions options) : options_(std::move(options)) {}

  HttpResult Post(const std::string& url, const std::string& body,
                  const HttpHeaders& headers) override {
    HttpResult result;
    auto parsed = ParseHttpUrl(url);
    if (!parsed.ok()) {
      result.error = std::string(parsed.status().message());
      return result;
    }
    httplib::Headers request_headers;
    for (const auto& [name, value] : headers) request_headers.emplace(name, value);
    httplib::Client& client = ClientFor(*parsed);
    // Credentials are read at each request: a rotated file is picked up.
    if (!options_.basic_auth_file.empty()) {
      auto secret = ReadSecretFile(options_.basic_auth_file);
      if (!secret.ok()) {
        result.error = std::string(secret.status().message());
        return result;
      }
      const size_t colon = secret->find(':');
      if (colon == std::string::npos) {
        result.error = "'" + options_.basic_auth_file + "' must hold user:password";
        return result;
      }
      client.set_basic_auth(secret->substr(0, colon), secret->substr(colon + 1));
    }
    if (!options_.bearer_token_file.empty()) {
      auto token = ReadSecretFile(options_.bearer_token_file);
      if (!token.ok()) {
        result.error = std::string(token.status().message());
        return result;
      }
      client.set_bearer_token_auth(*token);
    }
    auto answer = client.Post(parsed->path, request_headers, body, "application/json");
    if (!answer) {
      result.error = httplib::to_string(answer.error());
      if (parsed->scheme == "https" && answer.error() == httplib::Error::SSLServerVerification) {
        result.error += " (the server's certificate is not trusted";
        result.error += options_.ca_file.empty() ? " by the system's CAs)" : " by the CA file)";
      }
      clients_.erase(parsed->origin());  // a fresh connection next time
      return result;
    }
    result.status = answer->status;
    result.body = answer->body.substr(0, 1024);
    return result;
  }

 private:
  httplib::Client& ClientFor(const HttpUrl& url) {
    auto it = clients_.find(url.origin());
    if (it != clients_.end()) return *it->second;
    auto client = std::make_unique<httplib::Client>(url.origin());
    const auto timeout = std::chrono::duration_cast<std::chrono::microseconds>(options_.timeout);
    const time_t sec = static_cast<time_t>(timeout.count() / 1'000'000);
    const time_t usec = static_cast<time_t>(timeout.count() % 1'000'000);
    client->set_connection_timeout(sec, usec);
    client->set_read_timeout(sec, usec);
    client->set_write_timeout(sec, usec);
    client->set_keep_alive(true);
    if (url.scheme == "https") {
      client->enable_server_certificate_verification(true);
      if (!options_.ca_file.empty()) client->set_ca_cert_path(options_.ca_file);
    }
    return *clients_.emplace(url.origin(), std::move(client)).first->second;
  }

  const OutboundHttpOptions options_;
  std::map<std::string, std::unique_ptr<httplib::Client>> clients_;  // by origin
};

}  // namespace

std::unique_ptr<HttpTransport> MakeHttpTransport(OutboundHttpOptions options) {
  return std::make_unique<HttplibTransport>(std::move(options));
}

}  // namespace rankwatch
