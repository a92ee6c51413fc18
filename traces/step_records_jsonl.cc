#include "traces/step_records_jsonl.h"

#include <google/protobuf/util/json_util.h>
#include <simdjson.h>

#include <algorithm>
#include <fstream>
#include <limits>

namespace rankwatch {
namespace {

constexpr std::string_view kSuffix = ".steps.jsonl";

absl::Status LineError(const std::filesystem::path& file, size_t line, const std::string& what) {
  return absl::InvalidArgumentError(file.string() + ":" + std::to_string(line) + ": " + what);
}

// Reads member `key`, an unsigned integer below 2^32, into `out` (left as it is when absent and
// not required). False, with `error` said, when it is missing but required or not such a number.
bool Uint32Member(simdjson::dom::object o, std::string_view key, bool required, uint32_t* out,
                  std::string* error) {
  simdjson::dom::element e;
  if (o.at_key(key).get(e) != simdjson::SUCCESS) {
    if (required) *error = "no \"" + std::string(key) + "\"";
    return !required;
  }
  uint64_t v = 0;
  if (e.get_uint64().get(v) != simdjson::SUCCESS || v > std::numeric_limits<uint32_t>::max()) {
    *error = "\"" + std::string(key) + "\" is not a number from 0 to 4294967295";
    return false;
  }
  *out = static_cast<uint32_t>(v);
  return true;
}

// Reads member `key`, a string, into `out` (absent or null: left as it is).
bool StringMember(simdjson::dom::object o, std::string_view key, std::string* out,
                  std::string* error) {
  simdjson::dom::element e;
  if (o.at_key(key).get(e) != simdjson::SUCCESS || e.is_null()) return true;
  std::string_view v;
  if (e.get_string().get(v) != simdjson::SUCCESS) {
    *error = "\"" + std::string(key) + "\" is not a string";
    return false;
  }
  *out = std::string(v);
  return true;
}

}  // namespace

bool IsStepRecordsFile(const std::filesystem::path& file) {
  const std::string name = file.filename().string();
  return name.size() > kSuffix.size() && name.ends_with(kSuffix);
}

absl::StatusOr<std::vector<StepRecordLine>> ReadStepRecordsJsonl(
    const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) return absl::NotFoundError(file.string() + ": cannot be read");
  std::vector<StepRecordLine> out;
  simdjson::dom::parser parser;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = true;  // a newer collector's fields
  std::string text;
  for (size_t line = 1; std::getline(in, text); ++line) {
    if (!text.empty() && text.back() == '\r') text.pop_back();
    if (std::all_of(text.begin(), text.end(), [](char c) { return c == ' ' || c == '\t'; })) {
      continue;
    }
    simdjson::dom::object o;
    if (auto e = parser.parse(text).get_object().get(o); e != simdjson::SUCCESS) {
      return LineError(file, line, std::string("not a JSON object: ") + simdjson::error_message(e));
    }
    StepRecordLine r;
    std::string error;
    if (!Uint32Member(o, "rank", true, &r.rank, &error) ||
        !Uint32Member(o, "world_size", false, &r.world_size, &error) ||
        !StringMember(o, "node", &r.node, &error) ||
        !StringMember(o, "device", &r.device, &error)) {
      return LineError(file, line, error);
    }
    if (r.world_size > 0 && r.rank >= r.world_size) {
      return LineError(
          file, line,
          "rank " + std::to_string(r.rank) + " of world size " + std::to_string(r.world_size));
    }
    simdjson::dom::object record;
    if (o.at_key("record").get_object().get(record) != simdjson::SUCCESS) {
      return LineError(file, line, "no \"record\" object");
    }
    const std::string record_json = simdjson::to_string(record);
    if (auto s = google::protobuf::util::JsonStringToMessage(record_json, &r.record, options);
        !s.ok()) {
      return LineError(file, line, "not a StepRecord: " + std::string(s.message()));
    }
    out.push_back(std::move(r));
  }
  if (in.bad()) return absl::UnavailableError(file.string() + ": read failed");
  return out;
}

absl::StatusOr<std::vector<std::filesystem::path>> FindStepRecordFiles(
    const std::vector<std::string>& paths) {
  std::vector<std::filesystem::path> found;
  for (const std::string& p : paths) {
    std::error_code ec;
    if (std::filesystem::is_directory(p, ec)) {
      const size_t before = found.size();
      for (const auto& entry : std::filesystem::recursive_directory_iterator(p, ec)) {
        if (entry.is_regular_file() && IsStepRecordsFile(entry.path())) {
          found.push_back(entry.path());
        }
      }
      if (ec) return absl::UnavailableError(p + ": " + ec.message());
      if (found.size() == before) return absl::NotFoundError(p + ": no *.steps.jsonl files");
    } else if (std::filesystem::is_regular_file(p, ec)) {
      if (!IsStepRecordsFile(p)) {
        return absl::InvalidArgumentError(p + ": not a step-records file (*.steps.jsonl)");
      }
      found.emplace_back(p);
    } else {
      return absl::NotFoundError(p + ": no such file or directory");
    }
  }
  std::sort(found.begin(), found.end());
  found.erase(std::unique(found.begin(), found.end()), found.end());
  return found;
}

}  // namespace rankwatch
