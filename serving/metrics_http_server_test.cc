// The metrics server over real HTTP on loopback: /metrics is gzip-compressed for a client that
// takes gzip (Prometheus, browsers) and sent as it is otherwise, never brotli-compressed.
#include "serving/metrics_http_server.h"

#include <gtest/gtest.h>
#include <httplib.h>
#include <zlib.h>

#include <string>

namespace rankwatch {
namespace {

std::string Gunzip(const std::string& in) {
  z_stream z{};
  EXPECT_EQ(inflateInit2(&z, 15 + 16), Z_OK);
  std::string out;
  char buf[65536];
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
  z.avail_in = static_cast<uInt>(in.size());
  int rc = Z_OK;
  while (rc == Z_OK) {
    z.next_out = reinterpret_cast<Bytef*>(buf);
    z.avail_out = sizeof(buf);
    rc = inflate(&z, Z_NO_FLUSH);
    out.append(buf, sizeof(buf) - z.avail_out);
  }
  EXPECT_EQ(rc, Z_STREAM_END);
  inflateEnd(&z);
  return out;
}

class MetricsHttpServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    MetricFamily* family =
        registry_.Gauge("test_step_seconds", "A gauge with many series.", {"training_job", "rank"});
    for (int rank = 0; rank < 500; ++rank) {
      family->WithLabels({"job-a", std::to_string(rank)})->Set(rank * 0.25);
    }
    auto server = MetricsHttpServer::Start(ListenAddress{"127.0.0.1", 0}, &registry_);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
  }

  // GET `path` with `accept_encoding` ("" sends none), the body as it came over the wire.
  httplib::Result Get(const std::string& path, const std::string& accept_encoding) {
    httplib::Client client("127.0.0.1", server_->address().port);
    client.set_decompress(false);
    client.set_connection_timeout(5);
    client.set_read_timeout(10);
    httplib::Headers headers;
    if (!accept_encoding.empty()) headers.emplace("Accept-Encoding", accept_encoding);
    return client.Get(path.c_str(), headers);
  }

  PrometheusRegistry registry_;
  std::unique_ptr<MetricsHttpServer> server_;
};

TEST_F(MetricsHttpServerTest, ABrowserGetsGzipNotBrotli) {
  const std::string expected = registry_.Render();
  ASSERT_GT(expected.size(), 10000u);
  auto res = Get("/metrics", "gzip, deflate, br");
  ASSERT_TRUE(res) << httplib::to_string(res.error());
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(res->get_header_value("Content-Encoding"), "gzip");
  EXPECT_EQ(res->get_header_value("Content-Type"), "text/plain; version=0.0.4; charset=utf-8");
  EXPECT_EQ(res->get_header_value("Vary"), "Accept-Encoding");
  EXPECT_EQ(std::stoul(res->get_header_value("Content-Length")), res->body.size());
  EXPECT_LT(res->body.size(), expected.size() / 3);
  EXPECT_EQ(Gunzip(res->body), expected);
}

TEST_F(MetricsHttpServerTest, PrometheusAcceptsGzipAndGetsIt) {
  // What Prometheus's scraper sends.
  auto res = Get("/metrics", "gzip");
  ASSERT_TRUE(res) << httplib::to_string(res.error());
  EXPECT_EQ(res->get_header_value("Content-Encoding"), "gzip");
  EXPECT_EQ(Gunzip(res->body), registry_.Render());
}

TEST_F(MetricsHttpServerTest, AClientThatTakesNoGzipGetsPlainText) {
  for (const std::string& accept : {std::string(), std::string("br"), std::string("identity"),
                                    std::string("gzip;q=0, br"), std::string("gzip; q=0.0")}) {
    auto res = Get("/metrics", accept);
    ASSERT_TRUE(res) << accept << ": " << httplib::to_string(res.error());
    EXPECT_EQ(res->status, 200) << accept;
    EXPECT_FALSE(res->has_header("Content-Encoding")) << accept;
    EXPECT_EQ(res->body, registry_.Render()) << accept;
  }
}

TEST_F(MetricsHttpServerTest, AWeightedGzipIsTaken) {
  auto res = Get("/metrics", "br;q=1.0, gzip;q=0.5");
  ASSERT_TRUE(res) << httplib::to_string(res.error());
  EXPECT_EQ(res->get_header_value("Content-Encoding"), "gzip");
  EXPECT_EQ(Gunzip(res->body), registry_.Render());
}

TEST_F(MetricsHttpServerTest, HealthzIsSmallAndPlain) {
  auto res = Get("/healthz", "gzip, br");
  ASSERT_TRUE(res) << httplib::to_string(res.error());
  EXPECT_EQ(res->body, "ok\n");
  EXPECT_FALSE(res->has_header("Content-Encoding"));
}

}  // namespace
}  // namespace rankwatch
