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
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "flight_recorder/fr_dump.h"

namespace rankwatch::fr {

// Shares the rank lists of process groups among the dumps read through it: each distinct
// `ranks` text is parsed once. Thread-safe. Bounded by the distinct lists it is given (a
// job's dumps name a few per rank position).
class FrRanksInterner {
 public:
  FrRanksInterner();
  ~FrRanksInterner();
  // The list `text` means ("[0, 1, 2]"), parsed on first sight.
  absl::StatusOr<FrRanks> Get(std::string_view text);
  // The shared copy of `list` (as given, e.g. from the wire); `fresh` says it was new.
  FrRanks Get(std::vector<uint32_t> list, bool* fresh = nullptr);
  size_t size() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

struct FrReadOptions {
  size_t max_bytes = size_t{512} << 20;  // a larger file is refused; default 512 MiB
  size_t max_entries = 1 << 20;          // a dump with more entries is refused; default 1,048,576
  size_t max_frames = 64;                // frames kept per entry (innermost); default 64
  // Values in the pickle or JSON document (about 80 bytes each while parsing); more: refused.
  size_t max_values = size_t{1} << 24;
  // The parsed dump's size in bytes, each value walked counted (a pickle's memo lets a small
  // file refer to one entry or frame many times); more: refused. Default 1 GiB.
  size_t max_expanded_bytes = size_t{1} << 30;
  // Shares rank lists across the dumps read with it (not owned; may be null: no sharing).
  FrRanksInterner* interner = nullptr;
};

// The dump in `bytes`: a pickle (first byte 0x80) or JSON (first non-blank byte '{').
//
// Leniency, as PyTorch's own analyzer reads dumps: sequence ids and counters may be decimal
// strings (PyTorch's JSON form writes pg_status that way); `input_dtypes`/`output_dtypes` may
// be one string instead of a list ("" is none); `frames`, `pg_status`, `is_p2p`, `p2p_seq_id`
// and the other entry fields but `profiling_name` and `process_group` may be absent (is_p2p is
// then derived from the operation's name, "send"/"recv"); `process_group` may be a tuple or a
// list; pg_config's `ranks` may be the string PyTorch writes ("[0, 1]") or a list. A timestamp
// that is None or 0 (the JSON form's "not recorded") is -1. The JSON form omits `entries` when
// there are none; the pickle always has them, and `pg_config` is required in both.
absl::StatusOr<FrDump> ParseFrDump(std::string_view bytes, const FrReadOptions& options = {});

// pg_config's ranks as PyTorch writes them, "[0, 1, 2]" (blanks and the brackets optional,
// commas or blanks between ranks); each rank fits in 32 bits.
absl::StatusOr<std::vector<uint32_t>> ParseFrRanks(std::string_view text);

// Reads and parses one file.
absl::StatusOr<FrDump> ReadFrDumpFile(const std::filesystem::path& file,
                                      const FrReadOptions& options = {});

}  // namespace rankwatch::fr
