// GroupMembership: how one rankwatchd instance joins its consumer group: as a static member (a
// group.instance.id, KIP-345) or a dynamic one, and with which session timeout. The policy
// (ChooseGroupMembership) is a pure function of the settings, of what the brokers are and of the
// host's name; main() gathers those (IsDevelopmentBroker, HostName) and hands the result to the
// consumer. docs/operating.md, "Restarts", tells the operator's side.
//
// Plain functions and values; thread-compatible.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <string_view>

#include "kafka/kafka_properties.h"
#include "operators/time.h"

namespace rankwatch {

// The consumer group's session timeout when none is configured: on a Kafka cluster, and on the
// development broker (loopback only, and no static membership there: a restarted instance
// waits for its predecessor's session to time out, twice; see docs/operating.md).
inline constexpr std::chrono::milliseconds kClusterSessionTimeout{10000};
inline constexpr std::chrono::milliseconds kDevelopmentSessionTimeout{3000};

struct GroupMembership {
  std::string instance_id;  // group.instance.id; empty: a dynamic member
  std::chrono::milliseconds session_timeout{kClusterSessionTimeout};
};

// The group.instance.id of an instance running on `host` (the pod name under Kubernetes, else
// the host name) with its state in `state_dir` (an absolute path): "rankwatchd-<host>-<8 hex
// digits of a hash of state_dir>". The same host and state directory give the same id, so a
// restarted instance takes its predecessor's place; two instances on one host differ. Characters
// Kafka does not allow in an id become '_'.
std::string DefaultInstanceId(std::string_view host, std::string_view state_dir);

// The membership of an instance with the settings `instance_id` ("": derived from `host` and
// `state_dir`; "none": dynamic) and `session_timeout` (none: the default for the brokers),
// on the development broker or a Kafka cluster. The development broker does not support static
// membership (librdkafka's mock cluster reads group.instance.id and ignores it, while a static
// member sends no LeaveGroup on shutdown): there the member is always dynamic.
GroupMembership ChooseGroupMembership(const std::string& instance_id,
                                      std::optional<Duration> session_timeout,
                                      bool development_broker, std::string_view host,
                                      std::string_view state_dir);

// One log line saying how the instance joins `group`, and what that means after a crash.
std::string DescribeGroupMembership(const GroupMembership& membership, const std::string& group,
                                    bool development_broker);

// Whether `brokers` are the development broker (rankwatch's embedded one, or `rankwatch
// kafka`), asking them for their cluster id. Brokers that do not answer within `timeout` are
// taken for a Kafka cluster, with a warning in the log. Blocks for up to `timeout`.
bool IsDevelopmentBroker(const std::string& brokers, const KafkaProperties& properties,
                         std::chrono::milliseconds timeout);

// The name this host goes by in instance ids: $POD_NAME when set (Kubernetes), else the host
// name; "" when neither is known.
std::string HostName();

}  // namespace rankwatch
