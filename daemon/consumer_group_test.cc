#include "daemon/consumer_group.h"

#include <gtest/gtest.h>

namespace rankwatch {
namespace {

using std::chrono::seconds;

TEST(ConsumerGroupTest, TheDefaultInstanceIdIsStableForOneStateDirAndDiffersBetweenThem) {
  const std::string a = DefaultInstanceId("gpu-17", "/var/lib/rankwatch");
  EXPECT_EQ(a, DefaultInstanceId("gpu-17", "/var/lib/rankwatch"));  // a restart keeps it
  EXPECT_EQ(a.rfind("rankwatchd-gpu-17-", 0), 0u) << a;
  EXPECT_EQ(a.size(), std::string("rankwatchd-gpu-17-").size() + 8) << a;
  EXPECT_NE(a, DefaultInstanceId("gpu-17", "/var/lib/rankwatch-2"));  // a second instance
  EXPECT_NE(a, DefaultInstanceId("gpu-18", "/var/lib/rankwatch"));
  // Kafka allows [a-zA-Z0-9._-] in an id.
  const std::string odd = DefaultInstanceId("pod name/ü", "/s");
  EXPECT_EQ(
      odd.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-"),
      std::string::npos)
      << odd;
  EXPECT_EQ(DefaultInstanceId("", "/s").rfind("rankwatchd-unknown-host-", 0), 0u);
}

TEST(ConsumerGroupTest, OnAKafkaClusterTheInstanceIsAStaticMemberUnlessToldNone) {
  const GroupMembership derived =
      ChooseGroupMembership("", std::nullopt, false, "gpu-17", "/var/lib/rankwatch");
  EXPECT_EQ(derived.instance_id, DefaultInstanceId("gpu-17", "/var/lib/rankwatch"));
  EXPECT_EQ(derived.session_timeout, kClusterSessionTimeout);
  const GroupMembership named =
      ChooseGroupMembership("rw-east-1", seconds(20), false, "gpu-17", "/var/lib/rankwatch");
  EXPECT_EQ(named.instance_id, "rw-east-1");
  EXPECT_EQ(named.session_timeout, seconds(20));
  const GroupMembership none =
      ChooseGroupMembership("none", std::nullopt, false, "gpu-17", "/var/lib/rankwatch");
  EXPECT_EQ(none.instance_id, "");
  EXPECT_NE(DescribeGroupMembership(named, "rankwatch", false).find("static member rw-east-1"),
            std::string::npos);
  EXPECT_NE(DescribeGroupMembership(none, "rankwatch", false).find("dynamic member"),
            std::string::npos);
}

TEST(ConsumerGroupTest, OnTheDevelopmentBrokerTheInstanceIsAlwaysDynamicWithAShortSession) {
  // librdkafka's mock cluster ignores group.instance.id, and a static member sends no
  // LeaveGroup: a configured id is dropped there.
  const GroupMembership m =
      ChooseGroupMembership("rw-east-1", std::nullopt, true, "gpu-17", "/var/lib/rankwatch");
  EXPECT_EQ(m.instance_id, "");
  EXPECT_EQ(m.session_timeout, kDevelopmentSessionTimeout);
  EXPECT_EQ(ChooseGroupMembership("", seconds(7), true, "h", "/s").session_timeout, seconds(7));
  EXPECT_NE(DescribeGroupMembership(m, "rankwatch", true)
                .find("the development broker does not support static group membership"),
            std::string::npos);
}

}  // namespace
}  // namespace rankwatch
