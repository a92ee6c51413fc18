// Readers of Flight Recorder dumps (flight_recorder/fr_dump.h), a rank's file as PyTorch writes
// it: the pickle (protocol 2 and later, as torch's C++ pickler and Python's pickle write plain
// containers) or the JSON form. A dump is outside input: the pickle is read by a loader of its
// own (flight_recorder/safe_pickle.h) that knows containers, strings and numbers only, and
// refuses every opcode that would resolve a class or call one (GLOBAL, STACK_GLOBAL, REDUCE,
// BUILD, INST, OBJ, NEWOBJ, EXT*, PERSID): nothing in a dump can run code. Errors are one line
// and say where (byte offset, entry index, field).
//
// Thread-compatible; no shared state.
#pragma once

#include <cstddef>
#include <filesystem>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "flight_recorder/fr_dump.h"

namespace rankwatch::fr {

struct FrReadOptions {
  size_t max_bytes = size_t{512} << 20;  // a larger file is refused; default 512 MiB
  size_t max_entries = 1 << 20;          // ring buffer entries kept; default 1,048,576
  size_t max_frames = 64;                // frames kept per entry (innermost); default 64
};

// The dump in `bytes`: a pickle (first byte 0x80) or JSON (first non-blank byte '{').
absl::StatusOr<FrDump> ParseFrDump(std::string_view bytes, const FrReadOptions& options = {});

// Reads and parses one file.
absl::StatusOr<FrDump> ReadFrDumpFile(const std::filesystem::path& file,
                                      const FrReadOptions& options = {});

}  // namespace rankwatch::fr
