// Test support of the outbound alert paths (alertmanager_push_test, alert_actions_test):
//  - FakeHttpTransport, an HttpTransport that records every POST and answers with the status
//    the test sets; its state (FakeHttpCalls) is shared, so a test keeps a handle on what a
//    transport it handed over sees. Thread-safe.
//  - StoredAlertHub: an alert hub over a real state store in a temporary folder, reopened to
//    play a daemon restart. One test thread.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "alerting/alert_hub.h"
#include "alerting/outbound_http.h"
#include "state/checkpoint_writer.h"

namespace rankwatch {

struct FakeHttpCalls {
  struct Call {
    std::string url;
    std::string body;
    HttpHeaders headers;
    std::string Header(const std::string& name) const {
      for (const auto& [n, v] : headers) {
        if (n == name) return v;
      }
      return "";
    }
  };
  std::mutex mu;
  std::vector<Call> calls;
  int status = 200;  // 0: no answer ("connection refused")

  std::vector<Call> Take() {
    std::lock_guard<std::mutex> lock(mu);
    return std::exchange(calls, {});
  }
  void Answer(int s) {
    std::lock_guard<std::mutex> lock(mu);
    status = s;
  }
};

class FakeHttpTransport : public HttpTransport {
 public:
  explicit FakeHttpTransport(std::shared_ptr<FakeHttpCalls> calls) : calls_(std::move(calls)) {}
  HttpResult Post(const std::string& url, const std::string& body,
                  const HttpHeaders& headers) override {
    std::lock_guard<std::mutex> lock(calls_->mu);
    calls_->calls.push_back({url, body, headers});
    HttpResult r;
    r.status = calls_->status;
    if (r.status == 0) r.error = "Connection";
    return r;
  }

 private:
  std::shared_ptr<FakeHttpCalls> calls_;
};

class StoredAlertHub {
 public:
  explicit StoredAlertHub(const std::string& name)
      : dir_(std::filesystem::temp_directory_path() /
             (name + "-" + std::to_string(::getpid()) + "-" +
              ::testing::UnitTest::GetInstance()->current_test_info()->name())) {
    std::filesystem::remove_all(dir_);
    Reopen();
  }
  ~StoredAlertHub() {
    Close();
    std::filesystem::remove_all(dir_);
  }
  // A daemon restart: everything closed, then opened again on the same store.
  void Reopen() {
    Close();
    StateStoreOptions options;
    options.dir = dir_;
    auto s = StateStore::Open(options);
    ASSERT_TRUE(s.ok()) << s.status();
    store_ = std::move(*s);
    writer_ = std::make_unique<CheckpointWriter>(store_.get(), CheckpointWriterOptions{}, nullptr,
                                                 nullptr);
    hub_ = std::make_unique<AlertHub>(store_.get(), writer_.get(), AlertHubOptions{},
                                      AlertHubMetrics{});
  }
  // Appends `alerts` and waits until they are stored and published.
  void Append(std::vector<v1::Alert> alerts) {
    hub_->Append(std::move(alerts), {});
    ASSERT_TRUE(hub_->Flush().ok());
  }
  // What the daemon hands the outbound paths: writes through the checkpoint writer.
  std::function<void(Checkpoint)> Persist() {
    return [w = writer_.get()](Checkpoint c) { w->EnqueueNoWait(std::move(c), nullptr); };
  }
  void Drain() { ASSERT_TRUE(writer_->Drain().ok()); }
  AlertHub* hub() { return hub_.get(); }
  const StateStore* store() { return store_.get(); }

 private:
  void Close() {
    hub_.reset();
    writer_.reset();
    store_.reset();
  }
  const std::filesystem::path dir_;
  std::unique_ptr<StateStore> store_;
  std::unique_ptr<CheckpointWriter> writer_;
  std::unique_ptr<AlertHub> hub_;
};

}  // namespace rankwatch
