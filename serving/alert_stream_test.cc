// WatchAlerts over real gRPC streams on 127.0.0.1, concurrently (run under TSan by
// scripts/test.sh --sanitize=thread): the ingest thread appends alerts while the checkpoint
// writer stores and publishes them, several clients stream them on gRPC's threads (slow ones
// overflow and resume with after_sequence, one cancels mid-stream and comes back), the hub's
// reaper runs, and ListJobs is answered meanwhile. Every client gets every alert exactly once,
// in order; Stop ends the streams still open with UNAVAILABLE.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "alerting/alert_hub.h"
#include "rankwatch/v1/service.grpc.pb.h"
#include "serving/grpc_server.h"
#include "serving/snapshot_store.h"
#include "state/checkpoint_writer.h"
#include "state/state_store.h"

namespace rankwatch {
namespace {

using namespace std::chrono_literals;

v1::Alert MakeAlert(uint64_t i) {
  v1::Alert a;
  const std::string job = "job-" + std::to_string(i % 3);
  a.set_id(job + "|straggler|rank:1");
  a.set_training_job(job);
  a.set_kind(v1::ALERT_STRAGGLER);
  a.set_state(i % 2 ? v1::ALERT_RESOLVED : v1::ALERT_FIRING);
  a.set_severity(v1::SEVERITY_WARN);
  return a;
}

class AlertStreamTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("alert-stream-test-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    auto s = StateStore::Open({dir_});
    ASSERT_TRUE(s.ok()) << s.status();
    store_ = std::move(*s);
    writer_ = std::make_unique<CheckpointWriter>(store_.get(), CheckpointWriterOptions{}, nullptr,
                                                 nullptr);
  }
  void TearDown() override {
    writer_.reset();
    store_.reset();
    std::filesystem::remove_all(dir_);
  }
  std::filesystem::path dir_;
  std::unique_ptr<StateStore> store_;
  std::unique_ptr<CheckpointWriter> writer_;
};

// Streams alerts from `stub` until it has every one up to `total`, resuming after the last one
// it got whenever a stream ends early; `cancel_once` cancels its first stream after 100 alerts.
// Returns the sequences in the order they arrived.
std::vector<uint64_t> Watch(v1::RankWatch::Stub* stub, uint64_t total, bool slow, bool cancel_once,
                            int* resumes) {
  std::vector<uint64_t> got;
  uint64_t last = 0;
  const auto deadline = std::chrono::steady_clock::now() + 90s;
  while (last < total && std::chrono::steady_clock::now() < deadline) {
    grpc::ClientContext context;
    v1::WatchAlertsRequest request;
    request.set_after_sequence(last);
    auto reader = stub->WatchAlerts(&context, request);
    v1::Alert alert;
    while (last < total && reader->Read(&alert)) {
      EXPECT_GT(alert.sequence(), last) << "duplicate or out of order";
      got.push_back(alert.sequence());
      last = alert.sequence();
      if (slow && got.size() % 32 == 0) std::this_thread::sleep_for(5ms);
      if (cancel_once && got.size() == 100) {
        cancel_once = false;
        context.TryCancel();
        break;
      }
    }
    if (last >= total) {
      context.TryCancel();
      (void)reader->Finish();
      break;
    }
    const grpc::Status status = reader->Finish();
    EXPECT_TRUE(status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED ||
                status.error_code() == grpc::StatusCode::CANCELLED)
        << status.error_code() << " " << status.error_message();
    ++*resumes;
  }
  return got;
}

TEST_F(AlertStreamTest, ConcurrentStreamsGetEveryAlertOnceInOrderWhileAppendsGoOn) {
  AlertHubOptions options;
  options.subscriber_queue = 16;
  options.ring_capacity = 128;
  options.stuck_after = 100ms;
  AlertHub hub(store_.get(), writer_.get(), options, {});
  SnapshotStore snapshots;
  GrpcServerOptions server_options;
  server_options.address = {"127.0.0.1", 0};
  server_options.sources.snapshots = &snapshots;
  server_options.sources.alerts = &hub;
  server_options.alerts = &hub;
  auto server = GrpcServer::Start(server_options);
  ASSERT_TRUE(server.ok()) << server.status();
  auto channel =
      grpc::CreateChannel((*server)->address().ToString(), grpc::InsecureChannelCredentials());
  auto stub = v1::RankWatch::NewStub(channel);

  constexpr uint64_t kAlerts = 1200;
  struct Client {
    bool slow = false, cancel_once = false;
    int resumes = 0;
    std::vector<uint64_t> got;
  };
  std::vector<Client> clients(4);
  clients[1].cancel_once = true;
  clients[2].slow = clients[3].slow = true;
  std::vector<std::thread> threads;
  for (Client& client : clients) {
    threads.emplace_back([&stub, c = &client] {
      c->got = Watch(stub.get(), kAlerts, c->slow, c->cancel_once, &c->resumes);
    });
  }
  std::atomic<bool> done{false};
  std::atomic<int> listed{0};
  std::thread lister([&] {
    while (!done) {
      grpc::ClientContext context;
      v1::ListJobsResponse response;
      EXPECT_TRUE(stub->ListJobs(&context, v1::ListJobsRequest(), &response).ok());
      ++listed;
      std::this_thread::sleep_for(2ms);
    }
  });
  std::thread ingest([&] {
    for (uint64_t i = 0; i < kAlerts;) {
      std::vector<v1::Alert> alerts;
      for (int k = 0; k < 1 + static_cast<int>(i % 4) && i < kAlerts; ++k) {
        alerts.push_back(MakeAlert(i++));
      }
      hub.Append(std::move(alerts), {});
      if (i % 40 == 0) std::this_thread::sleep_for(1ms);
    }
    EXPECT_TRUE(hub.Flush().ok());
  });
  ingest.join();
  for (std::thread& t : threads) t.join();
  done = true;
  lister.join();

  std::vector<uint64_t> all(kAlerts);
  for (uint64_t i = 0; i < kAlerts; ++i) all[i] = i + 1;
  for (size_t i = 0; i < clients.size(); ++i) EXPECT_EQ(clients[i].got, all) << "client " << i;
  EXPECT_GE(clients[1].resumes, 1);  // the one that cancelled came back
  EXPECT_GT(listed.load(), 0);

  // A stream still open when the server stops ends with UNAVAILABLE and where to resume.
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + 30s);
  v1::WatchAlertsRequest request;
  request.set_after_sequence(kAlerts - 1);
  auto reader = stub->WatchAlerts(&context, request);
  v1::Alert alert;
  ASSERT_TRUE(reader->Read(&alert));
  EXPECT_EQ(alert.sequence(), kAlerts);
  std::thread stopper([&] { (*server)->Stop(); });
  EXPECT_FALSE(reader->Read(&alert));
  const grpc::Status status = reader->Finish();
  stopper.join();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
  EXPECT_NE(status.error_message().find("after_sequence=" + std::to_string(kAlerts)),
            std::string::npos)
      << status.error_message();
}

}  // namespace
}  // namespace rankwatch
