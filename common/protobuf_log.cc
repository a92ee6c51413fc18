#include "common/protobuf_log.h"

#include <google/protobuf/stubs/logging.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <string>

#include "common/log_throttle.h"

namespace rankwatch {
namespace {

void ProtobufLog(google::protobuf::LogLevel level, const char* file, int line,
                 const std::string& message) {
  if (level == google::protobuf::LOGLEVEL_FATAL) {
    spdlog::critical("protobuf {}:{}: {}", file, line, message);
    return;
  }
  static LogThrottle* const throttle = new LogThrottle(std::chrono::minutes(1));
  if (auto since = throttle->Admit(std::chrono::steady_clock::now())) {
    spdlog::warn("protobuf ({} message{} since the last report): {}", *since,
                 *since == 1 ? "" : "s", message);
  }
}

}  // namespace

void RouteProtobufLogs() { google::protobuf::SetLogHandler(&ProtobufLog); }

}  // namespace rankwatch
