#include "common/listen_address.h"

#include <charconv>

namespace rankwatch {

absl::StatusOr<ListenAddress> ParseListenAddress(std::string_view text) {
  const size_t colon = text.rfind(':');
  if (colon == std::string_view::npos) {
    return absl::InvalidArgumentError("listen address '" + std::string(text) +
                                      "' must be host:port");
  }
  ListenAddress a;
  a.host = std::string(text.substr(0, colon));
  if (a.host.size() >= 2 && a.host.front() == '[' && a.host.back() == ']') {
    a.host = a.host.substr(1, a.host.size() - 2);
  }
  if (a.host.empty()) a.host = "0.0.0.0";
  const std::string_view port = text.substr(colon + 1);
  auto [ptr, ec] = std::from_chars(port.data(), port.data() + port.size(), a.port);
  if (ec != std::errc() || ptr != port.data() + port.size() || a.port < 0 || a.port > 65535) {
    return absl::InvalidArgumentError("listen address '" + std::string(text) + "' has a bad port");
  }
  return a;
}

}  // namespace rankwatch
