#include "traces/kineto_trace_reader.h"

#include <simdjson.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "absl/container/flat_hash_map.h"
#include "traces/trace_file_buffer.h"

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
  // 16 digits can still be more µs than int64 ns hold (9,223,372,036,854,775 is the most).
  constexpr int64_t kMaxWhole = (INT64_MAX - 1000) / 1000;
  if (whole > kMaxWhole) return false;
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
    // In range of int64 (a larger double would be undefined behaviour to convert).
    if (!v.get_double().get(d) && d > -9.2e18 && d < 9.2e18) return static_cast<int64_t>(d);
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

namespace {

std::string At(uint32_t index) { return "traceEvents[" + std::to_string(index) + "]: "; }

// Parses one complete event object.
absl::Status ParseEvent(od::object ev, uint32_t index, Interner& interner, KinetoTrace* t) {
  KinetoEvent e;
  e.index = index;
  bool has_ts = false, has_dur = false, has_cat = false;
  for (auto f_result : ev) {
    od::field f;
    if (auto err = std::move(f_result).get(f))
      return absl::InvalidArgumentError(At(index) + JsonError(err));
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
        t->ts_is_float = t->ts_is_float || frac;
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
      if (auto err = ParseArgs(args, &e))
        return absl::InvalidArgumentError(At(index) + "args: " + JsonError(err));
    }
  }
  if (!has_ts) t->ts_is_float = true;  // pandas: a missing value makes the column float
  if (has_dur && has_cat && has_ts) t->events.push_back(e);
  return absl::OkStatus();
}

// Splits a trace, fed in pieces, into top-level members and `traceEvents` elements, and parses
// them in batches of about 1 MiB: memory stays bounded by the batch, not the file. Scanning
// resumes at the last complete unit, whose state (depth, inside the events array) is known.
class TraceStream {
 public:
  explicit TraceStream(KinetoTrace* t) : t_(t), interner_(&t->strings) {}

  // Scans the new bytes only: the state where the previous piece ended (depth, inside a
  // string or not) is kept, so a unit spanning many pieces is not scanned again for each.
  absl::Status Feed(const char* data, size_t len) {
    pending_.append(data, len);
    size_t i = scan_, unit_start = 0;
    const char* p = pending_.data();
    const size_t n = pending_.size();
    while (i < n) {
      const char c = p[i];
      if (string_open_ == kNone && depth_ == 0 && c != '{' && c != ' ' && c != '\n' && c != '\r' &&
          c != '\t') {
        return absl::InvalidArgumentError("not a Kineto trace: the top level is not a JSON object");
      }
      if (string_open_ != kNone || c == '"') {
        // Skip the string (escape-aware); an unfinished string goes on in the next piece.
        const size_t open = string_open_ != kNone ? string_open_ : i;
        size_t j = string_open_ != kNone ? i : i + 1;
        string_open_ = kNone;
        while (true) {
          const void* q = std::memchr(p + j, '"', n - j);
          if (q == nullptr) {
            string_open_ = open;
            return Keep(unit_start, n);
          }
          j = static_cast<const char*>(q) - p;
          size_t k = j;
          while (k > open + 1 && p[k - 1] == '\\') --k;
          ++j;
          if ((j - 1 - k) % 2 == 0) break;
        }
        if (depth_ == 1 && key_.empty() && !in_events_) key_.assign(p + open + 1, j - open - 2);
        i = j;
        continue;
      }
      if (c == '{' || c == '[') {
        if (depth_ == 1 && c == '[' && key_ == "traceEvents") {
          in_events_ = true;
          saw_events_ = true;
          ++depth_;
          unit_start = ++i;
          continue;
        }
        if (depth_ == 2 && in_events_) unit_start = i;  // an element starts
        if (depth_ == 0) {
          if (saw_object_)
            return absl::InvalidArgumentError("not valid trace JSON: data after the document");
          saw_object_ = true;
          unit_start = i + 1;
        }
        ++depth_;
      } else if (c == '}' || c == ']') {
        --depth_;
        if (depth_ == 2 && in_events_) {
          AddElement(p + unit_start, i + 1 - unit_start);
          unit_start = i + 1;
        } else if (depth_ == 1 && in_events_) {  // end of traceEvents
          in_events_ = false;
          key_.clear();
          unit_start = i + 1;
        } else if (depth_ == 0) {
          if (auto s = EndMember(p + unit_start, i - unit_start); !s.ok()) return s;
          unit_start = i + 1;
        } else if (depth_ < 0) {
          return absl::InvalidArgumentError("not valid trace JSON: unbalanced brackets");
        }
      } else if (c == ',' && depth_ == 1) {
        if (auto s = EndMember(p + unit_start, i - unit_start); !s.ok()) return s;
        unit_start = i + 1;
      }
      ++i;
    }
    return Keep(unit_start, n);
  }

  absl::Status Finish() {
    if (auto s = Flush(); !s.ok()) return s;
    if (depth_ != 0 || !saw_object_)
      return absl::InvalidArgumentError("not valid trace JSON: truncated document");
    if (!saw_events_)
      return absl::InvalidArgumentError("not a Kineto trace: no `traceEvents` array");
    t_->raw_events = index_;
    return absl::OkStatus();
  }

 private:
  // Drops the processed prefix (the unfinished unit from `unit_start` on stays); the next
  // piece is scanned from `resume`. Parses the batch when it is large.
  absl::Status Keep(size_t unit_start, size_t resume) {
    if (batch_.size() >= (1u << 20)) {
      if (auto s = Flush(); !s.ok()) return s;
    }
    pending_.erase(0, unit_start);
    scan_ = resume - unit_start;
    if (string_open_ != kNone) string_open_ -= unit_start;
    return absl::OkStatus();
  }

  void AddElement(const char* data, size_t len) {
    batch_ += batch_.empty() ? '[' : ',';
    batch_.append(data, len);
    ++batch_count_;
  }

  absl::Status Flush() {
    if (batch_.empty()) return absl::OkStatus();
    batch_ += ']';
    batch_.reserve(batch_.size() + simdjson::SIMDJSON_PADDING);
    od::document doc;
    if (auto err = parser_.iterate(batch_.data(), batch_.size(), batch_.capacity()).get(doc)) {
      return absl::InvalidArgumentError(At(index_) + JsonError(err));
    }
    od::array events;
    if (auto err = doc.get_array().get(events))
      return absl::InvalidArgumentError(At(index_) + JsonError(err));
    for (auto ev_result : events) {
      od::object ev;
      if (auto err = std::move(ev_result).get_object().get(ev)) {
        return absl::InvalidArgumentError(At(index_) + JsonError(err));
      }
      if (auto s = ParseEvent(ev, index_++, interner_, t_); !s.ok()) return s;
    }
    batch_.clear();
    batch_count_ = 0;
    return absl::OkStatus();
  }

  // A complete top-level member `"key": value` other than traceEvents.
  absl::Status EndMember(const char* data, size_t len) {
    std::string key = std::move(key_);
    key_.clear();
    if (hta_rank_search_ && !t_->hta_rank) t_->hta_rank = HtaRank({data, len});
    if (key != "distributedInfo" && key != "baseTimeNanoseconds") return absl::OkStatus();
    const std::string_view member(data, len);
    const size_t colon = member.find(':', member.find('"', member.find('"') + 1));
    if (colon == std::string_view::npos) return absl::OkStatus();
    simdjson::padded_string value(member.substr(colon + 1));
    od::parser parser;
    od::document doc;
    if (parser.iterate(value).get(doc)) return absl::OkStatus();
    if (key == "distributedInfo") {
      od::object info;
      if (doc.get_object().get(info)) return absl::OkStatus();  // malformed: no rank
      if (auto err = ParseDistributedInfo(info, t_))
        return absl::InvalidArgumentError("distributedInfo: " + JsonError(err));
    } else {
      int64_t base = -1;
      std::string_view text;
      if (doc.get_int64().get(base)) {
        base =
            !doc.get_string().get(text) ? std::strtoll(std::string(text).c_str(), nullptr, 10) : -1;
      }
      if (base >= 0) t_->base_time_unix_ns = base;
    }
    return absl::OkStatus();
  }

  KinetoTrace* t_;
  Interner interner_;
  od::parser parser_;
  static constexpr size_t kNone = std::string::npos;
  std::string pending_, batch_, key_;
  size_t scan_ = 0;             // where scanning resumes in pending_
  size_t string_open_ = kNone;  // the opening quote of a string the last piece ended in
  size_t batch_count_ = 0;
  uint32_t index_ = 0;
  int depth_ = 0;
  bool in_events_ = false, saw_events_ = false, saw_object_ = false;
  bool hta_rank_search_ = true;
};

}  // namespace

absl::StatusOr<KinetoTrace> ParseKinetoTrace(std::string_view json,
                                             const std::filesystem::path& file) {
  KinetoTrace t;
  t.file = file;
  t.decompressed_bytes = json.size();
  TraceStream stream(&t);
  absl::Status s = stream.Feed(json.data(), json.size());
  if (s.ok()) s = stream.Finish();
  if (!s.ok()) return Fail(file, std::string(s.message()));
  return t;
}

absl::StatusOr<KinetoTrace> ParseKinetoTraceInPieces(std::string_view json, size_t piece,
                                                     const std::filesystem::path& file) {
  KinetoTrace t;
  t.file = file;
  t.decompressed_bytes = json.size();
  TraceStream stream(&t);
  piece = std::max<size_t>(piece, 1);
  absl::Status s;
  for (size_t at = 0; at < json.size() && s.ok(); at += piece) {
    s = stream.Feed(json.data() + at, std::min(piece, json.size() - at));
  }
  if (s.ok()) s = stream.Finish();
  if (!s.ok()) return Fail(file, std::string(s.message()));
  return t;
}

absl::StatusOr<KinetoTrace> ReadKinetoTrace(const std::filesystem::path& file) {
  KinetoTrace t;
  t.file = file;
  TraceStream stream(&t);
  auto sink = [&](const char* data, size_t len) {
    t.decompressed_bytes += len;
    return stream.Feed(data, len);
  };
  if (absl::Status s = StreamTraceFile(file, sink); !s.ok()) {
    return s.code() == absl::StatusCode::kNotFound ? s : Fail(file, std::string(s.message()));
  }
  if (absl::Status s = stream.Finish(); !s.ok()) return Fail(file, std::string(s.message()));
  return t;
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
