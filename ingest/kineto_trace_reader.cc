#include "ingest/kineto_trace_reader.h"

#include <simdjson.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "absl/container/flat_hash_map.h"
#include "ingest/trace_file_buffer.h"

namespace rankwatch {
namespace {

namespace od = simdjson::ondemand;

absl::Status Fail(const std::filesystem::path& file, const std::string& why) {
  return absl::InvalidArgumentError(file.string() + ": " + why);
}

std::string JsonError(simdjson::error_code e) {
  return std::string("not valid trace JSON: ") + simdjson::error_message(e);
}

// Parses a JSON number token (µs) into integer ns, exactly for up to three decimals.
// `fractional` is set when the token is a JSON float (has a '.' or an exponent).
bool MicrosToNs(std::string_view tok, int64_t* ns, bool* fractional) {
  size_t i = 0;
  const bool neg = i < tok.size() && tok[i] == '-';
  if (neg) ++i;
  int64_t whole = 0;
  size_t digits = 0;
  while (i < tok.size() && tok[i] >= '0' && tok[i] <= '9') {
    if (++digits > 16) break;  // >= 1e16 µs would overflow ns: let strtod handle it
    whole = whole * 10 + (tok[i++] - '0');
  }
  if (digits == 0) return false;
  int64_t frac = 0;
  bool is_float = false;
  if (digits <= 16 && i < tok.size() && tok[i] == '.') {
    is_float = true;
    ++i;
    int scale = 100;
    bool round_up = false;
    for (int k = 0; i < tok.size() && tok[i] >= '0' && tok[i] <= '9'; ++i, ++k) {
      if (k < 3) {
        frac += (tok[i] - '0') * scale;
        scale /= 10;
      } else if (k == 3) {
        round_up = tok[i] >= '5';
      }
    }
    frac += round_up;
  }
  if (digits > 16 || (i < tok.size() && (tok[i] == 'e' || tok[i] == 'E' || tok[i] == '.'))) {
    const double x = std::strtod(std::string(tok).c_str(), nullptr);
    if (!std::isfinite(x) || std::fabs(x) > 9e15) return false;
    *ns = std::llround(x * 1000.0);
    *fractional = *fractional || tok.find_first_of(".eE") != std::string_view::npos;
    return true;
  }
  *ns = (neg ? -1 : 1) * (whole * 1000 + frac);
  *fractional = *fractional || is_float;
  return true;
}

// An integer arg; strings of digits are accepted (HTA coerces), anything else gives `fallback`.
int64_t IntArg(od::value& v, int64_t fallback) {
  od::json_type t;
  if (v.type().get(t)) return fallback;
  if (t == od::json_type::number) {
    int64_t i;
    if (!v.get_int64().get(i)) return i;
    double d;
    if (!v.get_double().get(d) && std::isfinite(d)) return static_cast<int64_t>(d);
    return fallback;
  }
  if (t == od::json_type::string) {
    std::string_view s;
    if (v.get_string().get(s) || s.empty()) return fallback;
    char* end = nullptr;
    const std::string copy(s);
    const long long x = std::strtoll(copy.c_str(), &end, 10);
    return (end != nullptr && *end == '\0') ? x : fallback;
  }
  return fallback;
}

class Interner {
 public:
  explicit Interner(std::vector<std::string>* strings) : strings_(strings) {
    strings_->emplace_back();
    ids_.emplace("", 0);
  }
  uint32_t Intern(std::string_view s) {
    auto it = ids_.find(absl::string_view(s.data(), s.size()));
    if (it != ids_.end()) return it->second;
    const uint32_t id = static_cast<uint32_t>(strings_->size());
    strings_->emplace_back(s);
    ids_.emplace(std::string(s), id);
    return id;
  }

 private:
  std::vector<std::string>* strings_;
  absl::flat_hash_map<std::string, uint32_t> ids_;
};

// Finds HTA's rank: the first `"rank":` followed by at least one non-newline whitespace and a
// digit (the regex `"rank":\s+(\d+)` applied line by line).
std::optional<uint32_t> HtaRank(std::string_view text) {
  constexpr std::string_view kKey = "\"rank\":";
  for (size_t pos = text.find(kKey); pos != std::string_view::npos;
       pos = text.find(kKey, pos + 1)) {
    size_t i = pos + kKey.size();
    size_t ws = 0;
    while (i < text.size() && (text[i] == ' ' || text[i] == '\t' || text[i] == '\r' ||
                               text[i] == '\f' || text[i] == '\v')) {
      ++i;
      ++ws;
    }
    if (ws == 0 || i >= text.size() || text[i] < '0' || text[i] > '9') continue;
    uint64_t r = 0;
    while (i < text.size() && text[i] >= '0' && text[i] <= '9' && r < (1ull << 32)) {
      r = r * 10 + (text[i++] - '0');
    }
    if (r < (1ull << 32)) return static_cast<uint32_t>(r);
  }
  return std::nullopt;
}

simdjson::error_code ParseArgs(od::object args, KinetoEvent* e) {
  for (auto field_result : args) {
    od::field field;
    if (auto err = std::move(field_result).get(field)) return err;
    const od::raw_json_string key = field.key();
    if (key == "stream") {
      e->stream = IntArg(field.value(), -1);
    } else if (key == "correlation") {
      e->correlation = IntArg(field.value(), -1);
    } else if (key == "bytes") {
      e->bytes = IntArg(field.value(), -1);
    } else if (key == "memory bandwidth (GB/s)") {
      double bw;
      if (!field.value().get_double().get(bw)) e->memory_bw_gbps = bw;
    }
  }
  return simdjson::SUCCESS;
}

simdjson::error_code ParseDistributedInfo(od::object info, KinetoTrace* t) {
  for (auto field_result : info) {
    od::field field;
    if (auto err = std::move(field_result).get(field)) return err;
    const od::raw_json_string key = field.key();
    if (const bool is_rank = key == "rank"; is_rank || key == "world_size") {
      const int64_t v = IntArg(field.value(), -1);
      if (v >= 0 && v < (int64_t{1} << 32)) {
        (is_rank ? t->json_rank : t->world_size) = static_cast<uint32_t>(v);
      }
    } else if (key == "backend") {
      std::string_view s;
      if (!field.value().get_string().get(s)) t->backend = std::string(s);
    }
  }
  return simdjson::SUCCESS;
}

}  // namespace

absl::StatusOr<KinetoTrace> ParseKinetoTrace(std::string_view json,
                                             const std::filesystem::path& file) {
  KinetoTrace t;
  t.file = file;
  t.decompressed_bytes = json.size();
  t.hta_rank = HtaRank(json);
  Interner interner(&t.strings);

  od::parser parser;
  od::document doc;
  if (auto err = parser.iterate(json.data(), json.size(), json.size() + simdjson::SIMDJSON_PADDING)
                     .get(doc)) {
    return Fail(file, JsonError(err));
  }
  od::object top;
  if (doc.get_object().get(top)) {
    return Fail(file, "not a Kineto trace: the top level is not a JSON object");
  }
  bool saw_events = false;
  for (auto field_result : top) {
    od::field field;
    if (auto err = std::move(field_result).get(field)) return Fail(file, JsonError(err));
    std::string_view key;
    if (auto err = field.unescaped_key().get(key)) return Fail(file, JsonError(err));
    if (key == "distributedInfo") {
      od::object info;
      if (field.value().get_object().get(info)) continue;  // absent or malformed: no rank
      if (auto err = ParseDistributedInfo(info, &t)) return Fail(file, JsonError(err));
    } else if (key == "baseTimeNanoseconds") {
      const int64_t base = IntArg(field.value(), -1);
      if (base >= 0) t.base_time_unix_ns = base;
    } else if (key == "traceEvents") {
      od::array events;
      if (field.value().get_array().get(events)) {
        return Fail(file, "not a Kineto trace: `traceEvents` is not an array");
      }
      saw_events = true;
      uint32_t index = 0;
      for (auto ev_result : events) {
        od::object ev;
        if (auto err = ev_result.get_object().get(ev)) {
          return Fail(file, "traceEvents[" + std::to_string(index) + "]: " + JsonError(err));
        }
        KinetoEvent e;
        e.index = index++;
        bool has_ts = false, has_dur = false, has_cat = false;
        for (auto f_result : ev) {
          od::field f;
          if (auto err = std::move(f_result).get(f)) {
            return Fail(file, "traceEvents[" + std::to_string(e.index) + "]: " + JsonError(err));
          }
          const od::raw_json_string k = f.key();
          const bool is_ts = k == "ts";
          if (is_ts || k == "dur") {
            std::string_view tok = f.value().raw_json_token();
            int64_t ns;
            bool frac = false;
            if (!MicrosToNs(tok, &ns, &frac)) continue;  // null or non-numeric: as absent
            if (is_ts) {
              e.ts_ns = ns;
              has_ts = true;
              t.ts_is_float = t.ts_is_float || frac;
            } else {
              e.dur_ns = ns;
              has_dur = true;
            }
          } else if (const bool is_name = k == "name"; is_name || k == "cat") {
            std::string_view s;
            if (f.value().get_string().get(s)) continue;
            if (is_name) {
              e.name = interner.Intern(s);
            } else {
              e.category = interner.Intern(s);
              has_cat = true;
            }
          } else if (k == "pid") {
            e.pid = static_cast<int32_t>(IntArg(f.value(), 0));
          } else if (k == "args") {
            od::object args;
            if (f.value().get_object().get(args)) continue;
            if (auto err = ParseArgs(args, &e)) {
              return Fail(file, "traceEvents[" + std::to_string(e.index) + "].args: " + JsonError(err));
            }
          }
        }
        if (!has_ts) t.ts_is_float = true;  // pandas: a missing value makes the column float
        if (has_dur && has_cat && has_ts) t.events.push_back(e);
      }
      t.raw_events = index;
    }
  }
  if (!saw_events) return Fail(file, "not a Kineto trace: no `traceEvents` array");
  return t;
}

absl::StatusOr<KinetoTrace> ReadKinetoTrace(const std::filesystem::path& file) {
  auto buffer = TraceFileBuffer::Read(file);
  if (!buffer.ok()) return buffer.status();
  return ParseKinetoTrace(buffer->view(), file);
}

absl::StatusOr<std::vector<std::filesystem::path>> FindKinetoTraces(
    const std::vector<std::string>& paths) {
  auto is_trace = [](const std::filesystem::path& p) {
    const std::string name = p.filename().string();
    auto ends = [&](std::string_view suffix) {
      return name.size() >= suffix.size() &&
             name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
    };
    return ends(".json") || ends(".json.gz");
  };
  std::vector<std::filesystem::path> found;
  for (const std::string& p : paths) {
    std::error_code ec;
    if (std::filesystem::is_directory(p, ec)) {
      const size_t before = found.size();
      for (const auto& entry : std::filesystem::recursive_directory_iterator(p, ec)) {
        if (entry.is_regular_file() && is_trace(entry.path())) found.push_back(entry.path());
      }
      if (ec) return absl::UnavailableError(p + ": " + ec.message());
      if (found.size() == before) return absl::NotFoundError(p + ": no *.json or *.json.gz traces");
    } else if (std::filesystem::is_regular_file(p, ec)) {
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
