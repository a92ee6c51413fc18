// The layout of the outbound deliveries' state in the StateStore: what rankwatchd delivered of
// its alerts to Alertmanager (alerting/alertmanager_push.h) and what its action policy did
// (alerting/alert_actions.h). Like the alert log they belong to this instance (they follow its
// sequences), so they live in the `metadata` family, never in the changelog:
//   "outbound/am/" target '\0' 'c'        -> state::v1::PushCursor
//   "outbound/am/" target '\0' 'f' id     -> state::v1::PushFiring (one per firing alert)
//   "outbound/action-cursor"              -> state::v1::PushCursor (the action policy's)
//   "outbound/action/" big-endian sequence -> state::v1::ActionRecord (by firing sequence)
//
// Stateless functions; thread-safe as the StateStore they read.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "rankwatch/state/v1/outbound.pb.h"
#include "state/state_store.h"

namespace rankwatch::outbound_state {

// ---- Alertmanager targets ----

struct StoredPush {
  // Every alert up to this sequence was delivered; none stored: a target never configured.
  std::optional<uint64_t> cursor;
  std::map<std::string, state::v1::PushFiring> firing;  // by alert id
};

// The stored state of `target` (a URL); empty when none is stored. Unreadable state is DataLoss.
absl::StatusOr<StoredPush> ReadPush(const StateStore& store, const std::string& target);

void PutPushCursor(const std::string& target, uint64_t sequence, Checkpoint* out);
void PutPushFiring(const std::string& target, const std::string& alert_id,
                   const state::v1::PushFiring& firing, Checkpoint* out);
void DeletePushFiring(const std::string& target, const std::string& alert_id, Checkpoint* out);

// ---- Actions ----

// Every alert up to the stored sequence was seen by the action policy; nullopt: none stored.
absl::StatusOr<std::optional<uint64_t>> ReadActionCursor(const StateStore& store);
void PutActionCursor(uint64_t sequence, Checkpoint* out);

void PutAction(const state::v1::ActionRecord& record, Checkpoint* out);
// Deletes the records of firings with a sequence below `first_kept`.
void TrimActions(uint64_t first_kept, Checkpoint* out);
// Calls `fn` for each stored record from firing sequence `from` on, in order, until it returns
// false. An unreadable record is DataLoss.
absl::Status ScanActions(const StateStore& store, uint64_t from,
                         const std::function<bool(state::v1::ActionRecord&&)>& fn);

}  // namespace rankwatch::outbound_state
