#include "state/changelog_part.h"

#include <spdlog/spdlog.h>

#include <utility>

namespace rankwatch {

absl::Status ChangelogPart::Start(PartContext& context) {
  if (options_.topic.empty()) return absl::OkStatus();
  const PartEnvironment& env = context.environment();
  StateChangelogOptions o;
  o.brokers = env.brokers;
  o.topic = options_.topic;
  o.source_topic = env.telemetry_topic;
  o.properties = env.kafka;
  auto opened = StateChangelog::Open(o);
  if (!opened.ok()) return opened.status();
  changelog_ = std::move(*opened);
  context.services().Offer<StateChangelog>(changelog_.get());
  spdlog::info("state changelog: {} (partitions can move between instances of group {})",
               options_.topic, env.group);
  return absl::OkStatus();
}

}  // namespace rankwatch
