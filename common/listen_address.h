// Parsing of "host:port" listen addresses (port 0 = any free port).
#pragma once

#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace rankwatch {

struct ListenAddress {
  std::string host;
  int port = 0;
  std::string ToString() const { return host + ":" + std::to_string(port); }
};

// Accepts "host:port", "[v6]:port" and ":port" (all interfaces).
absl::StatusOr<ListenAddress> ParseListenAddress(std::string_view text);

}  // namespace rankwatch
