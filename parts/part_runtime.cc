#include "parts/part_runtime.h"

#include <utility>

namespace rankwatch {

PartRuntime::PartRuntime(std::vector<std::unique_ptr<DaemonPart>> parts,
                         PartEnvironment environment, std::function<TimePoint()> clock)
    : environment_(std::move(environment)),
      duties_(std::move(clock)),
      context_(&environment_, &duties_, &services_),
      parts_(std::move(parts)) {}

// The parts go in reverse order: a later part may use an earlier one's services.
PartRuntime::~PartRuntime() {
  while (!parts_.empty()) parts_.pop_back();
}

absl::Status PartRuntime::Start() {
  for (const auto& part : parts_) {
    if (absl::Status s = part->Start(context_); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status PartRuntime::Restored() {
  for (const auto& part : parts_) {
    if (absl::Status s = part->Restored(context_); !s.ok()) return s;
  }
  return absl::OkStatus();
}

void PartRuntime::Checkpoint() {
  for (const auto& save : context_.checkpoint_savers()) save();
}

void PartRuntime::Stop() {
  for (const auto& part : parts_) part->Stop();
  Checkpoint();
}

}  // namespace rankwatch
