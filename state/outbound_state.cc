#include "state/outbound_state.h"

#include <string_view>

namespace rankwatch::outbound_state {
namespace {

constexpr std::string_view kPushPrefix = "outbound/am/";
constexpr std::string_view kActionPrefix = "outbound/action/";
constexpr std::string_view kActionCursorKey = "outbound/action-cursor";

absl::StatusOr<std::optional<uint64_t>> ReadCursor(const StateStore& store, std::string_view key) {
  auto value = store.Get(StateFamily::kMetadata, key);
  if (!value.ok()) return value.status();
  if (!*value) return std::optional<uint64_t>();
  state::v1::PushCursor c;
  if (!c.ParseFromString(**value)) {
    return absl::DataLossError("unreadable cursor " + std::string(key.substr(0, key.find('\0'))));
  }
  return std::optional<uint64_t>(c.sequence());
}

std::string CursorValue(uint64_t sequence) {
  state::v1::PushCursor c;
  c.set_sequence(sequence);
  return c.SerializeAsString();
}

std::string PushKey(const std::string& target, char kind) {
  std::string key(kPushPrefix);
  key += target;
  key += '\0';
  key += kind;
  return key;
}

std::string ActionKey(uint64_t sequence) {
  std::string key(kActionPrefix);
  for (int shift = 56; shift >= 0; shift -= 8) key.push_back(static_cast<char>(sequence >> shift));
  return key;
}

}  // namespace

absl::StatusOr<StoredPush> ReadPush(const StateStore& store, const std::string& target) {
  StoredPush out;
  auto cursor = ReadCursor(store, PushKey(target, 'c'));
  if (!cursor.ok()) return cursor.status();
  out.cursor = *cursor;
  const std::string prefix = PushKey(target, 'f');
  absl::Status bad;
  absl::Status s = store.ForEach(
      StateFamily::kMetadata, prefix, [&](std::string_view key, std::string_view value) {
        state::v1::PushFiring f;
        if (!f.ParseFromArray(value.data(), static_cast<int>(value.size()))) {
          bad = absl::DataLossError("unreadable firing alert of Alertmanager " + target);
          return;
        }
        out.firing[std::string(key.substr(prefix.size()))] = f;
      });
  if (!s.ok()) return s;
  if (!bad.ok()) return bad;
  return out;
}

void PutPushCursor(const std::string& target, uint64_t sequence, Checkpoint* out) {
  out->Put(StateFamily::kMetadata, PushKey(target, 'c'), CursorValue(sequence));
}

void PutPushFiring(const std::string& target, const std::string& alert_id,
                   const state::v1::PushFiring& firing, Checkpoint* out) {
  out->Put(StateFamily::kMetadata, PushKey(target, 'f') + alert_id, firing.SerializeAsString());
}

void DeletePushFiring(const std::string& target, const std::string& alert_id, Checkpoint* out) {
  out->Delete(StateFamily::kMetadata, PushKey(target, 'f') + alert_id);
}

absl::StatusOr<std::optional<uint64_t>> ReadActionCursor(const StateStore& store) {
  return ReadCursor(store, kActionCursorKey);
}

void PutActionCursor(uint64_t sequence, Checkpoint* out) {
  out->Put(StateFamily::kMetadata, std::string(kActionCursorKey), CursorValue(sequence));
}

void PutAction(const state::v1::ActionRecord& record, Checkpoint* out) {
  out->Put(StateFamily::kMetadata, ActionKey(record.firing_sequence()), record.SerializeAsString());
}

void TrimActions(uint64_t first_kept, Checkpoint* out) {
  out->DeleteRange(StateFamily::kMetadata, ActionKey(0), ActionKey(first_kept));
}

absl::Status ScanActions(const StateStore& store, uint64_t from,
                         const std::function<bool(state::v1::ActionRecord&&)>& fn) {
  absl::Status bad;
  absl::Status s = store.Scan(
      StateFamily::kMetadata, ActionKey(from), [&](std::string_view key, std::string_view value) {
        if (key.substr(0, kActionPrefix.size()) != kActionPrefix) {
          return false;
        }
        state::v1::ActionRecord r;
        if (!r.ParseFromArray(value.data(), static_cast<int>(value.size()))) {
          bad = absl::DataLossError("unreadable action record");
          return false;
        }
        return fn(std::move(r));
      });
  return s.ok() ? bad : s;
}

}  // namespace rankwatch::outbound_state
