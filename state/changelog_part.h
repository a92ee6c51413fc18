// ChangelogPart: the state changelog (state/state_changelog.h) as a part of rankwatchd
// (parts/daemon_part.h): with a changelog topic it opens the changelog and offers it to the
// runtime, whose task manager appends each owned partition's checkpoints to it and adopts a
// partition's state from it when the partition moves here (docs/architecture.md, "Changelog and
// scale-out"). Without a topic (a single instance) it does nothing.
//
// Not thread-safe: started on the main thread; the changelog itself is used by the task manager.
#pragma once

#include <memory>
#include <string>

#include "parts/daemon_part.h"
#include "state/state_changelog.h"

namespace rankwatch {

struct ChangelogPartOptions {
  // Compacted topic holding a copy of the state, so partitions can move between instances of
  // one group. Empty (default): none, for a single instance.
  std::string topic;
};

class ChangelogPart : public DaemonPart {
 public:
  explicit ChangelogPart(ChangelogPartOptions options) : options_(std::move(options)) {}

  std::string_view name() const override { return "changelog"; }
  absl::Status Start(PartContext& context) override;

 private:
  const ChangelogPartOptions options_;
  std::unique_ptr<StateChangelog> changelog_;
};

}  // namespace rankwatch
