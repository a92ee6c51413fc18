// A pickle loader that knows plain data only: None, bool, int (64-bit), float, str, bytes, list,
// tuple, dict, set and frozenset (sets kept as lists), the opcodes of protocols 0 to 5 that make
// them, and the memo. Every opcode that would resolve a name or call something (GLOBAL,
// STACK_GLOBAL, REDUCE, BUILD, INST, OBJ, NEWOBJ, NEWOBJ_EX, EXT1/2/4, PERSID, BINPERSID,
// NEXT_BUFFER, READONLY_BUFFER) is refused with a one-line error that names it and its byte
// offset: loading a pickle here never runs code. Used by the Flight Recorder reader
// (flight_recorder/fr_reader.h) for dumps, which are outside input.
//
// The result is a Document: an arena of Values, each container holding pointers to its items. A
// value the pickle memoized and referenced twice is one shared node (never copied), so a small
// pickle cannot expand into a huge tree here; a reader that walks shared nodes more than once
// must budget its own work. Load checks that the graph has no cycle (a container holding itself
// is refused) and that its depth is within the limits, so a reader may recurse.
//
// Limits (PickleLimits) on nesting depth, memo entries, values, one string's size and the
// opcode's length fields (never past the end of the input) turn hostile input into errors, not
// crashes or unbounded allocation.
//
// A Document is immutable once loaded and may be read from several threads; Load itself has
// no shared state.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace rankwatch::fr::pickle {

enum class Kind : uint8_t { kNone, kBool, kInt, kFloat, kStr, kBytes, kList, kTuple, kDict };

const char* KindName(Kind k);

// One value. Containers refer to their items; a dict keeps its pairs in insertion order,
// duplicates included (Find returns the last, the one Python's dict would keep).
class Value {
 public:
  explicit Value(Kind kind) : kind_(kind) {}

  Kind kind() const { return kind_; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_bool() const { return kind_ == Kind::kBool; }
  bool is_int() const { return kind_ == Kind::kInt; }
  bool is_float() const { return kind_ == Kind::kFloat; }
  bool is_str() const { return kind_ == Kind::kStr; }
  bool is_bytes() const { return kind_ == Kind::kBytes; }
  bool is_dict() const { return kind_ == Kind::kDict; }
  // A list or a tuple (sets are lists).
  bool is_sequence() const { return kind_ == Kind::kList || kind_ == Kind::kTuple; }

  bool as_bool() const { return int_ != 0; }
  int64_t as_int() const { return int_; }
  double as_float() const { return float_; }
  // str (UTF-8) or bytes. A pickle's length-prefixed strings refer to the bytes they were
  // loaded from (no copy): those bytes must outlive the document.
  std::string_view as_str() const { return str_; }

  // List or tuple: its items. Dict: keys and values alternate (key 0, value 0, key 1, ...).
  const std::vector<const Value*>& items() const { return items_; }
  size_t size() const { return kind_ == Kind::kDict ? items_.size() / 2 : items_.size(); }
  const Value& item(size_t i) const { return *items_[i]; }
  const Value& key(size_t i) const { return *items_[2 * i]; }
  const Value& value(size_t i) const { return *items_[2 * i + 1]; }
  // Dict: the value of the last pair whose key is the str `key`; nullptr if none.
  const Value* Find(std::string_view key) const;

 private:
  friend class Document;
  friend class Loader;

  Kind kind_;
  uint8_t visit_ = 0;    // Load's cycle and depth check
  uint8_t flavor_ = 0;   // list: 0 plain, 1 set, 2 frozenset (only while loading)
  uint32_t height_ = 0;  // Load's depth check: 1 for a scalar
  int64_t int_ = 0;      // int, bool
  double float_ = 0;
  std::string_view str_;  // str, bytes: into the loaded bytes or the document's own strings
  std::vector<const Value*> items_;
};

struct PickleLimits {
  size_t max_depth = 128;                // nesting of containers (a scalar at the top is depth 1)
  size_t max_memo = size_t{1} << 22;     // memo entries (PUT, BINPUT, LONG_BINPUT, MEMOIZE)
  size_t max_values = size_t{1} << 24;   // values created (shared references not counted)
  size_t max_string = size_t{64} << 20;  // bytes of one str or bytes value
  size_t max_stack = size_t{1} << 24;    // items on the stack and marks
};

// The values of one pickle: the arena and the root.
class Document {
 public:
  Document();
  Document(Document&&) noexcept;
  Document& operator=(Document&&) noexcept;
  ~Document();

  const Value& root() const { return *root_; }
  size_t values() const { return arena_->size(); }

  // Building a document by other means (e.g. from JSON): a new value in this arena; containers
  // are filled with Append (list, tuple: one item; dict: key then value).
  Value* New(Kind kind);
  Value* NewInt(int64_t v);
  Value* NewFloat(double v);
  Value* NewBool(bool v);
  Value* NewStr(std::string_view s, Kind kind = Kind::kStr);  // copies `s`
  // A str or bytes value that refers to `s` (which must outlive the document).
  Value* NewStrView(std::string_view s, Kind kind = Kind::kStr);
  static void Append(Value* container, const Value* item) { container->items_.push_back(item); }
  void set_root(const Value* root) { root_ = root; }

 private:
  friend class Loader;
  std::unique_ptr<std::deque<Value>> arena_;        // stable addresses
  std::unique_ptr<std::deque<std::string>> owned_;  // strings the document copied
  const Value* root_ = nullptr;
};

// Loads one pickle (protocols 0-5) from `bytes`. Data after STOP is ignored, as Python does.
absl::StatusOr<Document> Load(std::string_view bytes, const PickleLimits& limits = {});

}  // namespace rankwatch::fr::pickle
