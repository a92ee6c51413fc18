// FakeHttpTransport: an HttpTransport for tests of the outbound alert paths
// (alertmanager_push_test, alert_actions_test). It records every POST and answers with the
// status the test sets. Shared state (`Calls`), so a test keeps a handle on what a transport it
// handed over sees. Thread-safe.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "sinks/outbound_http.h"

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

}  // namespace rankwatch
