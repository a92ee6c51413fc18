// Finding and reading a job's Flight Recorder dumps on disk: PyTorch writes rank r's dump to
// `${TORCH_NCCL_DEBUG_INFO_TEMP_FILE}${r}` (default prefix /tmp/nccl_trace_rank_), so a dump's
// rank is the integer its file name ends with (the dump's own "rank" key wins when present).
// A path is a folder (every file whose name ends with digits), a prefix (the files that start
// with it and continue with digits only) or a file. Files that cannot be read or parsed become
// kUnreadable dumps with the reader's error; a dump without entries is kEmpty.
//
// Thread-compatible; no shared state.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "flight_recorder/fr_analysis.h"
#include "flight_recorder/fr_reader.h"

namespace rankwatch::fr {

// The rank a dump file's name carries (its trailing digits); false when it carries none.
bool RankFromFileName(const std::filesystem::path& file, uint32_t* rank);

// The dump files under `path` (folder, prefix or file), by rank. NotFound when there are none.
absl::StatusOr<std::vector<std::pair<uint32_t, std::filesystem::path>>> FindDumpFiles(
    const std::filesystem::path& path);

// Reads one file into a RankDump of `rank` (state kRead, kEmpty or kUnreadable).
RankDump LoadRankDump(uint32_t rank, const std::filesystem::path& file,
                      const FrReadOptions& options = {});

// Finds and reads every dump under the paths, on up to 8 threads, the groups' rank lists shared
// among them (through options.interner, else one of its own). When two files give one rank (by
// name, or by the dump's own rank), the later one (by modification time) is kept. A file whose
// name gives a rank of kMaxWorldSize or more is an error (InvalidArgument); a dump whose own
// rank is that large is unreadable.
absl::StatusOr<std::vector<RankDump>> LoadDumps(const std::vector<std::filesystem::path>& paths,
                                                const FrReadOptions& options = {});

}  // namespace rankwatch::fr
