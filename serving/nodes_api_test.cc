// The fleet view of nodes as its readers serve it, over real gRPC and real HTTP on 127.0.0.1:
// ListNodes and GET /api/v1/nodes[/<node>] hand the request to the NodeView with the wall
// clock as `now` and answer with what it says, the JSON API the same message as gRPC; an
// unknown node is an empty answer over gRPC and a 404 over HTTP; without a NodeView both say
// that the view is off (UNAVAILABLE, 503). The NodeView is a small in-memory implementation of
// the interface (fleet/node_view.h), not the ledger.
#include <google/protobuf/util/json_util.h>
#include <google/protobuf/util/message_differencer.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/wall_clock.h"
#include "fleet/node_view.h"
#include "rankwatch/v1/service.grpc.pb.h"
#include "serving/grpc_server.h"
#include "serving/snapshot_store.h"
#include "serving/web_server.h"

namespace rankwatch {
namespace {

using google::protobuf::util::MessageDifferencer;

// Records in memory: the top `limit` by lost rank-seconds (0: 50) without their jobs, or the
// one node asked for with its jobs. Remembers what it was asked.
class FakeNodeView final : public NodeView {
 public:
  explicit FakeNodeView(std::vector<v1::NodeRecord> records) : records_(std::move(records)) {}

  v1::ListNodesResponse ListNodes(const v1::ListNodesRequest& request,
                                  int64_t now_unix_ns) const override {
    std::lock_guard<std::mutex> lock(mu_);
    requests_.push_back(request);
    nows_.push_back(now_unix_ns);
    v1::ListNodesResponse out;
    out.set_nodes_total(static_cast<uint32_t>(records_.size()));
    out.set_horizon_seconds(7 * 86400);
    out.set_alert_window_seconds(86400);
    out.set_alert_jobs(3);
    out.set_complete(complete_);
    std::vector<const v1::NodeRecord*> sorted;
    for (const v1::NodeRecord& r : records_) sorted.push_back(&r);
    std::sort(sorted.begin(), sorted.end(), [](const v1::NodeRecord* a, const v1::NodeRecord* b) {
      return a->lost_rank_seconds() > b->lost_rank_seconds();
    });
    const size_t limit = request.limit() == 0 ? 50 : request.limit();
    for (const v1::NodeRecord* r : sorted) {
      if (!request.node().empty()) {
        if (r->node() == request.node()) *out.add_nodes() = *r;
        continue;
      }
      if (static_cast<size_t>(out.nodes_size()) == limit) break;
      v1::NodeRecord* top = out.add_nodes();
      *top = *r;
      top->clear_by_job();
    }
    return out;
  }

  std::vector<v1::ListNodesRequest> requests() const {
    std::lock_guard<std::mutex> lock(mu_);
    return requests_;
  }
  std::vector<int64_t> nows() const {
    std::lock_guard<std::mutex> lock(mu_);
    return nows_;
  }
  void set_complete(bool complete) {
    std::lock_guard<std::mutex> lock(mu_);
    complete_ = complete;
  }

 private:
  const std::vector<v1::NodeRecord> records_;
  mutable std::mutex mu_;
  mutable std::vector<v1::ListNodesRequest> requests_;
  mutable std::vector<int64_t> nows_;
  bool complete_ = true;
};

v1::NodeRecord Record(const std::string& node, double lost, int jobs, bool firing) {
  v1::NodeRecord r;
  r.set_node(node);
  r.set_jobs(static_cast<uint32_t>(jobs));
  r.set_episodes(static_cast<uint32_t>(jobs + 1));
  r.set_lost_rank_seconds(lost);
  r.set_first_unix_ns(1'790'000'000'000'000'000);
  r.set_last_unix_ns(1'790'000'600'000'000'000);
  r.set_jobs_in_alert_window(static_cast<uint32_t>(jobs));
  r.set_alert_firing(firing);
  for (int j = 0; j < jobs; ++j) {
    v1::NodeJob* job = r.add_by_job();
    job->set_training_job("team/job-" + std::to_string(j));
    job->set_namespace_("team");
    job->set_episodes(1);
    job->set_lost_rank_seconds(lost / jobs);
    job->add_ranks(static_cast<uint32_t>(8 + j));
    job->set_firing(j == 0);
  }
  return r;
}

class NodesApiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    view_ = std::make_unique<FakeNodeView>(std::vector<v1::NodeRecord>{
        Record("node-3", 40.5, 1, false), Record("node-1", 9000.25, 3, true),
        Record("node-7", 700, 2, false)});
  }

  // Starts both servers over `view` (null: none), served as a part serves it.
  void Start(NodeView* view) {
    if (view != nullptr) parts_.Offer<NodeView>(view);
    GrpcServerOptions grpc_options;
    grpc_options.address = {"127.0.0.1", 0};
    grpc_options.sources.snapshots = &snapshots_;
    grpc_options.sources.parts = &parts_;
    auto grpc_server = GrpcServer::Start(grpc_options);
    ASSERT_TRUE(grpc_server.ok()) << grpc_server.status();
    grpc_ = std::move(*grpc_server);
    stub_ = v1::RankWatch::NewStub(
        grpc::CreateChannel(grpc_->address().ToString(), grpc::InsecureChannelCredentials()));
    WebServerOptions web_options;
    web_options.address = {"127.0.0.1", 0};
    web_options.sources.snapshots = &snapshots_;
    web_options.sources.parts = &parts_;
    auto web_server = WebServer::Start(web_options);
    ASSERT_TRUE(web_server.ok()) << web_server.status();
    web_ = std::move(*web_server);
  }

  grpc::Status Call(const v1::ListNodesRequest& request, v1::ListNodesResponse* response) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    return stub_->ListNodes(&context, request, response);
  }

  httplib::Result Get(const std::string& path) {
    httplib::Client client("127.0.0.1", web_->address().port);
    client.set_connection_timeout(5);
    client.set_read_timeout(10);
    return client.Get(path.c_str());
  }

  // The body of a 200 answer parsed as a ListNodesResponse (protobuf's own JSON parser).
  v1::ListNodesResponse GetNodes(const std::string& path) {
    auto res = Get(path);
    v1::ListNodesResponse parsed;
    if (!res) {
      ADD_FAILURE() << path << ": no answer";
      return parsed;
    }
    EXPECT_EQ(res->status, 200) << path << ": " << res->body;
    EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(res->body, &parsed).ok()) << res->body;
    return parsed;
  }

  SnapshotStore snapshots_;
  PartServices parts_;
  std::unique_ptr<FakeNodeView> view_;
  std::unique_ptr<GrpcServer> grpc_;
  std::unique_ptr<v1::RankWatch::Stub> stub_;
  std::unique_ptr<WebServer> web_;
};

TEST_F(NodesApiTest, GrpcHandsTheRequestAndTheWallClockToTheView) {
  ASSERT_NO_FATAL_FAILURE(Start(view_.get()));
  v1::ListNodesRequest request;
  request.set_limit(2);
  v1::ListNodesResponse top;
  const int64_t before = WallNowUnixNs();
  ASSERT_TRUE(Call(request, &top).ok());
  const int64_t after = WallNowUnixNs();
  ASSERT_EQ(view_->requests().size(), 1u);
  EXPECT_TRUE(MessageDifferencer::Equals(view_->requests()[0], request));
  EXPECT_GE(view_->nows()[0], before);
  EXPECT_LE(view_->nows()[0], after);
  ASSERT_EQ(top.nodes_size(), 2);
  EXPECT_EQ(top.nodes(0).node(), "node-1");
  EXPECT_EQ(top.nodes(1).node(), "node-7");
  EXPECT_EQ(top.nodes(0).by_job_size(), 0);
  EXPECT_EQ(top.nodes_total(), 3u);
  EXPECT_EQ(top.alert_jobs(), 3u);
  EXPECT_TRUE(top.nodes(0).alert_firing());
  EXPECT_TRUE(MessageDifferencer::Equals(top, view_->ListNodes(request, 0)));

  // One node with its jobs; an unknown one is an empty answer, not an error.
  request.Clear();
  request.set_node("node-1");
  v1::ListNodesResponse one;
  ASSERT_TRUE(Call(request, &one).ok());
  ASSERT_EQ(one.nodes_size(), 1);
  EXPECT_EQ(one.nodes(0).by_job_size(), 3);
  EXPECT_EQ(one.nodes(0).by_job(1).training_job(), "team/job-1");
  EXPECT_EQ(one.nodes(0).by_job(1).ranks(0), 9u);
  EXPECT_EQ(view_->requests().back().node(), "node-1");
  request.set_node("node-404");
  v1::ListNodesResponse none;
  ASSERT_TRUE(Call(request, &none).ok());
  EXPECT_EQ(none.nodes_size(), 0);
  EXPECT_EQ(none.nodes_total(), 3u);
}

TEST_F(NodesApiTest, TheJsonApiAnswersAsGrpcDoes) {
  ASSERT_NO_FATAL_FAILURE(Start(view_.get()));
  v1::ListNodesResponse by_grpc;
  ASSERT_TRUE(Call(v1::ListNodesRequest(), &by_grpc).ok());
  EXPECT_EQ(by_grpc.nodes_size(), 3);
  EXPECT_TRUE(MessageDifferencer::Equals(GetNodes("/api/v1/nodes"), by_grpc));
  EXPECT_EQ(view_->requests().back().limit(), 0u);
  const v1::ListNodesResponse limited = GetNodes("/api/v1/nodes?limit=1");
  EXPECT_EQ(view_->requests().back().limit(), 1u);
  ASSERT_EQ(limited.nodes_size(), 1);
  EXPECT_EQ(limited.nodes(0).node(), "node-1");

  v1::ListNodesRequest request;
  request.set_node("node-7");
  ASSERT_TRUE(Call(request, &by_grpc).ok());
  const v1::ListNodesResponse one = GetNodes("/api/v1/nodes/node-7");
  EXPECT_TRUE(MessageDifferencer::Equals(one, by_grpc));
  EXPECT_EQ(one.nodes(0).by_job_size(), 2);
  EXPECT_EQ(view_->requests().back().node(), "node-7");
  EXPECT_EQ(view_->requests().back().limit(), 0u);
  EXPECT_GT(view_->nows().back(), 0);

  // The JSON mapping the UI reads: lowerCamelCase, 64-bit integers as strings.
  auto res = Get("/api/v1/nodes/node-1");
  ASSERT_TRUE(res);
  EXPECT_NE(res->body.find("\"lostRankSeconds\":9000.25"), std::string::npos) << res->body;
  EXPECT_NE(res->body.find("\"firstUnixNs\":\"1790000000000000000\""), std::string::npos);
  EXPECT_NE(res->body.find("\"trainingJob\":\"team/job-0\""), std::string::npos);
  EXPECT_NE(res->body.find("\"alertFiring\":true"), std::string::npos);
}

TEST_F(NodesApiTest, UnknownNodesAndBadParametersAreClearErrors) {
  ASSERT_NO_FATAL_FAILURE(Start(view_.get()));
  auto res = Get("/api/v1/nodes/node-404");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 404);
  EXPECT_NE(res->body.find("no record of node 'node-404' within the last 7d"), std::string::npos)
      << res->body;
  EXPECT_EQ(res->body.find("not complete"), std::string::npos) << res->body;
  // Right after a start, before the view has read the nodes topic, it says so.
  view_->set_complete(false);
  res = Get("/api/v1/nodes/node-404");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 404);
  EXPECT_NE(res->body.find("not complete"), std::string::npos) << res->body;
  for (const char* bad :
       {"/api/v1/nodes?limit=x", "/api/v1/nodes?limit=-1", "/api/v1/nodes?limit=99999999999"}) {
    res = Get(bad);
    ASSERT_TRUE(res) << bad;
    EXPECT_EQ(res->status, 400) << bad << ": " << res->body;
    EXPECT_NE(res->body.find("limit"), std::string::npos) << res->body;
  }
  // The UI's pages for nodes are the one page.
  for (const char* page : {"/ui/nodes", "/ui/nodes/", "/ui/nodes/node-1"}) {
    res = Get(page);
    ASSERT_TRUE(res) << page;
    EXPECT_EQ(res->status, 200) << page;
    EXPECT_NE(res->body.find("/ui/assets/app.js"), std::string::npos) << page;
  }
}

TEST_F(NodesApiTest, WithoutAViewBothSayItIsOff) {
  ASSERT_NO_FATAL_FAILURE(Start(nullptr));
  v1::ListNodesResponse response;
  const grpc::Status status = Call(v1::ListNodesRequest(), &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_NE(status.error_message().find("fleet view of nodes is not enabled"), std::string::npos)
      << status.error_message();
  for (const char* path : {"/api/v1/nodes", "/api/v1/nodes/node-1"}) {
    auto res = Get(path);
    ASSERT_TRUE(res) << path;
    EXPECT_EQ(res->status, 503) << path;
    EXPECT_NE(res->body.find("fleet view of nodes is not enabled"), std::string::npos) << res->body;
  }
  // The other queries go on.
  grpc::ClientContext context;
  v1::ListJobsResponse jobs;
  EXPECT_TRUE(stub_->ListJobs(&context, v1::ListJobsRequest(), &jobs).ok());
}

}  // namespace
}  // namespace rankwatch
