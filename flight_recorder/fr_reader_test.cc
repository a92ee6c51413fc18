// Tests of the Flight Recorder reader (fr_reader.h) and its pickle loader (safe_pickle.h): the
// real dumps of tests/fixtures/flight-recorder (values checked against Python's pickle), the
// same dumps as JSON, every protocol's opcodes against Python, the refusal of every opcode that
// resolves or calls something (and of a real code-executing payload), and hostile input.
#include <unistd.h>

#include <charconv>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "flight_recorder/fr_reader.h"
#include "flight_recorder/safe_pickle.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace rankwatch::fr {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using namespace std::string_view_literals;

const std::filesystem::path kFixtures =
    std::filesystem::path(RANKWATCH_FIXTURES) / "flight-recorder";

std::string Msg(const absl::Status& s) { return std::string(s.message()); }

std::string ReadBytes(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Python's repr() of a loaded value (sets come back as lists, bytearray as bytes).
std::string QuoteLike(std::string_view s, bool bytes) {
  const bool dq = s.find('\'') != std::string_view::npos && s.find('"') == std::string_view::npos;
  const char q = dq ? '"' : '\'';
  std::string out = bytes ? "b" : "";
  out.push_back(q);
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '\\') {
      out += "\\\\";
    } else if (c == static_cast<unsigned char>(q)) {
      out += std::string("\\") + q;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f || (bytes && c >= 0x80)) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out.push_back(ch);
    }
  }
  out.push_back(q);
  return out;
}

std::string Repr(const pickle::Value& v) {
  using pickle::Kind;
  switch (v.kind()) {
    case Kind::kNone: return "None";
    case Kind::kBool: return v.as_bool() ? "True" : "False";
    case Kind::kInt: return absl::StrCat(v.as_int());
    case Kind::kFloat: {
      char buf[64];
      auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v.as_float());
      std::string s(buf, end);
      if (s.find_first_of(".e") == std::string::npos) s += ".0";
      return s;
    }
    case Kind::kStr: return QuoteLike(v.as_str(), false);
    case Kind::kBytes: return QuoteLike(v.as_str(), true);
    case Kind::kList:
    case Kind::kTuple: {
      const bool tuple = v.kind() == Kind::kTuple;
      std::string out = tuple ? "(" : "[";
      for (size_t i = 0; i < v.size(); ++i) {
        if (i > 0) out += ", ";
        out += Repr(v.item(i));
      }
      if (tuple && v.size() == 1) out += ",";
      return out + (tuple ? ")" : "]");
    }
    case Kind::kDict: {
      std::string out = "{";
      for (size_t i = 0; i < v.size(); ++i) {
        if (i > 0) out += ", ";
        out += Repr(v.key(i)) + ": " + Repr(v.value(i));
      }
      return out + "}";
    }
  }
  return "?";
}

std::string LoadRepr(std::string_view bytes) {
  absl::StatusOr<pickle::Document> doc = pickle::Load(bytes);
  if (!doc.ok()) return std::string(doc.status().message());
  return Repr(doc->root());
}

std::string LoadError(std::string_view bytes, const pickle::PickleLimits& limits = {}) {
  absl::StatusOr<pickle::Document> doc = pickle::Load(bytes, limits);
  return doc.ok() ? "loaded: " + Repr(doc->root()) : std::string(doc.status().message());
}

// pickle.dumps(obj, protocol=p) for p in 0..4 by /usr/bin/python3 3.11 (5 writes 4's bytes), with
// repr() of what pickle.loads gives back (sets shown as lists): the object holds ints at the edges
// of each integer opcode, floats, str (one non-ASCII), tuples of 0-4 items, None/True/False, one
// list referenced twice (memo), nested dicts, bytes (protocol >= 3), a set and a frozenset (>= 4).
struct Vector {
  int protocol;
  std::string_view bytes;
  std::string_view repr;
};

const Vector kProtocolVectors[] = {
    {0,
     "\x28\x64\x70\x30\x0a\x56\x69\x6e\x74\x73\x0a\x70\x31\x0a\x28\x6c\x70\x32\x0a\x49\x30"
     "\x0a\x61\x49\x31\x0a\x61\x49\x2d\x31\x0a\x61\x49\x32\x35\x35\x0a\x61\x49\x32\x35\x36"
     "\x0a\x61\x49\x36\x35\x35\x33\x35\x0a\x61\x49\x36\x35\x35\x33\x36\x0a\x61\x49\x2d\x32"
     "\x31\x34\x37\x34\x38\x33\x36\x34\x38\x0a\x61\x49\x32\x31\x34\x37\x34\x38\x33\x36\x34"
     "\x37\x0a\x61\x4c\x31\x30\x39\x39\x35\x31\x31\x36\x32\x37\x37\x37\x36\x4c\x0a\x61\x4c"
     "\x2d\x39\x32\x32\x33\x33\x37\x32\x30\x33\x36\x38\x35\x34\x37\x37\x35\x38\x30\x38\x4c"
     "\x0a\x61\x4c\x39\x32\x32\x33\x33\x37\x32\x30\x33\x36\x38\x35\x34\x37\x37\x35\x38\x30"
     "\x37\x4c\x0a\x61\x73\x56\x66\x0a\x70\x33\x0a\x28\x6c\x70\x34\x0a\x46\x31\x2e\x35\x0a"
     "\x61\x46\x2d\x30\x2e\x32\x35\x0a\x61\x73\x56\x73\x0a\x70\x35\x0a\x28\x6c\x70\x36\x0a"
     "\x56\x0a\x70\x37\x0a\x61\x56\x61\x62\x63\x0a\x70\x38\x0a\x61\x56\x63\x61\x66\xe9\x0a"
     "\x70\x39\x0a\x61\x73\x56\x74\x0a\x70\x31\x30\x0a\x28\x6c\x70\x31\x31\x0a\x28\x74\x61"
     "\x28\x49\x31\x0a\x74\x70\x31\x32\x0a\x61\x28\x49\x31\x0a\x49\x32\x0a\x74\x70\x31\x33"
     "\x0a\x61\x28\x49\x31\x0a\x49\x32\x0a\x49\x33\x0a\x74\x70\x31\x34\x0a\x61\x28\x49\x31"
     "\x0a\x49\x32\x0a\x49\x33\x0a\x49\x34\x0a\x74\x70\x31\x35\x0a\x61\x73\x56\x6e\x0a\x70"
     "\x31\x36\x0a\x28\x6c\x70\x31\x37\x0a\x4e\x61\x49\x30\x31\x0a\x61\x49\x30\x30\x0a\x61"
     "\x73\x56\x73\x68\x61\x72\x65\x64\x0a\x70\x31\x38\x0a\x28\x6c\x70\x31\x39\x0a\x28\x6c"
     "\x70\x32\x30\x0a\x49\x37\x0a\x61\x67\x35\x0a\x61\x61\x67\x32\x30\x0a\x61\x73\x56\x6e"
     "\x65\x73\x74\x65\x64\x0a\x70\x32\x31\x0a\x28\x64\x70\x32\x32\x0a\x56\x6b\x0a\x70\x32"
     "\x33\x0a\x28\x64\x70\x32\x34\x0a\x56\x78\x0a\x70\x32\x35\x0a\x28\x6c\x70\x32\x36\x0a"
     "\x28\x6c\x70\x32\x37\x0a\x61\x73\x73\x73\x2e"sv,
     R"({'ints': [0, 1, -1, 255, 256, 65535, 65536, -2147483648, 2147483647, 1099511627776, -9223372036854775808, 9223372036854775807], 'f': [1.5, -0.25], 's': ['', 'abc', 'café'], 't': [(), (1,), (1, 2), (1, 2, 3), (1, 2, 3, 4)], 'n': [None, True, False], 'shared': [[7, 's'], [7, 's']], 'nested': {'k': {'x': [[]]}}})"},
    {1,
     "\x7d\x71\x00\x28\x58\x04\x00\x00\x00\x69\x6e\x74\x73\x71\x01\x5d\x71\x02\x28\x4b\x00"
     "\x4b\x01\x4a\xff\xff\xff\xff\x4b\xff\x4d\x00\x01\x4d\xff\xff\x4a\x00\x00\x01\x00\x4a"
     "\x00\x00\x00\x80\x4a\xff\xff\xff\x7f\x4c\x31\x30\x39\x39\x35\x31\x31\x36\x32\x37\x37"
     "\x37\x36\x4c\x0a\x4c\x2d\x39\x32\x32\x33\x33\x37\x32\x30\x33\x36\x38\x35\x34\x37\x37"
     "\x35\x38\x30\x38\x4c\x0a\x4c\x39\x32\x32\x33\x33\x37\x32\x30\x33\x36\x38\x35\x34\x37"
     "\x37\x35\x38\x30\x37\x4c\x0a\x65\x58\x01\x00\x00\x00\x66\x71\x03\x5d\x71\x04\x28\x47"
     "\x3f\xf8\x00\x00\x00\x00\x00\x00\x47\xbf\xd0\x00\x00\x00\x00\x00\x00\x65\x58\x01\x00"
     "\x00\x00\x73\x71\x05\x5d\x71\x06\x28\x58\x00\x00\x00\x00\x71\x07\x58\x03\x00\x00\x00"
     "\x61\x62\x63\x71\x08\x58\x05\x00\x00\x00\x63\x61\x66\xc3\xa9\x71\x09\x65\x58\x01\x00"
     "\x00\x00\x74\x71\x0a\x5d\x71\x0b\x28\x29\x28\x4b\x01\x74\x71\x0c\x28\x4b\x01\x4b\x02"
     "\x74\x71\x0d\x28\x4b\x01\x4b\x02\x4b\x03\x74\x71\x0e\x28\x4b\x01\x4b\x02\x4b\x03\x4b"
     "\x04\x74\x71\x0f\x65\x58\x01\x00\x00\x00\x6e\x71\x10\x5d\x71\x11\x28\x4e\x49\x30\x31"
     "\x0a\x49\x30\x30\x0a\x65\x58\x06\x00\x00\x00\x73\x68\x61\x72\x65\x64\x71\x12\x5d\x71"
     "\x13\x28\x5d\x71\x14\x28\x4b\x07\x68\x05\x65\x68\x14\x65\x58\x06\x00\x00\x00\x6e\x65"
     "\x73\x74\x65\x64\x71\x15\x7d\x71\x16\x58\x01\x00\x00\x00\x6b\x71\x17\x7d\x71\x18\x58"
     "\x01\x00\x00\x00\x78\x71\x19\x5d\x71\x1a\x5d\x71\x1b\x61\x73\x73\x75\x2e"sv,
     R"({'ints': [0, 1, -1, 255, 256, 65535, 65536, -2147483648, 2147483647, 1099511627776, -9223372036854775808, 9223372036854775807], 'f': [1.5, -0.25], 's': ['', 'abc', 'café'], 't': [(), (1,), (1, 2), (1, 2, 3), (1, 2, 3, 4)], 'n': [None, True, False], 'shared': [[7, 's'], [7, 's']], 'nested': {'k': {'x': [[]]}}})"},
    {2,
     "\x80\x02\x7d\x71\x00\x28\x58\x04\x00\x00\x00\x69\x6e\x74\x73\x71\x01\x5d\x71\x02\x28"
     "\x4b\x00\x4b\x01\x4a\xff\xff\xff\xff\x4b\xff\x4d\x00\x01\x4d\xff\xff\x4a\x00\x00\x01"
     "\x00\x4a\x00\x00\x00\x80\x4a\xff\xff\xff\x7f\x8a\x06\x00\x00\x00\x00\x00\x01\x8a\x08"
     "\x00\x00\x00\x00\x00\x00\x00\x80\x8a\x08\xff\xff\xff\xff\xff\xff\xff\x7f\x65\x58\x01"
     "\x00\x00\x00\x66\x71\x03\x5d\x71\x04\x28\x47\x3f\xf8\x00\x00\x00\x00\x00\x00\x47\xbf"
     "\xd0\x00\x00\x00\x00\x00\x00\x65\x58\x01\x00\x00\x00\x73\x71\x05\x5d\x71\x06\x28\x58"
     "\x00\x00\x00\x00\x71\x07\x58\x03\x00\x00\x00\x61\x62\x63\x71\x08\x58\x05\x00\x00\x00"
     "\x63\x61\x66\xc3\xa9\x71\x09\x65\x58\x01\x00\x00\x00\x74\x71\x0a\x5d\x71\x0b\x28\x29"
     "\x4b\x01\x85\x71\x0c\x4b\x01\x4b\x02\x86\x71\x0d\x4b\x01\x4b\x02\x4b\x03\x87\x71\x0e"
     "\x28\x4b\x01\x4b\x02\x4b\x03\x4b\x04\x74\x71\x0f\x65\x58\x01\x00\x00\x00\x6e\x71\x10"
     "\x5d\x71\x11\x28\x4e\x88\x89\x65\x58\x06\x00\x00\x00\x73\x68\x61\x72\x65\x64\x71\x12"
     "\x5d\x71\x13\x28\x5d\x71\x14\x28\x4b\x07\x68\x05\x65\x68\x14\x65\x58\x06\x00\x00\x00"
     "\x6e\x65\x73\x74\x65\x64\x71\x15\x7d\x71\x16\x58\x01\x00\x00\x00\x6b\x71\x17\x7d\x71"
     "\x18\x58\x01\x00\x00\x00\x78\x71\x19\x5d\x71\x1a\x5d\x71\x1b\x61\x73\x73\x75\x2e"sv,
     R"({'ints': [0, 1, -1, 255, 256, 65535, 65536, -2147483648, 2147483647, 1099511627776, -9223372036854775808, 9223372036854775807], 'f': [1.5, -0.25], 's': ['', 'abc', 'café'], 't': [(), (1,), (1, 2), (1, 2, 3), (1, 2, 3, 4)], 'n': [None, True, False], 'shared': [[7, 's'], [7, 's']], 'nested': {'k': {'x': [[]]}}})"},
    {3,
     "\x80\x03\x7d\x71\x00\x28\x58\x04\x00\x00\x00\x69\x6e\x74\x73\x71\x01\x5d\x71\x02\x28"
     "\x4b\x00\x4b\x01\x4a\xff\xff\xff\xff\x4b\xff\x4d\x00\x01\x4d\xff\xff\x4a\x00\x00\x01"
     "\x00\x4a\x00\x00\x00\x80\x4a\xff\xff\xff\x7f\x8a\x06\x00\x00\x00\x00\x00\x01\x8a\x08"
     "\x00\x00\x00\x00\x00\x00\x00\x80\x8a\x08\xff\xff\xff\xff\xff\xff\xff\x7f\x65\x58\x01"
     "\x00\x00\x00\x66\x71\x03\x5d\x71\x04\x28\x47\x3f\xf8\x00\x00\x00\x00\x00\x00\x47\xbf"
     "\xd0\x00\x00\x00\x00\x00\x00\x65\x58\x01\x00\x00\x00\x73\x71\x05\x5d\x71\x06\x28\x58"
     "\x00\x00\x00\x00\x71\x07\x58\x03\x00\x00\x00\x61\x62\x63\x71\x08\x58\x05\x00\x00\x00"
     "\x63\x61\x66\xc3\xa9\x71\x09\x65\x58\x01\x00\x00\x00\x74\x71\x0a\x5d\x71\x0b\x28\x29"
     "\x4b\x01\x85\x71\x0c\x4b\x01\x4b\x02\x86\x71\x0d\x4b\x01\x4b\x02\x4b\x03\x87\x71\x0e"
     "\x28\x4b\x01\x4b\x02\x4b\x03\x4b\x04\x74\x71\x0f\x65\x58\x01\x00\x00\x00\x6e\x71\x10"
     "\x5d\x71\x11\x28\x4e\x88\x89\x65\x58\x06\x00\x00\x00\x73\x68\x61\x72\x65\x64\x71\x12"
     "\x5d\x71\x13\x28\x5d\x71\x14\x28\x4b\x07\x68\x05\x65\x68\x14\x65\x58\x06\x00\x00\x00"
     "\x6e\x65\x73\x74\x65\x64\x71\x15\x7d\x71\x16\x58\x01\x00\x00\x00\x6b\x71\x17\x7d\x71"
     "\x18\x58\x01\x00\x00\x00\x78\x71\x19\x5d\x71\x1a\x5d\x71\x1b\x61\x73\x73\x58\x01\x00"
     "\x00\x00\x62\x71\x1c\x5d\x71\x1d\x28\x43\x00\x71\x1e\x43\x02\x78\x79\x71\x1f\x65\x75"
     "\x2e"sv,
     R"({'ints': [0, 1, -1, 255, 256, 65535, 65536, -2147483648, 2147483647, 1099511627776, -9223372036854775808, 9223372036854775807], 'f': [1.5, -0.25], 's': ['', 'abc', 'café'], 't': [(), (1,), (1, 2), (1, 2, 3), (1, 2, 3, 4)], 'n': [None, True, False], 'shared': [[7, 's'], [7, 's']], 'nested': {'k': {'x': [[]]}}, 'b': [b'', b'xy']})"},
    {4,
     "\x80\x04\x95\x09\x01\x00\x00\x00\x00\x00\x00\x7d\x94\x28\x8c\x04\x69\x6e\x74\x73\x94"
     "\x5d\x94\x28\x4b\x00\x4b\x01\x4a\xff\xff\xff\xff\x4b\xff\x4d\x00\x01\x4d\xff\xff\x4a"
     "\x00\x00\x01\x00\x4a\x00\x00\x00\x80\x4a\xff\xff\xff\x7f\x8a\x06\x00\x00\x00\x00\x00"
     "\x01\x8a\x08\x00\x00\x00\x00\x00\x00\x00\x80\x8a\x08\xff\xff\xff\xff\xff\xff\xff\x7f"
     "\x65\x8c\x01\x66\x94\x5d\x94\x28\x47\x3f\xf8\x00\x00\x00\x00\x00\x00\x47\xbf\xd0\x00"
     "\x00\x00\x00\x00\x00\x65\x8c\x01\x73\x94\x5d\x94\x28\x8c\x00\x94\x8c\x03\x61\x62\x63"
     "\x94\x8c\x05\x63\x61\x66\xc3\xa9\x94\x65\x8c\x01\x74\x94\x5d\x94\x28\x29\x4b\x01\x85"
     "\x94\x4b\x01\x4b\x02\x86\x94\x4b\x01\x4b\x02\x4b\x03\x87\x94\x28\x4b\x01\x4b\x02\x4b"
     "\x03\x4b\x04\x74\x94\x65\x8c\x01\x6e\x94\x5d\x94\x28\x4e\x88\x89\x65\x8c\x06\x73\x68"
     "\x61\x72\x65\x64\x94\x5d\x94\x28\x5d\x94\x28\x4b\x07\x68\x05\x65\x68\x14\x65\x8c\x06"
     "\x6e\x65\x73\x74\x65\x64\x94\x7d\x94\x8c\x01\x6b\x94\x7d\x94\x8c\x01\x78\x94\x5d\x94"
     "\x5d\x94\x61\x73\x73\x8c\x01\x62\x94\x5d\x94\x28\x43\x00\x94\x43\x02\x78\x79\x94\x65"
     "\x8c\x04\x73\x65\x74\x73\x94\x5d\x94\x28\x8f\x94\x28\x4b\x03\x90\x28\x4b\x04\x91\x94"
     "\x65\x75\x2e"sv,
     R"({'ints': [0, 1, -1, 255, 256, 65535, 65536, -2147483648, 2147483647, 1099511627776, -9223372036854775808, 9223372036854775807], 'f': [1.5, -0.25], 's': ['', 'abc', 'café'], 't': [(), (1,), (1, 2), (1, 2, 3), (1, 2, 3, 4)], 'n': [None, True, False], 'shared': [[7, 's'], [7, 's']], 'nested': {'k': {'x': [[]]}}, 'b': [b'', b'xy'], 'sets': [[3], [4]]})"},
};

TEST(SafePickle, EveryProtocolAsPythonLoadsIt) {
  for (const Vector& v : kProtocolVectors) {
    EXPECT_EQ(LoadRepr(v.bytes), v.repr) << "protocol " << v.protocol;
    if (v.protocol == 4) {  // Python's protocol 5 pickle of it differs only in PROTO's argument
      std::string p5(v.bytes);
      p5[1] = '\x05';
      EXPECT_EQ(LoadRepr(p5), v.repr) << "protocol 5";
    }
  }
}

// Opcodes Python 3 no longer writes, each checked with pickle.loads: STRING (escapes: \x, octal,
// quote), BINSTRING, SHORT_BINSTRING, BINUNICODE8, BINBYTES8, BYTEARRAY8, BINBYTES, LONG4 of 9
// bytes (sign extension) and of 0, LIST; LONG_BINPUT/LONG_BINGET, DUP, POP_MARK, POP; LONG1
// negative, empty and 8 bytes; INT's bools, LONG's L suffix, FLOAT, UNICODE's \u and \U
// escapes, DICT, PUT, GET, SETITEM.
TEST(SafePickle, OlderOpcodesAsPythonLoadsThem) {
  EXPECT_EQ(
      LoadRepr("(S'a\\x41\\n\\101\\'q'\nT\x03\x00\x00\x00"
               "abcU\x02hi\x8d\x02\x00\x00\x00\x00\x00\x00\x00yz\x8e\x01\x00\x00\x00\x00\x00"
               "\x00\x00"
               "B\x96\x02\x00\x00\x00\x00\x00\x00\x00"
               "CDB\x01\x00\x00\x00"
               "E\x8b\x09\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x80\xff\x8b\x00\x00\x00\x00l."sv),
      R"(["aA\nA'q", 'abc', 'hi', 'yz', b'B', b'CD', b'E', -9223372036854775808, 0])");
  EXPECT_EQ(LoadRepr("\x80\x02K\x07r\x00\x01\x00\x00j\x00\x01\x00\x00"
                     "2\x86(N1K\x09K\x08"
                     "0\x85\x86."sv),
            "((7, 7), (9,))");
  EXPECT_EQ(LoadRepr("\x80\x02]q\x00(K\x01K\x02"
                     "eh\x00\x86."sv),
            "([1, 2], [1, 2])");
  EXPECT_EQ(
      LoadRepr("\x80\x02\x8a\x02\x00\xff\x8a\x00\x8a\x08\xff\xff\xff\xff\xff\xff\xff\x7f\x87."sv),
      "(-256, 0, 9223372036854775807)");
  EXPECT_EQ(LoadRepr("(I01\nI00\nL-12L\nF-3.25e2\nVa\\u20acb\\U0001F600\nt."sv),
            "(True, False, -12, -325.0, 'a\u20acb\U0001F600')");
  EXPECT_EQ(LoadRepr("(dp0\nVk\np1\nI5\nsg1\nI6\ns."sv), "{'k': 5, 'k': 6}");
}

TEST(SafePickle, DictKeepsPairsFindReturnsTheLast) {
  absl::StatusOr<pickle::Document> doc = pickle::Load("(dp0\nVk\np1\nI5\nsg1\nI6\ns."sv);
  ASSERT_TRUE(doc.ok()) << doc.status();
  ASSERT_NE(doc->root().Find("k"), nullptr);
  EXPECT_EQ(doc->root().Find("k")->as_int(), 6);  // Python: {'k': 6}
  EXPECT_EQ(doc->root().Find("x"), nullptr);
}

TEST(SafePickle, RefusesEveryOpcodeThatResolvesOrCalls) {
  const std::pair<char, std::string_view> refused[] = {
      {'c', "GLOBAL"},
      {'\x93', "STACK_GLOBAL"},
      {'R', "REDUCE"},
      {'b', "BUILD"},
      {'i', "INST"},
      {'o', "OBJ"},
      {'\x81', "NEWOBJ"},
      {'\x92', "NEWOBJ_EX"},
      {'\x82', "EXT1"},
      {'\x83', "EXT2"},
      {'\x84', "EXT4"},
      {'P', "PERSID"},
      {'Q', "BINPERSID"},
      {'\x97', "NEXT_BUFFER"},
      {'\x98', "READONLY_BUFFER"},
  };
  for (const auto& [op, name] : refused) {
    // After a valid prefix: PROTO 4, EMPTY_DICT, then the opcode at byte 3.
    std::string bytes = "\x80\x04}";
    bytes.push_back(op);
    bytes += "os\nsystem\n.";
    const std::string err = LoadError(bytes);
    EXPECT_THAT(err, HasSubstr("opcode " + std::string(name) + " ("));
    EXPECT_THAT(err, HasSubstr("at byte 3 refused"));
    EXPECT_EQ(err.find('\n'), std::string::npos) << err;
  }
}

// A pickle that runs `touch /tmp/PWNED_rankwatch_fr_reader` when Python loads it (derived/
// make_derived.py, checked in): refused at its GLOBAL or STACK_GLOBAL, and nothing ran.
TEST(FrReader, RefusesCodeExecutingPayload) {
  const std::filesystem::path marker = "/tmp/PWNED_rankwatch_fr_reader";
  std::filesystem::remove(marker);
  const std::pair<std::string_view, std::string_view> files[] = {
      {"reduce_os_system.p2.pkl", "opcode GLOBAL (0x63) at byte 190 refused"},
      {"reduce_os_system.p4.pkl", "opcode STACK_GLOBAL (0x93) at byte 162 refused"},
  };
  for (const auto& [name, expected] : files) {
    const std::filesystem::path file = kFixtures / "derived" / "hostile" / name;
    ASSERT_TRUE(std::filesystem::exists(file)) << file;
    absl::StatusOr<FrDump> dump = ReadFrDumpFile(file);
    ASSERT_FALSE(dump.ok()) << name;
    EXPECT_THAT(Msg(dump.status()), HasSubstr(expected));
    EXPECT_THAT(Msg(dump.status()), HasSubstr(name));
  }
  EXPECT_FALSE(std::filesystem::exists(marker));
}

TEST(SafePickle, HostileInputIsAnErrorNotACrash) {
  // No STOP, empty, unknown opcode, bad protocol.
  EXPECT_THAT(LoadError(""), HasSubstr("no STOP"));
  EXPECT_THAT(LoadError("\x80\x02N"), HasSubstr("no STOP"));
  EXPECT_THAT(LoadError("\x80\x02\xff."), HasSubstr("unknown opcode 0xff at byte 2"));
  EXPECT_THAT(LoadError("\x80\x06N."), HasSubstr("unsupported protocol 6"));
  // Length fields past the end, huge or negative.
  EXPECT_THAT(LoadError("\x80\x02X\xff\xff\xff\xff"
                        "abc."),
              HasSubstr("length field 4294967295"));
  EXPECT_THAT(LoadError("\x80\x02X\x10\x00\x00\x00"
                        "abc."sv),
              HasSubstr("truncated input: needs 16 bytes, 4 left (opcode BINUNICODE at byte 2)"));
  EXPECT_THAT(LoadError("\x80\x04\x8d\xff\xff\xff\xff\xff\xff\xff\x7f"
                        "abc."),
              HasSubstr("length field 9223372036854775807"));
  EXPECT_THAT(LoadError("\x80\x04\x95\xff\xff\xff\xff\xff\xff\xff\xff."), HasSubstr("truncated"));
  EXPECT_THAT(LoadError("\x80\x02T\xff\xff\xff\xff."), HasSubstr("negative byte count"));
  EXPECT_THAT(LoadError("\x80\x02\x8b\xff\xff\xff\x7f."), HasSubstr("truncated"));
  EXPECT_THAT(LoadError("\x80\x02\x8b\xff\xff\xff\xff."), HasSubstr("negative byte count"));
  EXPECT_THAT(LoadError("\x80\x02\x8a\x09\x01\x00\x00\x00\x00\x00\x00\x00\x01."sv),
              HasSubstr("does not fit in 64 bits"));
  EXPECT_THAT(LoadError("I99999999999999999999\n."), HasSubstr("does not fit in 64 bits"));
  EXPECT_THAT(LoadError("Iabc\n."), HasSubstr("not an integer"));
  EXPECT_THAT(LoadError("I12"), HasSubstr("no end of line"));
  EXPECT_THAT(LoadError("Sabc\n."), HasSubstr("must be quoted"));
  // Stack and memo misuse.
  EXPECT_THAT(LoadError("\x80\x02."), HasSubstr("STOP with an empty stack"));
  EXPECT_THAT(LoadError("\x80\x02"
                        "a."),
              HasSubstr("stack underflow"));
  EXPECT_THAT(LoadError("\x80\x02(a."), HasSubstr("stack underflow"));  // below the mark
  EXPECT_THAT(LoadError("\x80\x02K\x01"
                        "e."),
              HasSubstr("no MARK"));
  EXPECT_THAT(LoadError("\x80\x02K\x01(K\x02"
                        "e."),
              HasSubstr("expects a list"));
  EXPECT_THAT(LoadError("\x80\x02}(K\x01"
                        "u."),
              HasSubstr("odd number of items"));
  EXPECT_THAT(LoadError("\x80\x02]K\x01K\x02s."), HasSubstr("expects a dict"));
  EXPECT_THAT(LoadError("\x80\x04]\x90."), HasSubstr("no MARK"));
  EXPECT_THAT(LoadError("\x80\x04](\x90."), HasSubstr("expects a set"));
  EXPECT_THAT(LoadError("\x80\x04(\x91(K\x01"
                        "e."),
              HasSubstr("expects a list"));  // frozenset
  EXPECT_THAT(LoadError("\x80\x02h\x05."), HasSubstr("memo key 5 not defined"));
  EXPECT_THAT(LoadError("\x80\x02K\x01q\x00q\x01"
                        "0q\x02."sv),
              HasSubstr("memoizes from an empty stack"));
  EXPECT_THAT(LoadError("\x80\x02\x86."), HasSubstr("stack underflow"));
  // A list that holds itself (Python loads it; a dump never is one).
  EXPECT_THAT(LoadError("\x80\x02]q\x00h\x00"
                        "a."sv),
              HasSubstr("holds itself"));
  EXPECT_THAT(LoadError("\x80\x02]q\x00](h\x00"
                        "ea."sv),
              HasSubstr("holds itself"));
}

TEST(SafePickle, LimitsAreErrors) {
  // Nesting: 100,000 lists in one another.
  std::string deep = "\x80\x02";
  deep.append(100000, ']');
  deep.append(99999, 'a');
  deep += '.';
  EXPECT_THAT(LoadError(deep), HasSubstr("nested deeper than 128"));
  // Nested through shared references too: each level is [x, x] of the previous one.
  std::string shared = "\x80\x02N";
  for (int i = 0; i < 200; ++i) shared += "2\x86";  // DUP, TUPLE2
  shared += '.';
  EXPECT_THAT(LoadError(shared), HasSubstr("nested deeper than 128"));
  pickle::PickleLimits limits;
  limits.max_depth = 300;
  // 2^200 leaves if expanded: kept as 201 shared nodes.
  absl::StatusOr<pickle::Document> doc = pickle::Load(shared, limits);
  ASSERT_TRUE(doc.ok()) << doc.status();
  EXPECT_EQ(doc->values(), 201u);
  // Memo, values, string size, stack.
  limits = {};
  limits.max_memo = 10;
  std::string memo = "\x80\x02N";
  for (int i = 0; i < 20; ++i) memo += "q" + std::string(1, static_cast<char>(i));
  memo += '.';
  EXPECT_THAT(LoadError(memo, limits), HasSubstr("more than 10 memo entries"));
  limits = {};
  limits.max_values = 100;
  EXPECT_THAT(LoadError("\x80\x02(" + std::string(200, 'N') + "l.", limits),
              HasSubstr("more than 100 values"));
  limits = {};
  limits.max_string = 4;
  EXPECT_THAT(LoadError("\x80\x02X\x05\x00\x00\x00"
                        "abcde."sv,
                        limits),
              HasSubstr("more than 4"));
  limits = {};
  limits.max_stack = 50;
  EXPECT_THAT(LoadError("\x80\x02" + std::string(100, '(') + "N.", limits),
              HasSubstr("stack deeper than 50"));
}

// Every prefix of a real dump is an error, never a crash (ASan/UBSan builds check the rest).
TEST(SafePickle, EveryTruncationOfARealDumpIsAnError) {
  const std::string bytes = ReadBytes(kFixtures / "nvrx-lock_gil_1st" / "_dump_0");
  ASSERT_GT(bytes.size(), 3000u);
  for (size_t n = 0; n < bytes.size(); ++n) {
    const absl::StatusOr<FrDump> d = ParseFrDump(std::string_view(bytes).substr(0, n));
    ASSERT_FALSE(d.ok()) << n;
  }
  EXPECT_TRUE(ParseFrDump(bytes).ok());
}

// --- the reader ---------------------------------------------------------------------------

TEST(FrReader, EveryRealDumpParses) {
  for (const auto& [set, total_entries] :
       {std::pair<std::string, size_t>{"nvrx-lock_gil_1st", 142}, {"nvrx-gpu_error_2nd", 278}}) {
    size_t entries = 0;
    for (int rank = 0; rank < 16; ++rank) {
      const std::filesystem::path file = kFixtures / set / absl::StrCat("_dump_", rank);
      absl::StatusOr<FrDump> dump = ReadFrDumpFile(file);
      ASSERT_TRUE(dump.ok()) << dump.status();
      EXPECT_EQ(dump->version, "2.9");
      EXPECT_EQ(dump->nccl_version, "2.27.3");
      EXPECT_EQ(dump->rank, -1);
      EXPECT_EQ(dump->groups.size(), 13u) << file;
      EXPECT_EQ(dump->status.size(), 13u) << file;
      for (const FrGroup& g : dump->groups) EXPECT_FALSE(g.ranks.empty()) << file << g.name;
      for (const FrEntry& e : dump->entries) {
        EXPECT_EQ(e.state, FrState::kScheduled);
        EXPECT_EQ(e.time_started_ns, -1);
        EXPECT_EQ(e.time_completed_ns, -1);
        EXPECT_GT(e.time_created_ns, 0);
        EXPECT_FALSE(e.pg_desc.empty());
      }
      entries += dump->entries.size();
      if (set == "nvrx-lock_gil_1st" && (rank == 9 || rank == 14)) {
        EXPECT_TRUE(dump->entries.empty()) << rank;  // their Python threads held the GIL
      }
    }
    EXPECT_EQ(entries, total_entries) << set;  // Python: sum(len(d['entries']))
  }
}

// Expected values from /usr/bin/python3: pickle.load(open(PATH, 'rb')).
TEST(FrReader, ValuesAsPythonLoadsThem) {
  absl::StatusOr<FrDump> d = ReadFrDumpFile(kFixtures / "nvrx-lock_gil_1st" / "_dump_0");
  ASSERT_TRUE(d.ok()) << d.status();
  std::vector<std::string> names;
  for (const FrGroup& g : d->groups) names.push_back(g.name);
  EXPECT_THAT(names, ElementsAre("0", "1", "108", "33", "35", "39", "40", "63", "67", "71", "89",
                                 "91", "92"));
  EXPECT_EQ(d->groups[0].desc, "default_pg");
  EXPECT_EQ(d->groups[0].ranks.size(), 16u);
  EXPECT_EQ(d->groups[0].ranks.back(), 15u);
  EXPECT_EQ(d->groups[1].desc, "DATA_PARALLEL_GROUP_WITH_CP");
  EXPECT_THAT(d->groups[1].ranks, ElementsAre(0, 4));
  EXPECT_EQ(d->groups[4].desc, "TENSOR_MODEL_PARALLEL_GROUP");
  EXPECT_THAT(d->groups[4].ranks, ElementsAre(0, 1, 2, 3));
  EXPECT_EQ(d->status[0].uid, "0");
  EXPECT_EQ(d->status[0].last_enqueued, 14146);
  EXPECT_EQ(d->status[0].last_started, -1);
  EXPECT_EQ(d->status[0].last_completed, 14145);
  EXPECT_EQ(d->status.back().uid, "17");
  EXPECT_EQ(d->status.back().last_enqueued, 116);
  EXPECT_EQ(d->status.back().last_completed, 116);
  ASSERT_EQ(d->entries.size(), 11u);
  const FrEntry& e0 = d->entries[0];
  EXPECT_EQ(e0.record_id, 190312);
  EXPECT_EQ(e0.pg_uid, 6);
  EXPECT_EQ(e0.pg_name, "39");
  EXPECT_EQ(e0.pg_desc, "PIPELINE_MODEL_PARALLEL_GROUP");
  EXPECT_EQ(e0.collective_seq_id, 29);
  EXPECT_EQ(e0.p2p_seq_id, 14147);
  EXPECT_EQ(e0.op_id, 14176);
  EXPECT_EQ(e0.profiling_name, "nccl:send 0->1");
  EXPECT_TRUE(e0.is_p2p);
  EXPECT_FALSE(e0.retired);
  EXPECT_EQ(e0.timeout_ms, 180000);
  EXPECT_EQ(e0.time_created_ns, 1758581237526848193);
  EXPECT_EQ(e0.input_sizes, (std::vector<std::vector<int64_t>>{{2048, 1, 5120}}));
  EXPECT_THAT(e0.input_dtypes, ElementsAre("BFloat16"));
  EXPECT_TRUE(e0.frames.empty());
  const FrEntry& e5 = d->entries[5];
  EXPECT_EQ(e5.record_id, 190326);
  EXPECT_EQ(e5.pg_uid, 5);
  EXPECT_EQ(e5.pg_name, "35");
  EXPECT_EQ(e5.collective_seq_id, 84922);
  EXPECT_EQ(e5.p2p_seq_id, 0);
  EXPECT_EQ(e5.profiling_name, "nccl:_reduce_scatter_base");
  EXPECT_FALSE(e5.is_p2p);
  EXPECT_EQ(e5.time_created_ns, 1758581237532111217);
  EXPECT_EQ(e5.input_sizes, (std::vector<std::vector<int64_t>>{{8192, 1, 5120}}));
  EXPECT_EQ(e5.output_sizes, (std::vector<std::vector<int64_t>>{{2048, 1, 5120}}));
  EXPECT_EQ(d->entries.back().record_id, 190331);
  EXPECT_EQ(d->entries.back().profiling_name, "nccl:_all_gather_base");

  d = ReadFrDumpFile(kFixtures / "nvrx-gpu_error_2nd" / "_dump_9");
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_EQ(d->entries.size(), 20u);
  EXPECT_EQ(d->entries[11].profiling_name, "nccl:recv 1<-0");
  EXPECT_TRUE(d->entries[11].is_p2p);
  EXPECT_EQ(d->entries[11].pg_uid, 6);
  EXPECT_EQ(d->entries[12].profiling_name, "nccl:send 9->1");
  EXPECT_EQ(d->entries[12].pg_uid, 0);
  EXPECT_EQ(d->entries[19].record_id, 192093);
  EXPECT_EQ(d->entries[19].pg_name, "37");
  EXPECT_EQ(d->entries[19].collective_seq_id, 87760);
  EXPECT_EQ(d->entries[19].time_created_ns, 1758580156095401070);
  EXPECT_THAT(d->entries[19].output_sizes[0], ElementsAre(8192, 1, 5120));
}

void ExpectSameDump(const FrDump& a, const FrDump& b) {
  EXPECT_EQ(a.version, b.version);
  EXPECT_EQ(a.rank, b.rank);
  EXPECT_EQ(a.nccl_version, b.nccl_version);
  ASSERT_EQ(a.groups.size(), b.groups.size());
  for (size_t i = 0; i < a.groups.size(); ++i) {
    EXPECT_EQ(a.groups[i].name, b.groups[i].name);
    EXPECT_EQ(a.groups[i].desc, b.groups[i].desc);
    EXPECT_EQ(a.groups[i].ranks, b.groups[i].ranks);
  }
  ASSERT_EQ(a.status.size(), b.status.size());
  for (size_t i = 0; i < a.status.size(); ++i) {
    EXPECT_EQ(a.status[i].uid, b.status[i].uid);
    EXPECT_EQ(a.status[i].last_enqueued, b.status[i].last_enqueued);
    EXPECT_EQ(a.status[i].last_started, b.status[i].last_started);
    EXPECT_EQ(a.status[i].last_completed, b.status[i].last_completed);
  }
  ASSERT_EQ(a.entries.size(), b.entries.size());
  for (size_t i = 0; i < a.entries.size(); ++i) {
    const FrEntry& x = a.entries[i];
    const FrEntry& y = b.entries[i];
    EXPECT_EQ(x.record_id, y.record_id) << i;
    EXPECT_EQ(x.pg_uid, y.pg_uid) << i;
    EXPECT_EQ(x.pg_name, y.pg_name) << i;
    EXPECT_EQ(x.pg_desc, y.pg_desc) << i;
    EXPECT_EQ(x.collective_seq_id, y.collective_seq_id) << i;
    EXPECT_EQ(x.p2p_seq_id, y.p2p_seq_id) << i;
    EXPECT_EQ(x.op_id, y.op_id) << i;
    EXPECT_EQ(x.profiling_name, y.profiling_name) << i;
    EXPECT_EQ(x.input_sizes, y.input_sizes) << i;
    EXPECT_EQ(x.output_sizes, y.output_sizes) << i;
    EXPECT_EQ(x.input_dtypes, y.input_dtypes) << i;
    EXPECT_EQ(x.output_dtypes, y.output_dtypes) << i;
    EXPECT_EQ(x.state, y.state) << i;
    EXPECT_EQ(x.time_created_ns, y.time_created_ns) << i;
    EXPECT_EQ(x.time_started_ns, y.time_started_ns) << i;
    EXPECT_EQ(x.time_completed_ns, y.time_completed_ns) << i;
    EXPECT_EQ(x.timeout_ms, y.timeout_ms) << i;
    EXPECT_EQ(x.is_p2p, y.is_p2p) << i;
    EXPECT_EQ(x.retired, y.retired) << i;
    ASSERT_EQ(x.frames.size(), y.frames.size()) << i;
    for (size_t f = 0; f < x.frames.size(); ++f) {
      EXPECT_EQ(x.frames[f].name, y.frames[f].name);
      EXPECT_EQ(x.frames[f].filename, y.frames[f].filename);
      EXPECT_EQ(x.frames[f].line, y.frames[f].line);
    }
  }
}

// derived/json/: the same dumps as JSON (derived/make_derived.py): json.dump of the pickle's
// content, and PyTorch's own JSON form (counters as strings, 0 for no timestamp, no entries key
// when empty).
TEST(FrReader, JsonFormGivesTheSameDump) {
  const std::pair<std::string_view, std::string_view> pairs[] = {
      {"nvrx-gpu_error_2nd_dump_9.json", "nvrx-gpu_error_2nd/_dump_9"},
      {"nvrx-gpu_error_2nd_dump_0.torch.json", "nvrx-gpu_error_2nd/_dump_0"},
      {"nvrx-lock_gil_1st_dump_14.torch.json", "nvrx-lock_gil_1st/_dump_14"},
  };
  for (const auto& [json, pkl] : pairs) {
    SCOPED_TRACE(json);
    absl::StatusOr<FrDump> a = ReadFrDumpFile(kFixtures / "derived" / "json" / json);
    absl::StatusOr<FrDump> b = ReadFrDumpFile(kFixtures / pkl);
    ASSERT_TRUE(a.ok()) << a.status();
    ASSERT_TRUE(b.ok()) << b.status();
    ExpectSameDump(*a, *b);
  }
}

// Builds protocol-2 pickles the way torch's pickler writes them (memoized strings and frames).
class PickleWriter {
 public:
  PickleWriter& Op(std::string_view ops) {
    out_ += ops;
    return *this;
  }
  PickleWriter& Str(std::string_view s) {
    out_ += 'X';
    U32(s.size());
    out_ += s;
    return *this;
  }
  PickleWriter& Int(int64_t v) {
    out_ += "\x8a\x08";
    for (int i = 0; i < 8; ++i)
      out_ += static_cast<char>((static_cast<uint64_t>(v) >> (8 * i)) & 0xff);
    return *this;
  }
  PickleWriter& Put(uint32_t i) {
    out_ += 'r';
    U32(i);
    return *this;
  }
  PickleWriter& Get(uint32_t i) {
    out_ += 'j';
    U32(i);
    return *this;
  }
  // A top-level dict: version, a 2-rank pg_config, then `entries` as the caller writes it
  // (the caller writes the list, then Done()).
  PickleWriter& DumpHead() {
    return Op("}(")
        .Str("version")
        .Str("2.9")
        .Str("pg_config")
        .Op("}(")
        .Str("0")
        .Op("}(")
        .Str("name")
        .Str("0")
        .Str("desc")
        .Str("default_pg")
        .Str("ranks")
        .Str("[0, 1]")
        .Op("uu")
        .Str("entries");
  }
  std::string Done() { return out_ + "u."; }

 private:
  void U32(uint64_t n) {
    for (int i = 0; i < 4; ++i) out_ += static_cast<char>((n >> (8 * i)) & 0xff);
  }
  std::string out_ = "\x80\x02";
};

TEST(FrReader, FramesStatesAndTimesFromAPickle) {
  PickleWriter w;
  w.DumpHead().Op("](");
  // Frame dicts are shared between entries (torch memoizes them): memo 1, 2.
  w.Op("}(")
      .Str("name")
      .Str("all_reduce")
      .Str("filename")
      .Str("distributed_c10d.py")
      .Str("line")
      .Int(2696)
      .Op("u")
      .Put(1)
      .Op("0");
  w.Op("}(")
      .Str("name")
      .Str("main")
      .Str("filename")
      .Str("train.py")
      .Str("line")
      .Int(40)
      .Op("u")
      .Put(2)
      .Op("0");  // POP: only memoized
  for (int i = 0; i < 3; ++i) {
    w.Op("}(")
        .Str("profiling_name")
        .Str("nccl:all_reduce")
        .Str("process_group")
        .Str("0")
        .Str("default_pg")
        .Op("\x86")
        .Str("collective_seq_id")
        .Int(10 + i)
        .Str("state")
        .Str(i == 0   ? "completed"
             : i == 1 ? "started"
                      : "scheduled")
        .Str("time_created_ns")
        .Int(1000 + i)
        .Str("time_discovered_started_ns");
    if (i <= 1)
      w.Int(2000 + i);
    else
      w.Op("N");
    w.Str("time_discovered_completed_ns");
    if (i == 0)
      w.Int(3000);
    else
      w.Op("N");
    w.Str("retired").Op(i == 0 ? "\x88" : "\x89");
    w.Str("frames").Op("](").Get(1).Get(2).Op("e");
    w.Op("u");
  }
  w.Op("e");
  const std::string bytes = w.Done();
  absl::StatusOr<FrDump> d = ParseFrDump(bytes);
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_EQ(d->entries.size(), 3u);
  EXPECT_EQ(d->entries[0].state, FrState::kCompleted);
  EXPECT_EQ(d->entries[1].state, FrState::kStarted);
  EXPECT_EQ(d->entries[2].state, FrState::kScheduled);
  EXPECT_EQ(d->entries[0].time_started_ns, 2000);
  EXPECT_EQ(d->entries[0].time_completed_ns, 3000);
  EXPECT_EQ(d->entries[1].time_started_ns, 2001);
  EXPECT_EQ(d->entries[1].time_completed_ns, -1);
  EXPECT_EQ(d->entries[2].time_started_ns, -1);
  EXPECT_TRUE(d->entries[0].retired);
  EXPECT_FALSE(d->entries[1].retired);
  EXPECT_FALSE(d->entries[0].is_p2p);  // no is_p2p key: from the name
  EXPECT_EQ(d->entries[2].collective_seq_id, 12);
  EXPECT_EQ(d->entries[2].p2p_seq_id, -1);
  ASSERT_EQ(d->entries[2].frames.size(), 2u);
  EXPECT_EQ(d->entries[2].frames[0].name, "all_reduce");
  EXPECT_EQ(d->entries[2].frames[0].filename, "distributed_c10d.py");
  EXPECT_EQ(d->entries[2].frames[0].line, 2696);
  EXPECT_EQ(d->entries[2].frames[1].name, "main");
  FrReadOptions one_frame;
  one_frame.max_frames = 1;
  d = ParseFrDump(bytes, one_frame);
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_EQ(d->entries[1].frames.size(), 1u);
  EXPECT_EQ(d->entries[1].frames[0].name, "all_reduce");  // the innermost
  EXPECT_STREQ(FrStateName(d->entries[0].state), "completed");
  EXPECT_STREQ(FrStateName(FrState::kUnknown), "unknown");
  FrReadOptions two_entries;
  two_entries.max_entries = 2;
  EXPECT_THAT(Msg(ParseFrDump(bytes, two_entries).status()),
              HasSubstr("entries: 3 entries, more than 2"));
  FrReadOptions small;
  small.max_bytes = 100;
  EXPECT_THAT(Msg(ParseFrDump(bytes, small).status()), HasSubstr("more than 100"));
}

// PyTorch's analyzer tests write entries with seq ids as strings, dtypes as one string, no
// frames, no pg_status; older dumps lack is_p2p and p2p_seq_id; ranks may be a list.
TEST(FrReader, LenientAsPyTorchsAnalyzer) {
  const std::string json = R"({"version": "2.8", "rank": 1,
    "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": [0, 1]},
                  "1": {"desc": "sub_pg", "ranks": "[1]"}},
    "entries": [
      {"profiling_name": "nccl:all_reduce", "state": "scheduled", "process_group": ["0", "default"],
       "input_sizes": [[4, 4]], "output_sizes": [[4, 4]], "input_dtypes": "float32",
       "output_dtypes": "", "collective_seq_id": "1", "p2p_seq_id": " 0 ", "time_created_ns": 0,
       "frames": [], "record_id": 0},
      {"profiling_name": "nccl:recv 1<-0", "process_group": ["1"], "state": "weird",
       "collective_seq_id": 3.0}
    ]})";
  absl::StatusOr<FrDump> d = ParseFrDump(json);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->version, "2.8");
  EXPECT_EQ(d->rank, 1);
  ASSERT_EQ(d->groups.size(), 2u);
  EXPECT_THAT(d->groups[0].ranks, ElementsAre(0, 1));
  EXPECT_EQ(d->groups[1].name, "1");  // from the key
  EXPECT_THAT(d->groups[1].ranks, ElementsAre(1));
  EXPECT_TRUE(d->status.empty());
  ASSERT_EQ(d->entries.size(), 2u);
  const FrEntry& e = d->entries[0];
  EXPECT_EQ(e.collective_seq_id, 1);
  EXPECT_EQ(e.p2p_seq_id, 0);
  EXPECT_THAT(e.input_dtypes, ElementsAre("float32"));
  EXPECT_TRUE(e.output_dtypes.empty());
  EXPECT_EQ(e.time_created_ns, -1);
  EXPECT_EQ(e.record_id, 0);
  EXPECT_FALSE(e.is_p2p);
  EXPECT_EQ(e.pg_desc, "default");
  EXPECT_TRUE(d->entries[1].is_p2p);  // "recv", no is_p2p key
  EXPECT_EQ(d->entries[1].pg_desc, "");
  EXPECT_EQ(d->entries[1].state, FrState::kUnknown);
  EXPECT_EQ(d->entries[1].collective_seq_id, 3);
  EXPECT_EQ(d->entries[1].record_id, -1);
}

TEST(FrReader, ClearErrors) {
  auto err = [](std::string_view bytes) {
    absl::StatusOr<FrDump> d = ParseFrDump(bytes);
    return d.ok() ? std::string("parsed") : std::string(d.status().message());
  };
  const std::string cfg = R"("pg_config": {"0": {"name": "0", "desc": "d", "ranks": "[0, 1]"}})";
  EXPECT_THAT(err(""), HasSubstr("empty file"));
  EXPECT_THAT(err("hello"), HasSubstr("neither a pickle"));
  EXPECT_THAT(err("[1]"), HasSubstr("neither a pickle"));
  EXPECT_THAT(err("{\"entries\": []}"), HasSubstr("pg_config: missing"));
  EXPECT_EQ(err("{" + cfg + "}"), "parsed");  // JSON: no entries key when empty
  EXPECT_THAT(err("{" + cfg + ", \"entries\": {}}"),
              HasSubstr("entries: expected a list, found dict"));
  EXPECT_THAT(err("{" + cfg + ", \"entries\": [3]}"),
              HasSubstr("entries[0]: expected a dict, found int"));
  EXPECT_THAT(err("{" + cfg + R"(, "entries": [{"process_group": ["0", "d"]}]})"),
              HasSubstr("entries[0].profiling_name: missing"));
  EXPECT_THAT(err("{" + cfg + R"(, "entries": [{"profiling_name": "x"}]})"),
              HasSubstr("entries[0].process_group: missing"));
  EXPECT_THAT(err("{" + cfg +
                  R"(, "entries": [{"profiling_name": "x", "process_group": ["0", "d"],
                     "input_sizes": "[[1]]"}]})"),
              HasSubstr("entries[0].input_sizes: expected a list of lists, found str"));
  EXPECT_THAT(err("{" + cfg +
                  R"(, "entries": [{"profiling_name": "x", "process_group": ["0", "d"],
                     "collective_seq_id": "1x"}]})"),
              HasSubstr("entries[0].collective_seq_id: expected an integer, found the str \"1x\""));
  EXPECT_THAT(err(R"({"pg_config": {"0": {"desc": "d"}}, "entries": []})"),
              HasSubstr("pg_config[\"0\"].ranks: missing"));
  EXPECT_THAT(err(R"({"pg_config": {"0": {"ranks": "[0, x]"}}, "entries": []})"),
              HasSubstr("pg_config[\"0\"].ranks: ranks \"[0, x]\": not a rank"));
  EXPECT_THAT(err(R"({"pg_config": {"0": {"ranks": [-1]}}, "entries": []})"),
              HasSubstr("rank -1 out of range"));
  EXPECT_THAT(err(R"({"pg_config": [], "entries": []})"),
              HasSubstr("pg_config: expected a dict, found list"));
  EXPECT_THAT(err(R"({"pg_config": {}, "entries": [], "pg_status": {"0": 1}})"),
              HasSubstr("pg_status[\"0\"]: expected a dict, found int"));
  EXPECT_THAT(err(R"({"pg_config": {}, "entries": [], "x": 18446744073709551615})"),
              HasSubstr("does not fit in 64 bits"));
  EXPECT_THAT(err("{\"pg_config\": "), HasSubstr("not valid JSON"));
  // JSON nested deeper than the reader's limit, and deeper than simdjson's.
  EXPECT_THAT(err("{\"x\": " + std::string(100, '[') + std::string(100, ']') + "}"),
              HasSubstr("JSON nested deeper than 64"));
  EXPECT_THAT(err("{\"x\": " + std::string(5000, '[') + std::string(5000, ']') + "}"),
              HasSubstr("not valid JSON"));
  // The pickle form always has entries; its root must be a dict.
  PickleWriter w;
  w.DumpHead().Op("N");
  EXPECT_THAT(err(w.Done()), HasSubstr("entries: expected a list, found None"));
  EXPECT_THAT(err("\x80\x02]."), HasSubstr("flight recorder dump: is a list, not a dict"));
  EXPECT_THAT(err("\x80\x02}(X\x09\x00\x00\x00pg_config}u."sv), HasSubstr("entries: missing"));
  EXPECT_THAT(Msg(ReadFrDumpFile(kFixtures / "no-such-file").status()), HasSubstr("no-such-file"));
}

// A small pickle whose entries share one entry dict, whose sizes share one list of 10,000
// lists, each the same 10,000 ints: 10^11 values if expanded. Refused by the budget (here
// 32 MiB, to keep the test fast; the default is 1 GiB).
TEST(FrReader, SharedReferencesCannotExpandWithoutBound) {
  PickleWriter w;
  w.DumpHead();
  w.Op("](");
  for (int i = 0; i < 10000; ++i) w.Int(7);
  w.Op("e").Put(2).Op("0");  // 10,000 ints
  w.Op("](");
  for (int i = 0; i < 10000; ++i) w.Get(2);
  w.Op("e").Put(3).Op("0");  // S: 10,000 references to it
  w.Op("}(")
      .Str("profiling_name")
      .Str("nccl:all_reduce")
      .Str("process_group")
      .Str("0")
      .Str("default_pg")
      .Op("\x86")
      .Str("input_sizes")
      .Get(3)
      .Op("u")
      .Put(4)
      .Op("0");
  w.Op("](");
  for (int i = 0; i < 1000; ++i) w.Get(4);
  w.Op("e");
  const std::string bytes = w.Done();
  EXPECT_LT(bytes.size(), 200000u);
  FrReadOptions options;
  options.max_expanded_bytes = 32 << 20;
  const absl::StatusOr<FrDump> d = ParseFrDump(bytes, options);
  ASSERT_FALSE(d.ok());
  EXPECT_THAT(Msg(d.status()), HasSubstr("exceeds 33554432 bytes"));
}

TEST(FrReader, RanksText) {
  EXPECT_THAT(*ParseFrRanks("[0, 1, 2]"), ElementsAre(0, 1, 2));
  EXPECT_THAT(*ParseFrRanks(" [ 7 ] "), ElementsAre(7));
  EXPECT_THAT(*ParseFrRanks("[]"), ElementsAre());
  EXPECT_THAT(*ParseFrRanks("3,4"), ElementsAre(3, 4));
  EXPECT_THAT(*ParseFrRanks("[4294967295]"), ElementsAre(4294967295u));
  EXPECT_FALSE(ParseFrRanks("[4294967296]").ok());
  EXPECT_FALSE(ParseFrRanks("[0, 1").ok());
  EXPECT_FALSE(ParseFrRanks("[0,]").ok());
  EXPECT_FALSE(ParseFrRanks("[0 1]").ok());
  EXPECT_FALSE(ParseFrRanks("[-1]").ok());
}

}  // namespace
}  // namespace rankwatch::fr
