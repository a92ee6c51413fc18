#include "alerting/outbound_http.h"

#include <gtest/gtest.h>
#include <httplib.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

namespace rankwatch {
namespace {

TEST(OutboundHttpTest, HmacSha256MatchesRfc4231) {
  // RFC 4231, test case 2.
  EXPECT_EQ(HmacSha256Hex("Jefe", "what do ya want for nothing?"),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  // Test case 1: a 20-byte key of 0x0b.
  EXPECT_EQ(HmacSha256Hex(std::string(20, '\x0b'), "Hi There"),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
}

TEST(OutboundHttpTest, UrlsSplitAndBadOnesAreRefused) {
  auto u = ParseHttpUrl("http://am:9093");
  ASSERT_TRUE(u.ok()) << u.status();
  EXPECT_EQ(u->scheme, "http");
  EXPECT_EQ(u->host, "am");
  EXPECT_EQ(u->port, 9093);
  EXPECT_EQ(u->path, "/");
  EXPECT_EQ(u->origin(), "http://am:9093");
  u = ParseHttpUrl("HTTPS://alertmanager.example.com/am/");
  ASSERT_TRUE(u.ok()) << u.status();
  EXPECT_EQ(u->scheme, "https");
  EXPECT_EQ(u->port, 443);
  EXPECT_EQ(u->path, "/am/");
  u = ParseHttpUrl("http://[::1]:8080/hook?x=1");
  ASSERT_TRUE(u.ok()) << u.status();
  EXPECT_EQ(u->host, "::1");
  EXPECT_EQ(u->origin(), "http://[::1]:8080");
  EXPECT_EQ(u->path, "/hook?x=1");
  for (const char* bad : {"ftp://am", "am:9093", "http://user:pw@am/", "http://am:0",
                          "http://am:70000", "http://:80/", "http://am:x/"}) {
    EXPECT_FALSE(ParseHttpUrl(bad).ok()) << bad;
  }
}

TEST(OutboundHttpTest, TimesAreRfc3339Utc) {
  EXPECT_EQ(Rfc3339(0), "1970-01-01T00:00:00.000Z");
  EXPECT_EQ(Rfc3339(1'700'000'000'123'456'789), "2023-11-14T22:13:20.123Z");
}

class TempFile {
 public:
  explicit TempFile(const std::string& text)
      : path_(std::filesystem::temp_directory_path() /
              ("outbound-http-test-" + std::to_string(::getpid()) + "-" +
               std::to_string(counter_++))) {
    std::ofstream(path_) << text;
  }
  ~TempFile() { std::filesystem::remove(path_); }
  std::string path() const { return path_.string(); }

 private:
  static inline int counter_ = 0;
  std::filesystem::path path_;
};

TEST(OutboundHttpTest, SecretFilesLoseTheirLineBreak) {
  TempFile secret("s3cret\n");
  EXPECT_EQ(*ReadSecretFile(secret.path()), "s3cret");
  TempFile empty("\n");
  EXPECT_FALSE(ReadSecretFile(empty.path()).ok());
  EXPECT_FALSE(ReadSecretFile("/nonexistent/secret").ok());
}

// The real client against a real server on loopback.
class HttplibTransportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_.Post("/api/v2/alerts", [this](const httplib::Request& req, httplib::Response& res) {
      std::lock_guard<std::mutex> lock(mu_);
      bodies_.push_back(req.body);
      authorization_ = req.get_header_value("Authorization");
      custom_ = req.get_header_value("X-Test");
      res.status = status_;
      res.set_content("{\"error\":\"nope\"}", "application/json");
    });
    port_ = server_.bind_to_any_port("127.0.0.1");
    ASSERT_GT(port_, 0);
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    while (!server_.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  void TearDown() override {
    server_.stop();
    thread_.join();
  }
  std::string Url() const { return "http://127.0.0.1:" + std::to_string(port_) + "/api/v2/alerts"; }

  httplib::Server server_;
  int port_ = 0;
  std::thread thread_;
  std::mutex mu_;
  std::vector<std::string> bodies_;
  std::string authorization_, custom_;
  int status_ = 200;
};

TEST_F(HttplibTransportTest, PostsWithHeadersAndBasicAuthFromAFile) {
  TempFile auth("rankwatch:pa:ss\n");
  OutboundHttpOptions options;
  options.basic_auth_file = auth.path();
  auto transport = MakeHttpTransport(options);
  const HttpResult r = transport->Post(Url(), "[]", {{"X-Test", "yes"}});
  EXPECT_TRUE(r.ok()) << r.Describe();
  std::lock_guard<std::mutex> lock(mu_);
  ASSERT_EQ(bodies_.size(), 1u);
  EXPECT_EQ(bodies_[0], "[]");
  EXPECT_EQ(custom_, "yes");
  EXPECT_EQ(authorization_, "Basic cmFua3dhdGNoOnBhOnNz");  // base64 of rankwatch:pa:ss
}

TEST_F(HttplibTransportTest, BearerTokenAndErrorStatuses) {
  TempFile token("t0ken\n");
  OutboundHttpOptions options;
  options.bearer_token_file = token.path();
  auto transport = MakeHttpTransport(options);
  status_ = 503;
  HttpResult r = transport->Post(Url(), "[]", {});
  EXPECT_FALSE(r.ok());
  EXPECT_TRUE(r.retryable());
  EXPECT_EQ(r.status, 503);
  EXPECT_EQ(r.Describe(), "HTTP 503: {\"error\":\"nope\"}");
  {
    std::lock_guard<std::mutex> lock(mu_);
    EXPECT_EQ(authorization_, "Bearer t0ken");
  }
  status_ = 400;
  r = transport->Post(Url(), "[]", {});
  EXPECT_FALSE(r.retryable());
}

TEST_F(HttplibTransportTest, NoServerIsAnErrorWithoutStatus) {
  OutboundHttpOptions options;
  options.timeout = std::chrono::milliseconds(500);
  auto transport = MakeHttpTransport(options);
  server_.stop();
  thread_.join();
  thread_ = std::thread([] {});
  const HttpResult r = transport->Post(Url(), "[]", {});
  EXPECT_EQ(r.status, 0);
  EXPECT_FALSE(r.error.empty());
  EXPECT_TRUE(r.retryable());
}

// https: the server's certificate is checked against the CA file, or the system's CAs.
TEST(HttpsTransportTest, VerifiesTheServerAgainstTheCaFile) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                    ("outbound-https-test-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string cert = (dir / "cert.pem").string();
  const std::string key = (dir / "key.pem").string();
  const std::string command =
      "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 "
      "-subj /CN=127.0.0.1 -addext subjectAltName=IP:127.0.0.1 -keyout " +
      key + " -out " + cert + " 2>/dev/null";
  ASSERT_EQ(std::system(command.c_str()), 0) << command;
  httplib::SSLServer server(cert.c_str(), key.c_str());
  ASSERT_TRUE(server.is_valid());
  server.Post("/hook", [](const httplib::Request&, httplib::Response& res) { res.status = 204; });
  const int port = server.bind_to_any_port("127.0.0.1");
  std::thread thread([&] { server.listen_after_bind(); });
  while (!server.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const std::string url = "https://127.0.0.1:" + std::to_string(port) + "/hook";

  OutboundHttpOptions trusted;
  trusted.ca_file = cert;
  HttpResult r = MakeHttpTransport(trusted)->Post(url, "{}", {});
  EXPECT_EQ(r.status, 204) << r.Describe();
  r = MakeHttpTransport({})->Post(url, "{}", {});  // a self-signed certificate
  EXPECT_EQ(r.status, 0);
  EXPECT_NE(r.error.find("not trusted by the system's CAs"), std::string::npos) << r.error;
  server.stop();
  thread.join();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace rankwatch
