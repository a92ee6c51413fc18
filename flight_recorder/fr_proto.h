// fr_proto: PyTorch Flight Recorder dumps and verdicts on the wire. A node agent turns the
// dump it read (flight_recorder/fr_dump.h) into the telemetry `FlightRecorderDump`
// (proto/rankwatch/v1/telemetry.proto) and the daemon turns it back into a RankDump for the
// analysis (flight_recorder/fr_analysis.h); the analysis's FrVerdict becomes the service's
// `FlightRecorderVerdict` (proto/rankwatch/v1/service.proto), which the job's diagnosis and its
// hang alerts carry.
//
// Trimming for transport (a ring buffer holds thousands of entries with their Python stacks; a
// batch is at most 4 MiB): a dump keeps every entry that is not completed (scheduled, started,
// or of unknown state) and the last `completed_per_group` (default 8) completed entries of each
// group (by the group's local id, else its name), at most `max_entries` (default 4,096: the
// oldest completed go first, then the newest pending), in record order; each entry keeps its
// innermost `max_frames` (default 16) frames. When the dump still serializes over `max_bytes`
// (default 3 MiB), frames go (completed entries' first), then entries as above. Strings are cut
// to 4 KiB on a character boundary and invalid UTF-8 bytes become '?'. What was left out is
// counted (`entries_omitted`, `frames_omitted`). The analysis needs no more: a group's progress
// comes from pg_status, and its frontier is the first operation some member has not completed.
//
// Pure functions; thread-compatible.
#pragma once

#include <cstddef>
#include <string>

#include "flight_recorder/fr_analysis.h"
#include "flight_recorder/fr_dump.h"
#include "flight_recorder/fr_reader.h"
#include "rankwatch/v1/service.pb.h"
#include "rankwatch/v1/telemetry.pb.h"

namespace rankwatch::fr {

struct FrTransportOptions {
  size_t completed_per_group = 8;      // last completed entries kept per group; default 8
  size_t max_frames = 16;              // innermost frames kept per entry; default 16
  size_t max_entries = 4096;           // entries kept; default 4,096 (the daemon's limit)
  size_t max_bytes = size_t{3} << 20;  // serialized dump; default 3 MiB
  size_t max_string_bytes = 4096;      // every string; default 4 KiB (the daemon's limit)
};

// `dump` (read, or empty when it has no entries) trimmed into `out`, which is cleared first.
// The file's fields (rank, source, node, mtime, bytes, request id) are the caller's.
void DumpToProto(const FrDump& dump, const FrTransportOptions& options,
                 v1::FlightRecorderDump* out);

// An unreadable file: state UNREADABLE with the reader's error (cut to max_string_bytes).
void UnreadableToProto(const std::string& error, const FrTransportOptions& options,
                       v1::FlightRecorderDump* out);

// The dump the proto carries (the inverse of DumpToProto up to trimming). With `interner`, the
// groups' rank lists are shared with the other dumps converted through it.
FrDump DumpFromProto(const v1::FlightRecorderDump& in, FrRanksInterner* interner = nullptr);

// The analysis's view of the proto: rank, state (read / empty / unreadable), dump, error, and
// as source "node:path".
RankDump RankDumpFromProto(const v1::FlightRecorderDump& in, FrRanksInterner* interner = nullptr);

struct FrVerdictProtoOptions {
  size_t max_ranks = 256;  // per-rank reports kept (culprits and those they hold first)
  size_t max_listed = 64;  // ranks listed in a group's or a culprit's rank lists
  size_t max_frames = 8;   // frames kept per operation
  size_t max_groups = 64;  // pending groups kept
};

// The verdict as the service reports it. `rank_nodes` (optional, by rank) names where each
// rank's dump was read. Times are the caller's (analyzed_unix_ns, last_dump_unix_ns).
void VerdictToProto(const FrVerdict& verdict, const FrVerdictProtoOptions& options,
                    v1::FlightRecorderVerdict* out,
                    const std::vector<std::string>* rank_nodes = nullptr);

// Names on the wire.
v1::FlightRecorderDumpState DumpStateToProto(DumpState s);
v1::FlightRecorderOpState OpStateToProto(FrState s);
FrState OpStateFromProto(v1::FlightRecorderOpState s);

// `s` cut to at most `max_bytes` on a UTF-8 character boundary, invalid bytes replaced by '?'
// (proto3 strings must be valid UTF-8).
std::string WireString(const std::string& s, size_t max_bytes);

}  // namespace rankwatch::fr
