#include "daemon/consumer_group.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cctype>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include <fmt/format.h>

#include "kafka/cluster_requests.h"

namespace rankwatch {

std::string DefaultInstanceId(std::string_view host, std::string_view state_dir) {
  uint64_t hash = 14695981039346656037ull;  // FNV-1a, 64 bits: stable across builds
  for (unsigned char ch : state_dir) {
    hash ^= ch;
    hash *= 1099511628211ull;
  }
  std::string id = "rankwatchd-";
  for (char ch : host.empty() ? std::string_view("unknown-host") : host) {
    const bool allowed =
        std::isalnum(static_cast<unsigned char>(ch)) || ch == '.' || ch == '_' || ch == '-';
    id += allowed ? ch : '_';
  }
  char suffix[16];
  std::snprintf(suffix, sizeof(suffix), "-%08x", static_cast<uint32_t>(hash ^ (hash >> 32)));
  return id + suffix;
}

GroupMembership ChooseGroupMembership(const std::string& instance_id,
                                      std::optional<Duration> session_timeout,
                                      bool development_broker, std::string_view host,
                                      std::string_view state_dir) {
  GroupMembership m;
  m.session_timeout = session_timeout
                          ? std::chrono::duration_cast<std::chrono::milliseconds>(*session_timeout)
                      : development_broker ? kDevelopmentSessionTimeout
                                           : kClusterSessionTimeout;
  if (development_broker || instance_id == "none") {
    m.instance_id.clear();
  } else if (!instance_id.empty()) {
    m.instance_id = instance_id;
  } else {
    m.instance_id = DefaultInstanceId(host, state_dir);
  }
  return m;
}

std::string DescribeGroupMembership(const GroupMembership& m, const std::string& group,
                                    bool development_broker) {
  const double seconds = std::chrono::duration<double>(m.session_timeout).count();
  if (development_broker) {
    return fmt::format(
        "kafka: the development broker does not support static group membership: joining "
        "group {} as a dynamic member; after a crash this instance gets its partitions back "
        "once its predecessor's session ({:g} s) has timed out",
        group, seconds);
  }
  if (m.instance_id.empty()) {
    return fmt::format("kafka: joining group {} as a dynamic member (session timeout {:g} s)",
                       group, seconds);
  }
  return fmt::format(
      "kafka: joining group {} as static member {} (session timeout {:g} s): a restart with this "
      "id takes its partitions back at once",
      group, m.instance_id, seconds);
}

bool IsDevelopmentBroker(const std::string& brokers, const KafkaProperties& properties,
                         std::chrono::milliseconds timeout) {
  auto id = QueryKafkaClusterId(brokers, properties, timeout);
  if (!id.ok()) {
    spdlog::warn(
        "kafka: could not ask {} for its cluster id ({}); taking it for a Kafka "
        "cluster",
        brokers, std::string(id.status().message()));
    return false;
  }
  return IsDevelopmentClusterId(*id);
}

std::string HostName() {
  if (const char* pod = std::getenv("POD_NAME"); pod != nullptr && *pod != '\0') return pod;
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) == 0) return name;
  return "";
}

}  // namespace rankwatch
