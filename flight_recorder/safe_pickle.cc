#include "flight_recorder/safe_pickle.h"

#include <algorithm>
#include <charconv>
#include <cstring>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace rankwatch::fr::pickle {

const char* KindName(Kind k) {
  switch (k) {
    case Kind::kNone: return "None";
    case Kind::kBool: return "bool";
    case Kind::kInt: return "int";
    case Kind::kFloat: return "float";
    case Kind::kStr: return "str";
    case Kind::kBytes: return "bytes";
    case Kind::kList: return "list";
    case Kind::kTuple: return "tuple";
    case Kind::kDict: return "dict";
  }
  return "?";
}

const Value* Value::Find(std::string_view key) const {
  if (kind_ != Kind::kDict) return nullptr;
  for (size_t i = items_.size(); i >= 2; i -= 2) {
    const Value* k = items_[i - 2];
    if (k->kind_ == Kind::kStr && k->str_ == key) return items_[i - 1];
  }
  return nullptr;
}

Document::Document()
    : arena_(std::make_unique<std::deque<Value>>()),
      owned_(std::make_unique<std::deque<std::string>>()) {}
Document::Document(Document&&) noexcept = default;
Document& Document::operator=(Document&&) noexcept = default;
Document::~Document() = default;

Value* Document::New(Kind kind) { return &arena_->emplace_back(kind); }

Value* Document::NewInt(int64_t v) {
  Value* x = New(Kind::kInt);
  x->int_ = v;
  return x;
}

Value* Document::NewFloat(double v) {
  Value* x = New(Kind::kFloat);
  x->float_ = v;
  return x;
}

Value* Document::NewBool(bool v) {
  Value* x = New(Kind::kBool);
  x->int_ = v ? 1 : 0;
  return x;
}

Value* Document::NewStr(std::string_view s, Kind kind) {
  Value* x = New(kind);
  x->str_ = owned_->emplace_back(s);
  return x;
}

Value* Document::NewStrView(std::string_view s, Kind kind) {
  Value* x = New(kind);
  x->str_ = s;
  return x;
}

namespace {

// Opcodes (Lib/pickletools.py documents each).
enum Op : uint8_t {
  kMark = '(',
  kStop = '.',
  kPop = '0',
  kPopMark = '1',
  kDup = '2',
  kFloat = 'F',
  kInt = 'I',
  kBinInt = 'J',
  kBinInt1 = 'K',
  kLong = 'L',
  kBinInt2 = 'M',
  kNone = 'N',
  kPersId = 'P',
  kBinPersId = 'Q',
  kReduce = 'R',
  kString = 'S',
  kBinString = 'T',
  kShortBinString = 'U',
  kUnicode = 'V',
  kBinUnicode = 'X',
  kAppend = 'a',
  kBuild = 'b',
  kGlobal = 'c',
  kDict = 'd',
  kEmptyDict = '}',
  kAppends = 'e',
  kGet = 'g',
  kBinGet = 'h',
  kInst = 'i',
  kLongBinGet = 'j',
  kList = 'l',
  kEmptyList = ']',
  kObj = 'o',
  kPut = 'p',
  kBinPut = 'q',
  kLongBinPut = 'r',
  kSetItem = 's',
  kTuple = 't',
  kEmptyTuple = ')',
  kSetItems = 'u',
  kBinFloat = 'G',
  // protocol 2
  kProto = 0x80,
  kNewObj = 0x81,
  kExt1 = 0x82,
  kExt2 = 0x83,
  kExt4 = 0x84,
  kTuple1 = 0x85,
  kTuple2 = 0x86,
  kTuple3 = 0x87,
  kNewTrue = 0x88,
  kNewFalse = 0x89,
  kLong1 = 0x8a,
  kLong4 = 0x8b,
  // protocol 3
  kBinBytes = 'B',
  kShortBinBytes = 'C',
  // protocol 4
  kShortBinUnicode = 0x8c,
  kBinUnicode8 = 0x8d,
  kBinBytes8 = 0x8e,
  kEmptySet = 0x8f,
  kAddItems = 0x90,
  kFrozenSet = 0x91,
  kNewObjEx = 0x92,
  kStackGlobal = 0x93,
  kMemoize = 0x94,
  kFrame = 0x95,
  // protocol 5
  kByteArray8 = 0x96,
  kNextBuffer = 0x97,
  kReadonlyBuffer = 0x98,
};

const char* OpName(uint8_t op) {
  switch (op) {
    case kMark: return "MARK";
    case kStop: return "STOP";
    case kPop: return "POP";
    case kPopMark: return "POP_MARK";
    case kDup: return "DUP";
    case kFloat: return "FLOAT";
    case kInt: return "INT";
    case kBinInt: return "BININT";
    case kBinInt1: return "BININT1";
    case kLong: return "LONG";
    case kBinInt2: return "BININT2";
    case kNone: return "NONE";
    case kPersId: return "PERSID";
    case kBinPersId: return "BINPERSID";
    case kReduce: return "REDUCE";
    case kString: return "STRING";
    case kBinString: return "BINSTRING";
    case kShortBinString: return "SHORT_BINSTRING";
    case kUnicode: return "UNICODE";
    case kBinUnicode: return "BINUNICODE";
    case kAppend: return "APPEND";
    case kBuild: return "BUILD";
    case kGlobal: return "GLOBAL";
    case kDict: return "DICT";
    case kEmptyDict: return "EMPTY_DICT";
    case kAppends: return "APPENDS";
    case kGet: return "GET";
    case kBinGet: return "BINGET";
    case kInst: return "INST";
    case kLongBinGet: return "LONG_BINGET";
    case kList: return "LIST";
    case kEmptyList: return "EMPTY_LIST";
    case kObj: return "OBJ";
    case kPut: return "PUT";
    case kBinPut: return "BINPUT";
    case kLongBinPut: return "LONG_BINPUT";
    case kSetItem: return "SETITEM";
    case kTuple: return "TUPLE";
    case kEmptyTuple: return "EMPTY_TUPLE";
    case kSetItems: return "SETITEMS";
    case kBinFloat: return "BINFLOAT";
    case kProto: return "PROTO";
    case kNewObj: return "NEWOBJ";
    case kExt1: return "EXT1";
    case kExt2: return "EXT2";
    case kExt4: return "EXT4";
    case kTuple1: return "TUPLE1";
    case kTuple2: return "TUPLE2";
    case kTuple3: return "TUPLE3";
    case kNewTrue: return "NEWTRUE";
    case kNewFalse: return "NEWFALSE";
    case kLong1: return "LONG1";
    case kLong4: return "LONG4";
    case kBinBytes: return "BINBYTES";
    case kShortBinBytes: return "SHORT_BINBYTES";
    case kShortBinUnicode: return "SHORT_BINUNICODE";
    case kBinUnicode8: return "BINUNICODE8";
    case kBinBytes8: return "BINBYTES8";
    case kEmptySet: return "EMPTY_SET";
    case kAddItems: return "ADDITEMS";
    case kFrozenSet: return "FROZENSET";
    case kNewObjEx: return "NEWOBJ_EX";
    case kStackGlobal: return "STACK_GLOBAL";
    case kMemoize: return "MEMOIZE";
    case kFrame: return "FRAME";
    case kByteArray8: return "BYTEARRAY8";
    case kNextBuffer: return "NEXT_BUFFER";
    case kReadonlyBuffer: return "READONLY_BUFFER";
  }
  return nullptr;
}

// Why an opcode is refused; nullptr for the opcodes this loader runs.
const char* RefusedWhy(uint8_t op) {
  switch (op) {
    case kGlobal:
    case kStackGlobal:
    case kInst: return "it imports a name (a class or function)";
    case kReduce:
    case kObj:
    case kNewObj:
    case kNewObjEx: return "it calls a callable";
    case kBuild: return "it calls __setstate__ or sets attributes of an object";
    case kExt1:
    case kExt2:
    case kExt4: return "it resolves an extension code to a class or function";
    case kPersId:
    case kBinPersId: return "it asks the application for a persistent object";
    case kNextBuffer:
    case kReadonlyBuffer: return "it takes out-of-band buffers";
    default: return nullptr;
  }
}

// The flavor of a list value: sets and frozensets are lists here, but only a set takes
// ADDITEMS and only a plain list takes APPEND, as in Python.
constexpr uint8_t kPlainList = 0;
constexpr uint8_t kSetList = 1;
constexpr uint8_t kFrozenList = 2;

constexpr size_t kMaxNumberLine = 4096;

}  // namespace

// The unpickler's state machine. One instance per Load.
class Loader {
 public:
  Loader(std::string_view in, const PickleLimits& limits) : in_(in), limits_(limits) {}

  absl::StatusOr<Document> Run() {
    while (true) {
      if (pos_ >= in_.size()) {
        return absl::InvalidArgumentError(
            absl::StrCat("pickle: truncated at byte ", pos_, ": no STOP opcode"));
      }
      op_pos_ = pos_;
      op_ = static_cast<uint8_t>(in_[pos_++]);
      if (op_ == kStop) {
        if (stack_.size() <= Base()) return Error("STOP with an empty stack");
        const Value* root = stack_.back();
        if (absl::Status s = CheckGraph(root); !s.ok()) return s;
        doc_.set_root(root);
        return std::move(doc_);
      }
      if (absl::Status s = Step(); !s.ok()) return s;
    }
  }

 private:
  // Reader and flavor helpers.
  absl::Status Error(std::string_view what) const {
    const char* name = OpName(op_);
    return absl::InvalidArgumentError(absl::StrFormat("pickle: %s (opcode %s at byte %d)", what,
                                                      name != nullptr ? name : "?", op_pos_));
  }

  absl::Status Truncated(size_t need) const {
    return Error(
        absl::StrCat("truncated input: needs ", need, " bytes, ", in_.size() - pos_, " left"));
  }

  absl::Status Read(size_t n, std::string_view* out) {
    if (in_.size() - pos_ < n) return Truncated(n);
    *out = in_.substr(pos_, n);
    pos_ += n;
    return absl::OkStatus();
  }

  // Little-endian unsigned of n bytes (n <= 8).
  absl::Status ReadLE(size_t n, uint64_t* out) {
    std::string_view b;
    if (absl::Status s = Read(n, &b); !s.ok()) return s;
    uint64_t v = 0;
    for (size_t i = 0; i < n; ++i) v |= uint64_t{static_cast<uint8_t>(b[i])} << (8 * i);
    *out = v;
    return absl::OkStatus();
  }

  // One text line without its '\n' (protocol 0 arguments).
  absl::Status ReadLine(size_t max, std::string_view* out) {
    const size_t end = in_.find('\n', pos_);
    if (end == std::string_view::npos) {
      return Error("truncated input: the text argument has no end of line");
    }
    if (end - pos_ > max) {
      return Error(absl::StrCat("text argument of ", end - pos_, " bytes, more than ", max));
    }
    *out = in_.substr(pos_, end - pos_);
    pos_ = end + 1;
    return absl::OkStatus();
  }

  size_t Base() const { return marks_.empty() ? 0 : marks_.back(); }

  absl::Status Push(const Value* v) {
    if (stack_.size() + marks_.size() >= limits_.max_stack) {
      return Error(absl::StrCat("stack deeper than ", limits_.max_stack));
    }
    stack_.push_back(v);
    return absl::OkStatus();
  }

  absl::StatusOr<Value*> New(Kind kind) {
    if (doc_.values() >= limits_.max_values) {
      return Error(absl::StrCat("more than ", limits_.max_values, " values"));
    }
    return doc_.New(kind);
  }

  absl::Status PushNew(Kind kind, Value** out = nullptr) {
    absl::StatusOr<Value*> v = New(kind);
    if (!v.ok()) return v.status();
    if (out != nullptr) *out = *v;
    return Push(*v);
  }

  absl::Status PushInt(int64_t i, Kind kind = Kind::kInt) {
    Value* v;
    if (absl::Status s = PushNew(kind, &v); !s.ok()) return s;
    v->int_ = i;
    return absl::OkStatus();
  }

  // `borrowed`: `s` lies in the loaded bytes and is kept as a view; otherwise it is copied.
  absl::Status PushStr(std::string_view s, Kind kind, bool borrowed = false) {
    if (s.size() > limits_.max_string) {
      return Error(absl::StrCat("string of ", s.size(), " bytes, more than ", limits_.max_string));
    }
    Value* v;
    if (absl::Status st = PushNew(kind, &v); !st.ok()) return st;
    v->str_ = borrowed ? s : std::string_view(doc_.owned_->emplace_back(s));
    return absl::OkStatus();
  }

  // A length-prefixed str or bytes: the length field of `n` bytes, then the data.
  absl::Status PushCounted(size_t n, Kind kind, bool signed_len = false) {
    uint64_t len;
    if (absl::Status s = ReadLE(n, &len); !s.ok()) return s;
    if (signed_len && (len & 0x80000000u) != 0) return Error("negative byte count");
    if (len > limits_.max_string) {
      return Error(absl::StrCat("length field ", len, " more than ", limits_.max_string));
    }
    std::string_view data;
    if (absl::Status s = Read(static_cast<size_t>(len), &data); !s.ok()) return s;
    return PushStr(data, kind, /*borrowed=*/true);
  }

  // The items above the top mark, which is removed.
  absl::Status PopMark(std::vector<const Value*>* items) {
    if (marks_.empty()) return Error("no MARK on the stack");
    const size_t base = marks_.back();
    marks_.pop_back();
    items->assign(stack_.begin() + static_cast<std::ptrdiff_t>(base), stack_.end());
    stack_.resize(base);
    return absl::OkStatus();
  }

  absl::Status Pop(const Value** out) {
    if (stack_.size() <= Base()) return Error("stack underflow");
    *out = stack_.back();
    stack_.pop_back();
    return absl::OkStatus();
  }

  // The top of the stack as a mutable container of `kind` (containers are only ever created by
  // this loader as mutable Values of the arena).
  absl::Status Top(Kind kind, Value** out, const char* what) {
    if (stack_.size() <= Base()) return Error("stack underflow");
    const Value* top = stack_.back();
    if (top->kind_ != kind) {
      return Error(
          absl::StrCat("expects a ", what, " below its items, found a ", KindName(top->kind_)));
    }
    *out = const_cast<Value*>(top);
    return absl::OkStatus();
  }

  absl::Status AddPairs(Value* dict, const std::vector<const Value*>& items) {
    if (items.size() % 2 != 0) return Error("odd number of items for a dict");
    dict->items_.insert(dict->items_.end(), items.begin(), items.end());
    return absl::OkStatus();
  }

  absl::Status Memo(uint64_t key) {
    if (stack_.size() <= Base()) return Error("memoizes from an empty stack");
    auto [it, inserted] = memo_.try_emplace(key, stack_.back());
    if (!inserted) {
      it->second = stack_.back();
    } else if (memo_.size() > limits_.max_memo) {
      return Error(absl::StrCat("more than ", limits_.max_memo, " memo entries"));
    }
    return absl::OkStatus();
  }

  // A memo key: a decimal text line (width 0: PUT, GET) or a little-endian unsigned of `width`
  // bytes (BINPUT/BINGET 1, LONG_BINPUT/LONG_BINGET 4).
  absl::Status ReadMemoKey(size_t width, uint64_t* key) {
    if (width > 0) return ReadLE(width, key);
    int64_t i;
    if (absl::Status s = ReadDecimalLine(&i); !s.ok()) return s;
    if (i < 0) return Error("negative memo key");
    *key = static_cast<uint64_t>(i);
    return absl::OkStatus();
  }

  absl::Status Recall(uint64_t key) {
    auto it = memo_.find(key);
    if (it == memo_.end()) return Error(absl::StrCat("memo key ", key, " not defined"));
    return Push(it->second);
  }

  // Decimal integer text (optional sign, blanks around), as Python's int() takes it.
  absl::Status ParseDecimal(std::string_view t, int64_t* out) {
    while (!t.empty() && (t.front() == ' ' || t.front() == '\t' || t.front() == '\r')) {
      t.remove_prefix(1);
    }
    while (!t.empty() && (t.back() == ' ' || t.back() == '\t' || t.back() == '\r')) {
      t.remove_suffix(1);
    }
    if (!t.empty() && t.front() == '+') t.remove_prefix(1);
    if (t.empty() || (t.front() == '-' && t.size() == 1)) return Error("not an integer");
    const auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), *out);
    if (ec == std::errc::result_out_of_range) return Error("integer does not fit in 64 bits");
    if (ec != std::errc() || end != t.data() + t.size()) return Error("not an integer");
    return absl::OkStatus();
  }

  absl::Status ReadDecimalLine(int64_t* out) {
    std::string_view line;
    if (absl::Status s = ReadLine(kMaxNumberLine, &line); !s.ok()) return s;
    return ParseDecimal(line, out);
  }

  // A two's complement little-endian integer of n bytes; more than 8 only when the bytes past
  // the eighth just extend the sign (the value fits in 64 bits).
  absl::Status PushLong(uint64_t n) {
    if (n > in_.size() - pos_) return Truncated(static_cast<size_t>(n));  // n < 2^31
    const std::string_view b = in_.substr(pos_, static_cast<size_t>(n));
    pos_ += static_cast<size_t>(n);
    const size_t low = std::min<size_t>(b.size(), 8);
    uint64_t v = 0;
    for (size_t k = 0; k < low; ++k) v |= uint64_t{static_cast<uint8_t>(b[k])} << (8 * k);
    const bool negative = low > 0 && (static_cast<uint8_t>(b[low - 1]) & 0x80) != 0;
    if (low > 0 && low < 8 && negative) v |= ~uint64_t{0} << (8 * low);
    for (size_t k = 8; k < b.size(); ++k) {
      if (static_cast<uint8_t>(b[k]) != (negative ? 0xff : 0x00)) {
        return Error(absl::StrCat("integer of ", n, " bytes does not fit in 64 bits"));
      }
    }
    return PushInt(static_cast<int64_t>(v));
  }

  absl::Status PushFloatText(std::string_view t) {
    while (!t.empty() && (t.front() == ' ' || t.front() == '\t')) t.remove_prefix(1);
    while (!t.empty() && (t.back() == ' ' || t.back() == '\t' || t.back() == '\r')) {
      t.remove_suffix(1);
    }
    if (!t.empty() && t.front() == '+') t.remove_prefix(1);
    double d = 0;
    const auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), d);
    if (t.empty() || ec == std::errc::invalid_argument || end != t.data() + t.size()) {
      return Error("not a float");
    }
    Value* v;
    if (absl::Status s = PushNew(Kind::kFloat, &v); !s.ok()) return s;
    v->float_ = d;  // out of range: from_chars leaves d; Python gives inf, rare enough
    return absl::OkStatus();
  }

  // STRING's argument: a quoted Python bytes literal body with backslash escapes.
  absl::Status PushQuoted(std::string_view t) {
    if (t.size() < 2 || t.front() != t.back() || (t.front() != '\'' && t.front() != '"')) {
      return Error("the argument must be quoted");
    }
    t = t.substr(1, t.size() - 2);
    std::string out;
    out.reserve(t.size());
    for (size_t i = 0; i < t.size(); ++i) {
      const char c = t[i];
      if (c != '\\' || i + 1 == t.size()) {
        out.push_back(c);
        continue;
      }
      const char e = t[++i];
      switch (e) {
        case '\\': out.push_back('\\'); break;
        case '\'': out.push_back('\''); break;
        case '"': out.push_back('"'); break;
        case 'a': out.push_back('\a'); break;
        case 'b': out.push_back('\b'); break;
        case 'f': out.push_back('\f'); break;
        case 'n': out.push_back('\n'); break;
        case 'r': out.push_back('\r'); break;
        case 't': out.push_back('\t'); break;
        case 'v': out.push_back('\v'); break;
        case 'x': {
          if (i + 2 >= t.size() || !IsHex(t[i + 1]) || !IsHex(t[i + 2])) {
            return Error("invalid \\x escape");
          }
          out.push_back(static_cast<char>(HexVal(t[i + 1]) * 16 + HexVal(t[i + 2])));
          i += 2;
          break;
        }
        default:
          if (e >= '0' && e <= '7') {
            int v = e - '0';
            for (int k = 0; k < 2 && i + 1 < t.size() && t[i + 1] >= '0' && t[i + 1] <= '7'; ++k) {
              v = v * 8 + (t[++i] - '0');
            }
            out.push_back(static_cast<char>(v & 0xff));
          } else {
            out.push_back('\\');  // unknown escapes stay, as in Python
            out.push_back(e);
          }
      }
    }
    return PushStr(out, Kind::kStr);
  }

  static bool IsHex(char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
  }
  static int HexVal(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return c - 'A' + 10;
  }

  static void AppendUtf8(uint32_t cp, std::string* out) {
    if (cp < 0x80) {
      out->push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
      out->push_back(static_cast<char>(0xc0 | (cp >> 6)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
    } else if (cp < 0x10000) {
      out->push_back(static_cast<char>(0xe0 | (cp >> 12)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
    } else {
      out->push_back(static_cast<char>(0xf0 | (cp >> 18)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3f)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
    }
  }

  // UNICODE's argument, raw-unicode-escape: \uXXXX and \UXXXXXXXX escapes, other bytes Latin-1.
  absl::Status PushRawUnicode(std::string_view t) {
    std::string out;
    out.reserve(t.size());
    for (size_t i = 0; i < t.size(); ++i) {
      const auto c = static_cast<uint8_t>(t[i]);
      if (c == '\\' && i + 1 < t.size() && (t[i + 1] == 'u' || t[i + 1] == 'U')) {
        const size_t n = t[i + 1] == 'u' ? 4 : 8;
        if (i + 2 + n > t.size()) return Error("truncated \\u escape");
        uint32_t cp = 0;
        for (size_t k = 0; k < n; ++k) {
          const char h = t[i + 2 + k];
          if (!IsHex(h)) return Error("invalid \\u escape");
          cp = cp * 16 + static_cast<uint32_t>(HexVal(h));
        }
        if (cp > 0x10ffff) return Error("\\U escape out of range");
        AppendUtf8(cp, &out);
        i += 1 + n;
      } else {
        AppendUtf8(c, &out);
      }
    }
    return PushStr(out, Kind::kStr);
  }

  absl::Status Step() {
    if (const char* why = RefusedWhy(op_); why != nullptr) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "pickle: opcode %s (0x%02x) at byte %d refused: %s; a dump holds plain data only",
          OpName(op_), op_, op_pos_, why));
    }
    std::vector<const Value*> items;
    const Value* a = nullptr;
    const Value* b = nullptr;
    Value* c = nullptr;
    uint64_t u = 0;
    int64_t i = 0;
    std::string_view text;
    switch (op_) {
      case kProto:
        if (absl::Status s = ReadLE(1, &u); !s.ok()) return s;
        if (u > 5) return Error(absl::StrCat("unsupported protocol ", u));
        return absl::OkStatus();
      case kFrame:
        // Framing only groups the bytes for I/O; the frame must lie within the input.
        if (absl::Status s = ReadLE(8, &u); !s.ok()) return s;
        if (u > in_.size() - pos_)
          return Truncated(static_cast<size_t>(std::min<uint64_t>(u, SIZE_MAX)));
        return absl::OkStatus();
      case kMark:
        if (stack_.size() + marks_.size() >= limits_.max_stack) {
          return Error(absl::StrCat("stack deeper than ", limits_.max_stack));
        }
        marks_.push_back(stack_.size());
        return absl::OkStatus();
      case kPop:
        if (stack_.size() > Base()) {
          stack_.pop_back();
          return absl::OkStatus();
        }
        return PopMark(&items);
      case kPopMark: return PopMark(&items);
      case kDup:
        if (stack_.size() <= Base()) return Error("stack underflow");
        return Push(stack_.back());

      case kNone: return PushNew(Kind::kNone);
      case kNewTrue: return PushInt(1, Kind::kBool);
      case kNewFalse: return PushInt(0, Kind::kBool);
      case kInt:
        if (absl::Status s = ReadLine(kMaxNumberLine, &text); !s.ok()) return s;
        if (text == "00") return PushInt(0, Kind::kBool);
        if (text == "01") return PushInt(1, Kind::kBool);
        if (absl::Status s = ParseDecimal(text, &i); !s.ok()) return s;
        return PushInt(i);
      case kLong:
        if (absl::Status s = ReadLine(kMaxNumberLine, &text); !s.ok()) return s;
        if (!text.empty() && text.back() == 'L') text.remove_suffix(1);
        if (absl::Status s = ParseDecimal(text, &i); !s.ok()) return s;
        return PushInt(i);
      case kBinInt:
        if (absl::Status s = ReadLE(4, &u); !s.ok()) return s;
        return PushInt(static_cast<int32_t>(static_cast<uint32_t>(u)));
      case kBinInt1:
        if (absl::Status s = ReadLE(1, &u); !s.ok()) return s;
        return PushInt(static_cast<int64_t>(u));
      case kBinInt2:
        if (absl::Status s = ReadLE(2, &u); !s.ok()) return s;
        return PushInt(static_cast<int64_t>(u));
      case kLong1:
        if (absl::Status s = ReadLE(1, &u); !s.ok()) return s;
        return PushLong(u);
      case kLong4:
        if (absl::Status s = ReadLE(4, &u); !s.ok()) return s;
        if ((u & 0x80000000u) != 0) return Error("negative byte count");
        return PushLong(u);
      case kBinFloat: {
        if (absl::Status s = Read(8, &text); !s.ok()) return s;
        uint64_t bits = 0;
        for (char ch : text) bits = bits << 8 | static_cast<uint8_t>(ch);  // big-endian
        double d;
        std::memcpy(&d, &bits, sizeof d);
        Value* v;
        if (absl::Status s = PushNew(Kind::kFloat, &v); !s.ok()) return s;
        v->float_ = d;
        return absl::OkStatus();
      }
      case kFloat:
        if (absl::Status s = ReadLine(kMaxNumberLine, &text); !s.ok()) return s;
        return PushFloatText(text);

      case kBinUnicode: return PushCounted(4, Kind::kStr);
      case kShortBinUnicode: return PushCounted(1, Kind::kStr);
      case kBinUnicode8: return PushCounted(8, Kind::kStr);
      case kUnicode:
        if (absl::Status s = ReadLine(limits_.max_string, &text); !s.ok()) return s;
        return PushRawUnicode(text);
      case kBinString: return PushCounted(4, Kind::kStr, /*signed_len=*/true);
      case kShortBinString: return PushCounted(1, Kind::kStr);
      case kString:
        if (absl::Status s = ReadLine(limits_.max_string, &text); !s.ok()) return s;
        return PushQuoted(text);
      case kBinBytes: return PushCounted(4, Kind::kBytes);
      case kShortBinBytes: return PushCounted(1, Kind::kBytes);
      case kBinBytes8:
      case kByteArray8: return PushCounted(8, Kind::kBytes);

      case kEmptyDict: return PushNew(Kind::kDict);
      case kEmptyList: return PushNew(Kind::kList);
      case kEmptyTuple: return PushNew(Kind::kTuple);
      case kEmptySet:
        if (absl::Status s = PushNew(Kind::kList, &c); !s.ok()) return s;
        c->flavor_ = kSetList;
        return absl::OkStatus();
      case kDict:
        if (absl::Status s = PopMark(&items); !s.ok()) return s;
        if (absl::Status s = PushNew(Kind::kDict, &c); !s.ok()) return s;
        return AddPairs(c, items);
      case kList:
      case kTuple:
      case kFrozenSet:
        if (absl::Status s = PopMark(&items); !s.ok()) return s;
        if (absl::Status s = PushNew(op_ == kTuple ? Kind::kTuple : Kind::kList, &c); !s.ok()) {
          return s;
        }
        if (op_ == kFrozenSet) c->flavor_ = kFrozenList;
        c->items_ = std::move(items);
        return absl::OkStatus();
      case kTuple1:
      case kTuple2:
      case kTuple3: {
        const size_t n = op_ - kTuple1 + 1;
        if (stack_.size() - Base() < n) return Error("stack underflow");
        items.assign(stack_.end() - static_cast<std::ptrdiff_t>(n), stack_.end());
        stack_.resize(stack_.size() - n);
        if (absl::Status s = PushNew(Kind::kTuple, &c); !s.ok()) return s;
        c->items_ = std::move(items);
        return absl::OkStatus();
      }
      case kSetItem:
        if (absl::Status s = Pop(&b); !s.ok()) return s;
        if (absl::Status s = Pop(&a); !s.ok()) return s;
        if (absl::Status s = Top(Kind::kDict, &c, "dict"); !s.ok()) return s;
        c->items_.push_back(a);
        c->items_.push_back(b);
        return absl::OkStatus();
      case kSetItems:
        if (absl::Status s = PopMark(&items); !s.ok()) return s;
        if (absl::Status s = Top(Kind::kDict, &c, "dict"); !s.ok()) return s;
        return AddPairs(c, items);
      case kAppend:
      case kAppends:
      case kAddItems: {
        if (op_ == kAppend) {
          if (absl::Status s = Pop(&a); !s.ok()) return s;
          items.push_back(a);
        } else if (absl::Status s = PopMark(&items); !s.ok()) {
          return s;
        }
        if (absl::Status s = Top(Kind::kList, &c, op_ == kAddItems ? "set" : "list"); !s.ok()) {
          return s;
        }
        if (c->flavor_ != (op_ == kAddItems ? kSetList : kPlainList)) {
          return Error(op_ == kAddItems ? "expects a set below its items"
                                        : "expects a list below its items");
        }
        c->items_.insert(c->items_.end(), items.begin(), items.end());
        return absl::OkStatus();
      }

      case kPut:
      case kBinPut:
      case kLongBinPut:
        if (absl::Status s = ReadMemoKey(op_ == kPut ? 0 : op_ == kBinPut ? 1 : 4, &u); !s.ok()) {
          return s;
        }
        return Memo(u);
      case kMemoize: return Memo(memo_.size());
      case kGet:
      case kBinGet:
      case kLongBinGet:
        if (absl::Status s = ReadMemoKey(op_ == kGet ? 0 : op_ == kBinGet ? 1 : 4, &u); !s.ok()) {
          return s;
        }
        return Recall(u);
    }
    return absl::InvalidArgumentError(
        absl::StrFormat("pickle: unknown opcode 0x%02x at byte %d", op_, op_pos_));
  }

  // The graph under `root`: no cycle, depth within the limit. An iterative depth-first walk,
  // each node once (visit_: 0 new, 1 on the path, 2 done, its height final); the path is
  // never longer than the depth limit.
  absl::Status CheckGraph(const Value* root) {
    for (Value& v : *doc_.arena_) v.visit_ = 0;
    struct Frame {
      Value* v;
      size_t next;
    };
    std::vector<Frame> path;
    const auto too_deep = [this] {
      return absl::InvalidArgumentError(
          absl::StrCat("pickle: values nested deeper than ", limits_.max_depth));
    };
    const auto enter = [&](const Value* cv) -> absl::Status {
      if (path.size() >= limits_.max_depth) return too_deep();
      auto* v = const_cast<Value*>(cv);
      v->visit_ = 1;
      v->height_ = 1;
      path.push_back({v, 0});
      return absl::OkStatus();
    };
    if (absl::Status s = enter(root); !s.ok()) return s;
    while (!path.empty()) {
      Frame& f = path.back();
      if (f.next < f.v->items_.size()) {
        const Value* child = f.v->items_[f.next++];
        if (child->visit_ == 1) {
          return absl::InvalidArgumentError(
              "pickle: a container holds itself (a recursive structure), refused");
        }
        if (child->visit_ == 0) {
          if (absl::Status s = enter(child); !s.ok()) return s;
          continue;
        }
        f.v->height_ = std::max(f.v->height_, child->height_ + 1);  // shared, already done
        if (f.v->height_ > limits_.max_depth) return too_deep();
        continue;
      }
      Value* done = f.v;
      done->visit_ = 2;
      path.pop_back();
      if (!path.empty()) {
        Value* parent = path.back().v;
        parent->height_ = std::max(parent->height_, done->height_ + 1);
        if (parent->height_ > limits_.max_depth) return too_deep();
      }
    }
    return absl::OkStatus();
  }

  std::string_view in_;
  const PickleLimits& limits_;
  size_t pos_ = 0;
  size_t op_pos_ = 0;
  uint8_t op_ = 0;
  Document doc_;
  std::vector<const Value*> stack_;
  std::vector<size_t> marks_;
  absl::flat_hash_map<uint64_t, const Value*> memo_;
};

absl::StatusOr<Document> Load(std::string_view bytes, const PickleLimits& limits) {
  Loader loader(bytes, limits);
  return loader.Run();
}

}  // namespace rankwatch::fr::pickle
