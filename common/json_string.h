// JSON string literals for the JSON the daemon and the CLI write by hand (the kernel results,
// the web UI's answers, Chrome traces). Pure; thread-safe.
#pragma once

#include <string>
#include <string_view>

namespace rankwatch {

// `s` as a JSON string literal, quotes included: `"` and `\` escaped, control characters as
// \u00XX; every other byte as it is (the input is UTF-8, which protobuf checks on parse).
std::string JsonString(std::string_view s);

}  // namespace rankwatch
