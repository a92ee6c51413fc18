#include "flight_recorder/fr_reader.h"

#include <simdjson.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <fstream>
#include <limits>
#include <mutex>
#include <system_error>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/hash/hash.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "flight_recorder/safe_pickle.h"

namespace rankwatch::fr {

namespace {

using pickle::Document;
using pickle::Kind;
using pickle::Value;

constexpr size_t kMaxDepth = 64;  // the schema nests 6 deep; JSON and pickle alike

// Debian's Abseil has its own string_view type.
absl::string_view AV(std::string_view s) { return {s.data(), s.size()}; }

std::string_view Trim(std::string_view t) {
  while (!t.empty() &&
         (t.front() == ' ' || t.front() == '\t' || t.front() == '\n' || t.front() == '\r')) {
    t.remove_prefix(1);
  }
  while (!t.empty() &&
         (t.back() == ' ' || t.back() == '\t' || t.back() == '\n' || t.back() == '\r')) {
    t.remove_suffix(1);
  }
  return t;
}

// The JSON form as a Document of the same values the pickle gives (objects as dicts, arrays
// as lists), so that one walk reads both.
class JsonToDocument {
 public:
  JsonToDocument(Document* doc, size_t max_values) : doc_(doc), max_values_(max_values) {}

  absl::StatusOr<const Value*> Convert(simdjson::dom::element e, size_t depth) {
    if (depth > kMaxDepth) {
      return absl::InvalidArgumentError(
          absl::StrCat("flight recorder dump: JSON nested deeper than ", kMaxDepth));
    }
    if (++values_ > max_values_) {
      return absl::InvalidArgumentError(
          absl::StrCat("flight recorder dump: more than ", max_values_, " JSON values"));
    }
    switch (e.type()) {
      case simdjson::dom::element_type::ARRAY: {
        Value* list = doc_->New(Kind::kList);
        simdjson::dom::array array;
        if (e.get_array().get(array) != simdjson::SUCCESS) break;
        for (simdjson::dom::element item : array) {
          absl::StatusOr<const Value*> v = Convert(item, depth + 1);
          if (!v.ok()) return v.status();
          Document::Append(list, *v);
        }
        return list;
      }
      case simdjson::dom::element_type::OBJECT: {
        Value* dict = doc_->New(Kind::kDict);
        simdjson::dom::object object;
        if (e.get_object().get(object) != simdjson::SUCCESS) break;
        for (simdjson::dom::key_value_pair kv : object) {
          Document::Append(dict, doc_->NewStr(kv.key));
          absl::StatusOr<const Value*> v = Convert(kv.value, depth + 1);
          if (!v.ok()) return v.status();
          Document::Append(dict, *v);
        }
        return dict;
      }
      case simdjson::dom::element_type::INT64: return doc_->NewInt(e.get_int64().value_unsafe());
      case simdjson::dom::element_type::UINT64:
        return absl::InvalidArgumentError(absl::StrCat("flight recorder dump: JSON integer ",
                                                       e.get_uint64().value_unsafe(),
                                                       " does not fit in 64 bits"));
      case simdjson::dom::element_type::DOUBLE:
        return doc_->NewFloat(e.get_double().value_unsafe());
      case simdjson::dom::element_type::STRING: return doc_->NewStr(e.get_string().value_unsafe());
      case simdjson::dom::element_type::BOOL: return doc_->NewBool(e.get_bool().value_unsafe());
      case simdjson::dom::element_type::NULL_VALUE: return doc_->New(Kind::kNone);
    }
    return absl::InvalidArgumentError("flight recorder dump: unknown JSON value");
  }

 private:
  Document* doc_;
  size_t max_values_;
  size_t values_ = 0;
};

absl::StatusOr<Document> LoadJson(std::string_view bytes, const FrReadOptions& options) {
  simdjson::dom::parser parser;
  const simdjson::padded_string padded(bytes);
  simdjson::dom::element root;
  if (auto err = parser.parse(padded).get(root); err) {
    return absl::InvalidArgumentError(
        absl::StrCat("flight recorder dump: not valid JSON: ", simdjson::error_message(err)));
  }
  Document doc;
  JsonToDocument conv(&doc, options.max_values);
  absl::StatusOr<const Value*> v = conv.Convert(root, 1);
  if (!v.ok()) return v.status();
  doc.set_root(*v);
  return doc;
}

// The schema's fields of an entry.
enum class EntryField : uint8_t {
  kRecordId,
  kPgId,
  kProcessGroup,
  kCollectiveSeqId,
  kP2pSeqId,
  kOpId,
  kProfilingName,
  kInputSizes,
  kOutputSizes,
  kInputDtypes,
  kOutputDtypes,
  kState,
  kTimeCreated,
  kTimeStarted,
  kTimeCompleted,
  kTimeoutMs,
  kFrames,
  kIsP2p,
  kRetired,
};

const absl::flat_hash_map<std::string_view, EntryField>& EntryFields() {
  static const auto* fields = new absl::flat_hash_map<std::string_view, EntryField>{
      {"record_id", EntryField::kRecordId},
      {"pg_id", EntryField::kPgId},
      {"process_group", EntryField::kProcessGroup},
      {"collective_seq_id", EntryField::kCollectiveSeqId},
      {"p2p_seq_id", EntryField::kP2pSeqId},
      {"op_id", EntryField::kOpId},
      {"profiling_name", EntryField::kProfilingName},
      {"input_sizes", EntryField::kInputSizes},
      {"output_sizes", EntryField::kOutputSizes},
      {"input_dtypes", EntryField::kInputDtypes},
      {"output_dtypes", EntryField::kOutputDtypes},
      {"state", EntryField::kState},
      {"time_created_ns", EntryField::kTimeCreated},
      {"time_discovered_started_ns", EntryField::kTimeStarted},
      {"time_discovered_completed_ns", EntryField::kTimeCompleted},
      {"timeout_ms", EntryField::kTimeoutMs},
      {"frames", EntryField::kFrames},
      {"is_p2p", EntryField::kIsP2p},
      {"retired", EntryField::kRetired},
  };
  return *fields;
}

// The operation's name without the backend ("nccl:send 0->1" -> "send"): its first word.
std::string_view OpWord(std::string_view profiling_name) {
  const size_t colon = profiling_name.rfind(':');
  std::string_view op =
      colon == std::string_view::npos ? profiling_name : profiling_name.substr(colon + 1);
  op = Trim(op);
  const size_t space = op.find(' ');
  return space == std::string_view::npos ? op : op.substr(0, space);
}

// Walks a Document (pickle or JSON) into an FrDump. Every value walked is charged to the
// budget (max_expanded_bytes), so that shared references cannot make the walk or the result
// unbounded.
class DumpWalker {
 public:
  DumpWalker(const FrReadOptions& options, bool json)
      : options_(options), json_(json), budget_(options.max_expanded_bytes) {}

  absl::StatusOr<FrDump> Walk(const Value& root) {
    if (!root.is_dict())
      return Fail("", absl::StrCat("is a ", pickle::KindName(root.kind()), ", not a dict"));
    FrDump dump;
    const Value* pg_config = nullptr;
    const Value* pg_status = nullptr;
    const Value* entries = nullptr;
    for (size_t i = 0; i < root.size(); ++i) {
      if (absl::Status s = Charge(sizeof(Value*) * 2); !s.ok()) return s;
      const Value& k = root.key(i);
      if (!k.is_str()) continue;
      const std::string_view key = k.as_str();
      const Value& v = root.value(i);
      if (key == "version") {
        if (absl::Status s = Text(v, "version", &dump.version); !s.ok()) return s;
      } else if (key == "rank") {
        if (absl::Status s = Int(v, "rank", &dump.rank); !s.ok()) return s;
      } else if (key == "nccl_version" || key == "comm_lib_version") {
        if (absl::Status s = Text(v, key, &dump.nccl_version); !s.ok()) return s;
      } else if (key == "pg_config") {
        pg_config = &v;
      } else if (key == "pg_status") {
        pg_status = &v;
      } else if (key == "entries") {
        entries = &v;
      }
    }
    if (pg_config == nullptr) return Fail("pg_config", "missing");
    if (absl::Status s = Groups(*pg_config, &dump.groups); !s.ok()) return s;
    if (pg_status != nullptr) {
      if (absl::Status s = GroupStatuses(*pg_status, &dump.status); !s.ok()) return s;
    }
    if (entries == nullptr) {
      if (!json_) return Fail("entries", "missing");
      return dump;  // PyTorch's JSON form leaves out an empty ring buffer
    }
    if (!entries->is_sequence()) return WrongType("entries", *entries, "a list");
    if (entries->size() > options_.max_entries) {
      return Fail("entries",
                  absl::StrCat(entries->size(), " entries, more than ", options_.max_entries));
    }
    dump.entries.reserve(entries->size());
    for (size_t i = 0; i < entries->size(); ++i) {
      if (absl::Status s = Charge(sizeof(FrEntry)); !s.ok()) return s;
      entry_ = static_cast<int64_t>(i);
      if (absl::Status s = Entry(entries->item(i), &dump.entries.emplace_back()); !s.ok()) {
        return s;
      }
    }
    return dump;
  }

 private:
  absl::Status Fail(std::string_view field, std::string_view what) const {
    std::string where = "flight recorder dump";
    if (entry_ >= 0) absl::StrAppend(&where, ": entries[", entry_, "]");
    if (!field.empty()) absl::StrAppend(&where, entry_ >= 0 ? "." : ": ", AV(field));
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", AV(what)));
  }

  absl::Status WrongType(std::string_view field, const Value& v, std::string_view expected) const {
    return Fail(field,
                absl::StrCat("expected ", AV(expected), ", found ", pickle::KindName(v.kind())));
  }

  absl::Status Charge(size_t bytes) {
    if (bytes > budget_) {
      return absl::InvalidArgumentError(
          absl::StrCat("flight recorder dump: its parsed form exceeds ",
                       options_.max_expanded_bytes, " bytes (shared references expanded)"));
    }
    budget_ -= bytes;
    return absl::OkStatus();
  }

  absl::Status Str(const Value& v, std::string_view field, std::string* out) {
    if (!v.is_str()) return WrongType(field, v, "a str");
    if (absl::Status s = Charge(sizeof(std::string) + v.as_str().size()); !s.ok()) return s;
    *out = v.as_str();
    return absl::OkStatus();
  }

  // A str, or a number written as text (version 2.9 may come as a float).
  absl::Status Text(const Value& v, std::string_view field, std::string* out) {
    if (v.is_int()) {
      *out = absl::StrCat(v.as_int());
      return Charge(sizeof(std::string));
    }
    if (v.is_float()) {
      *out = absl::StrCat(v.as_float());
      return Charge(sizeof(std::string));
    }
    return Str(v, field, out);
  }

  // An int, a bool, an integral float, or a decimal string ("1", as PyTorch's test dumps).
  absl::Status Int(const Value& v, std::string_view field, int64_t* out) {
    if (absl::Status s = Charge(sizeof(int64_t)); !s.ok()) return s;
    switch (v.kind()) {
      case Kind::kInt:
      case Kind::kBool: *out = v.as_int(); return absl::OkStatus();
      case Kind::kFloat: {
        const double d = v.as_float();
        if (std::isfinite(d) && d == std::trunc(d) && std::fabs(d) < 9.2e18) {
          *out = static_cast<int64_t>(d);
          return absl::OkStatus();
        }
        return Fail(field, absl::StrCat("expected an integer, found ", d));
      }
      case Kind::kStr: {
        const std::string_view t = Trim(v.as_str());
        const char* end = t.data() + t.size();
        const auto [p, ec] = std::from_chars(t.data(), end, *out);
        if (t.empty() || ec != std::errc() || p != end) {
          return Fail(field, absl::StrCat("expected an integer, found the str \"",
                                          AV(v.as_str().substr(0, 32)), "\""));
        }
        return absl::OkStatus();
      }
      default: return WrongType(field, v, "an int");
    }
  }

  // A timestamp: None or 0 (not recorded) is -1.
  absl::Status Time(const Value& v, std::string_view field, int64_t* out) {
    if (v.is_none()) {
      *out = -1;
      return absl::OkStatus();
    }
    if (absl::Status s = Int(v, field, out); !s.ok()) return s;
    if (*out == 0) *out = -1;
    return absl::OkStatus();
  }

  absl::Status Bool(const Value& v, std::string_view field, bool* out) {
    if (v.is_bool() || v.is_int()) {
      *out = v.as_int() != 0;
      return Charge(1);
    }
    return WrongType(field, v, "a bool");
  }

  absl::Status Groups(const Value& config, std::vector<FrGroup>* out) {
    if (!config.is_dict()) return WrongType("pg_config", config, "a dict");
    absl::flat_hash_map<std::string, size_t> by_key;  // a repeated key: the last wins
    for (size_t i = 0; i < config.size(); ++i) {
      if (absl::Status s = Charge(sizeof(FrGroup)); !s.ok()) return s;
      std::string key;
      if (absl::Status s = Text(config.key(i), "pg_config key", &key); !s.ok()) return s;
      const std::string field = absl::StrCat("pg_config[\"", key.substr(0, 64), "\"]");
      FrGroup g;
      if (absl::Status s = Group(config.value(i), field, &g); !s.ok()) return s;
      if (g.name.empty()) g.name = key;
      auto [it, inserted] = by_key.try_emplace(std::move(key), out->size());
      if (inserted) {
        out->push_back(std::move(g));
      } else {
        (*out)[it->second] = std::move(g);
      }
    }
    return absl::OkStatus();
  }

  absl::Status Group(const Value& v, std::string_view field, FrGroup* g) {
    if (!v.is_dict()) return WrongType(field, v, "a dict");
    const Value* ranks = nullptr;
    for (size_t i = 0; i < v.size(); ++i) {
      if (absl::Status s = Charge(sizeof(Value*) * 2); !s.ok()) return s;
      const Value& k = v.key(i);
      if (!k.is_str()) continue;
      if (k.as_str() == "name") {
        if (absl::Status s = Text(v.value(i), absl::StrCat(AV(field), ".name"), &g->name);
            !s.ok()) {
          return s;
        }
      } else if (k.as_str() == "desc") {
        if (absl::Status s = Str(v.value(i), absl::StrCat(AV(field), ".desc"), &g->desc); !s.ok()) {
          return s;
        }
      } else if (k.as_str() == "ranks") {
        ranks = &v.value(i);
      }
    }
    const std::string rfield = absl::StrCat(AV(field), ".ranks");
    if (ranks == nullptr) return Fail(rfield, "missing");
    if (ranks->is_str()) {
      if (options_.interner != nullptr) {
        // Shared among the dumps read through the interner: not charged to this one.
        absl::StatusOr<FrRanks> r = options_.interner->Get(ranks->as_str());
        if (!r.ok()) return Fail(rfield, std::string(r.status().message()));
        g->ranks = *std::move(r);
        return absl::OkStatus();
      }
      if (absl::Status s = Charge(ranks->as_str().size() * sizeof(uint32_t)); !s.ok()) return s;
      absl::StatusOr<std::vector<uint32_t>> r = ParseFrRanks(ranks->as_str());
      if (!r.ok()) return Fail(rfield, std::string(r.status().message()));
      g->ranks = *std::move(r);
      return absl::OkStatus();
    }
    if (!ranks->is_sequence()) return WrongType(rfield, *ranks, "a str or a list");
    std::vector<uint32_t> list;
    list.reserve(ranks->size());
    for (const Value* r : ranks->items()) {
      int64_t rank;
      if (absl::Status s = Int(*r, rfield, &rank); !s.ok()) return s;
      if (rank < 0 || rank > std::numeric_limits<uint32_t>::max()) {
        return Fail(rfield, absl::StrCat("rank ", rank, " out of range"));
      }
      list.push_back(static_cast<uint32_t>(rank));
    }
    g->ranks = std::move(list);
    return absl::OkStatus();
  }

  absl::Status GroupStatuses(const Value& status, std::vector<FrGroupStatus>* out) {
    if (!status.is_dict()) return WrongType("pg_status", status, "a dict");
    absl::flat_hash_map<std::string, size_t> by_uid;
    for (size_t i = 0; i < status.size(); ++i) {
      if (absl::Status s = Charge(sizeof(FrGroupStatus)); !s.ok()) return s;
      FrGroupStatus st;
      if (absl::Status s = Text(status.key(i), "pg_status key", &st.uid); !s.ok()) return s;
      const std::string field = absl::StrCat("pg_status[\"", st.uid.substr(0, 64), "\"]");
      const Value& v = status.value(i);
      if (!v.is_dict()) return WrongType(field, v, "a dict");
      for (size_t j = 0; j < v.size(); ++j) {
        if (absl::Status s = Charge(sizeof(Value*) * 2); !s.ok()) return s;
        const Value& k = v.key(j);
        if (!k.is_str()) continue;
        int64_t* target = nullptr;
        if (k.as_str() == "last_enqueued_collective") target = &st.last_enqueued;
        if (k.as_str() == "last_started_collective") target = &st.last_started;
        if (k.as_str() == "last_completed_collective") target = &st.last_completed;
        if (target == nullptr) continue;
        if (absl::Status s = Int(v.value(j), absl::StrCat(field, ".", AV(k.as_str())), target);
            !s.ok()) {
          return s;
        }
      }
      auto [it, inserted] = by_uid.try_emplace(st.uid, out->size());
      if (inserted) {
        out->push_back(std::move(st));
      } else {
        (*out)[it->second] = std::move(st);
      }
    }
    return absl::OkStatus();
  }

  absl::Status Sizes(const Value& v, std::string_view field,
                     std::vector<std::vector<int64_t>>* out) {
    if (!v.is_sequence()) return WrongType(field, v, "a list of lists");
    out->clear();
    out->reserve(v.size());
    for (const Value* t : v.items()) {
      if (absl::Status s = Charge(sizeof(std::vector<int64_t>)); !s.ok()) return s;
      if (!t->is_sequence()) return WrongType(field, *t, "a list of sizes");
      std::vector<int64_t>& dims = out->emplace_back();
      dims.reserve(t->size());
      for (const Value* d : t->items()) {
        if (absl::Status s = Int(*d, field, &dims.emplace_back()); !s.ok()) return s;
      }
    }
    return absl::OkStatus();
  }

  // A list of str, or one str ("" is none), as PyTorch's analyzer tests write them.
  absl::Status Dtypes(const Value& v, std::string_view field, std::vector<std::string>* out) {
    out->clear();
    if (v.is_str()) {
      if (!v.as_str().empty()) return Str(v, field, &out->emplace_back());
      return absl::OkStatus();
    }
    if (!v.is_sequence()) return WrongType(field, v, "a list of str");
    out->reserve(v.size());
    for (const Value* d : v.items()) {
      if (absl::Status s = Str(*d, field, &out->emplace_back()); !s.ok()) return s;
    }
    return absl::OkStatus();
  }

  absl::Status Frames(const Value& v, std::vector<FrFrame>* out) {
    if (!v.is_sequence()) return WrongType("frames", v, "a list");
    const size_t n = std::min(v.size(), options_.max_frames);  // innermost first
    out->reserve(n);
    for (size_t i = 0; i < n; ++i) {
      if (absl::Status s = Charge(sizeof(FrFrame)); !s.ok()) return s;
      const Value& f = v.item(i);
      if (!f.is_dict()) return WrongType("frames", f, "a dict");
      FrFrame& frame = out->emplace_back();
      for (size_t j = 0; j < f.size(); ++j) {
        if (absl::Status s = Charge(sizeof(Value*) * 2); !s.ok()) return s;
        const Value& k = f.key(j);
        if (!k.is_str()) continue;
        absl::Status s;
        if (k.as_str() == "name") s = Str(f.value(j), "frames.name", &frame.name);
        if (k.as_str() == "filename") s = Str(f.value(j), "frames.filename", &frame.filename);
        if (k.as_str() == "line") s = Int(f.value(j), "frames.line", &frame.line);
        if (!s.ok()) return s;
      }
    }
    return absl::OkStatus();
  }

  absl::Status ProcessGroup(const Value& v, FrEntry* e) {
    if (!v.is_sequence() || v.size() == 0) {
      return WrongType("process_group", v, "a tuple (name, desc)");
    }
    if (absl::Status s = Text(v.item(0), "process_group[0]", &e->pg_name); !s.ok()) return s;
    if (v.size() > 1) return Str(v.item(1), "process_group[1]", &e->pg_desc);
    return absl::OkStatus();
  }

  absl::Status Entry(const Value& v, FrEntry* e) {
    if (!v.is_dict()) return WrongType("", v, "a dict");
    bool has_name = false, has_group = false, has_p2p = false;
    const auto& fields = EntryFields();
    for (size_t i = 0; i < v.size(); ++i) {
      if (absl::Status s = Charge(sizeof(Value*) * 2); !s.ok()) return s;
      const Value& k = v.key(i);
      if (!k.is_str()) continue;
      const auto it = fields.find(k.as_str());
      if (it == fields.end()) continue;  // thread_id, thread_name, duration_ms, ...
      const std::string_view name = it->first;
      const Value& x = v.value(i);
      absl::Status s;
      switch (it->second) {
        case EntryField::kRecordId: s = Int(x, name, &e->record_id); break;
        case EntryField::kPgId: s = Int(x, name, &e->pg_uid); break;
        case EntryField::kProcessGroup:
          s = ProcessGroup(x, e);
          has_group = true;
          break;
        case EntryField::kCollectiveSeqId: s = Int(x, name, &e->collective_seq_id); break;
        case EntryField::kP2pSeqId: s = Int(x, name, &e->p2p_seq_id); break;
        case EntryField::kOpId: s = Int(x, name, &e->op_id); break;
        case EntryField::kProfilingName:
          s = Str(x, name, &e->profiling_name);
          has_name = true;
          break;
        case EntryField::kInputSizes: s = Sizes(x, name, &e->input_sizes); break;
        case EntryField::kOutputSizes: s = Sizes(x, name, &e->output_sizes); break;
        case EntryField::kInputDtypes: s = Dtypes(x, name, &e->input_dtypes); break;
        case EntryField::kOutputDtypes: s = Dtypes(x, name, &e->output_dtypes); break;
        case EntryField::kState: {
          std::string state;
          s = Str(x, name, &state);
          e->state = state == "scheduled"   ? FrState::kScheduled
                     : state == "started"   ? FrState::kStarted
                     : state == "completed" ? FrState::kCompleted
                                            : FrState::kUnknown;
          break;
        }
        case EntryField::kTimeCreated: s = Time(x, name, &e->time_created_ns); break;
        case EntryField::kTimeStarted: s = Time(x, name, &e->time_started_ns); break;
        case EntryField::kTimeCompleted: s = Time(x, name, &e->time_completed_ns); break;
        case EntryField::kTimeoutMs: s = Int(x, name, &e->timeout_ms); break;
        case EntryField::kFrames:
          e->frames.clear();
          s = Frames(x, &e->frames);
          break;
        case EntryField::kIsP2p:
          s = Bool(x, name, &e->is_p2p);
          has_p2p = true;
          break;
        case EntryField::kRetired: s = Bool(x, name, &e->retired); break;
      }
      if (!s.ok()) return s;
    }
    if (!has_name) return Fail("profiling_name", "missing");
    if (!has_group) return Fail("process_group", "missing");
    if (!has_p2p) {
      const std::string_view op = OpWord(e->profiling_name);
      e->is_p2p = op == "send" || op == "recv";
    }
    // Gloo's work has no events: torch (2.13) writes every gloo entry as "scheduled", done or
    // not, and marks the finished ones `retired`. A retired gloo entry is a completed one.
    if (e->retired && e->state == FrState::kScheduled &&
        absl::StartsWith(e->profiling_name, "gloo:"))
      e->state = FrState::kCompleted;
    return absl::OkStatus();
  }

  const FrReadOptions& options_;
  bool json_;
  size_t budget_;
  int64_t entry_ = -1;
};

}  // namespace

absl::StatusOr<std::vector<uint32_t>> ParseFrRanks(std::string_view text) {
  std::string_view t = Trim(text);
  if (!t.empty() && t.front() == '[') {
    if (t.back() != ']') {
      return absl::InvalidArgumentError(
          absl::StrCat("ranks \"", AV(text.substr(0, 64)), "\": no closing bracket"));
    }
    t = t.substr(1, t.size() - 2);
  }
  std::vector<uint32_t> ranks;
  size_t i = 0;
  while (true) {
    while (i < t.size() && (t[i] == ' ' || t[i] == '\t')) ++i;
    if (i == t.size()) break;
    uint32_t r = 0;
    const auto [p, ec] = std::from_chars(t.data() + i, t.data() + t.size(), r);
    if (ec != std::errc()) {
      return absl::InvalidArgumentError(
          absl::StrCat("ranks \"", AV(text.substr(0, 64)), "\": not a rank at character ", i + 1,
                       ec == std::errc::result_out_of_range ? " (out of range)" : ""));
    }
    ranks.push_back(r);
    i = static_cast<size_t>(p - t.data());
    while (i < t.size() && (t[i] == ' ' || t[i] == '\t')) ++i;
    if (i < t.size()) {
      if (t[i] != ',') {
        return absl::InvalidArgumentError(
            absl::StrCat("ranks \"", AV(text.substr(0, 64)), "\": unexpected character ", i + 1));
      }
      ++i;
      while (i < t.size() && (t[i] == ' ' || t[i] == '\t')) ++i;
      if (i == t.size()) {
        return absl::InvalidArgumentError(
            absl::StrCat("ranks \"", AV(text.substr(0, 64)), "\": ends with a comma"));
      }
    }
  }
  return ranks;
}

absl::StatusOr<FrDump> ParseFrDump(std::string_view bytes, const FrReadOptions& options) {
  if (bytes.size() > options.max_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("flight recorder dump: ", bytes.size(),
                                                   " bytes, more than ", options.max_bytes));
  }
  if (bytes.empty()) return absl::InvalidArgumentError("flight recorder dump: empty file");
  const bool pickled = static_cast<uint8_t>(bytes[0]) == 0x80;
  const std::string_view trimmed = Trim(bytes);
  if (!pickled && (trimmed.empty() || trimmed.front() != '{')) {
    return absl::InvalidArgumentError(
        "flight recorder dump: neither a pickle (first byte 0x80) nor JSON (an object)");
  }
  absl::StatusOr<Document> doc = [&]() -> absl::StatusOr<Document> {
    if (!pickled) return LoadJson(bytes, options);
    pickle::PickleLimits limits;
    limits.max_depth = kMaxDepth;
    limits.max_values = options.max_values;
    limits.max_string = std::min(limits.max_string, options.max_bytes);
    return pickle::Load(bytes, limits);
  }();
  if (!doc.ok()) return doc.status();
  return DumpWalker(options, !pickled).Walk(doc->root());
}

absl::StatusOr<FrDump> ReadFrDumpFile(const std::filesystem::path& file,
                                      const FrReadOptions& options) {
  std::error_code ec;
  const uintmax_t size = std::filesystem::file_size(file, ec);
  if (ec) return absl::NotFoundError(absl::StrCat(file.string(), ": ", ec.message()));
  if (size > options.max_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(file.string(), ": ", size, " bytes, more than ", options.max_bytes));
  }
  std::ifstream in(file, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(file.string(), ": cannot open"));
  std::string bytes(static_cast<size_t>(size), '\0');
  in.read(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  bytes.resize(static_cast<size_t>(in.gcount()));
  absl::StatusOr<FrDump> dump = ParseFrDump(bytes, options);
  if (!dump.ok()) {
    return absl::Status(dump.status().code(),
                        absl::StrCat(file.string(), ": ", dump.status().message()));
  }
  return dump;
}

}  // namespace rankwatch::fr

namespace rankwatch::fr {

namespace {
// A set of shared lists looked up by their content (each list held once).
struct ContentHash {
  using is_transparent = void;
  size_t operator()(const std::vector<uint32_t>& v) const {
    return absl::Hash<std::vector<uint32_t>>{}(v);
  }
  size_t operator()(const FrRanks& r) const { return (*this)(r.vec()); }
};
struct ContentEq {
  using is_transparent = void;
  static const std::vector<uint32_t>& Of(const std::vector<uint32_t>& v) { return v; }
  static const std::vector<uint32_t>& Of(const FrRanks& r) { return r.vec(); }
  template <typename A, typename B>
  bool operator()(const A& a, const B& b) const {
    return Of(a) == Of(b);
  }
};
}  // namespace

struct FrRanksInterner::Impl {
  mutable std::mutex mu;
  absl::flat_hash_map<std::string, FrRanks> lists;                  // by text
  absl::flat_hash_set<FrRanks, ContentHash, ContentEq> by_content;  // given as lists
};

FrRanksInterner::FrRanksInterner() : impl_(std::make_unique<Impl>()) {}
FrRanksInterner::~FrRanksInterner() = default;

absl::StatusOr<FrRanks> FrRanksInterner::Get(std::string_view text) {
  const absl::string_view key(text.data(), text.size());
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    auto it = impl_->lists.find(key);
    if (it != impl_->lists.end()) return it->second;
  }
  absl::StatusOr<std::vector<uint32_t>> parsed = ParseFrRanks(text);
  if (!parsed.ok()) return parsed.status();
  FrRanks ranks(*std::move(parsed));
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->lists.try_emplace(std::string(text), std::move(ranks)).first->second;
}

FrRanks FrRanksInterner::Get(std::vector<uint32_t> list, bool* fresh) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  auto it = impl_->by_content.find(list);
  if (fresh) *fresh = it == impl_->by_content.end();
  if (it != impl_->by_content.end()) return *it;
  return *impl_->by_content.insert(FrRanks(std::move(list))).first;
}

size_t FrRanksInterner::size() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->lists.size() + impl_->by_content.size();
}

}  // namespace rankwatch::fr
