// Test helper: a control-request sender (CaptureStore::Sender, HangInspector::Sender) that keeps
// what it was asked to send, parsed, or fails with `status`.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "rankwatch/v1/control.pb.h"

namespace rankwatch {

struct Sent {
  std::vector<std::pair<std::string, v1::ControlRequest>> requests;
  absl::Status status = absl::OkStatus();
  std::function<absl::Status(const std::string&, const std::string&)> Sender() {
    return [this](const std::string& key, const std::string& payload) {
      if (!status.ok()) return status;
      v1::ControlRequest r;
      EXPECT_TRUE(r.ParseFromString(payload));
      requests.emplace_back(key, r);
      return absl::OkStatus();
    };
  }
};

}  // namespace rankwatch
