// The Flight Recorder verdict (flight_recorder/fr_analysis.h) as text and as JSON: what
// `rankwatch flight-recorder` prints, offline, and what the daemon's hang view shows.
//
// Pure functions; thread-compatible.
#pragma once

#include <string>

#include "flight_recorder/fr_analysis.h"

namespace rankwatch::fr {

struct ReportOptions {
  bool per_rank = false;   // also one line per rank: its dump and last operation per group
  size_t max_groups = 20;  // pending groups listed
};

// Tables in plain text, one verdict line first.
std::string VerdictText(const FrVerdict& v, const ReportOptions& options = {});

// One JSON object: world_size, dumps by state, culprits, groups, ranks, undecided, summary.
std::string VerdictJson(const FrVerdict& v);

// Every collective matched across its group's members (MatchCollectives: PyTorch fr_trace's
// table): one line each, the ones that fail first; at most `max` lines.
std::string CollectivesText(const std::vector<FrCollective>& collectives, size_t max = 200);

// The same as a JSON array.
std::string CollectivesJson(const std::vector<FrCollective>& collectives);

// "all_to_all #45265", "send (peer 8) #14147".
std::string OpText(const FrOp& op);

// "TENSOR_MODEL_PARALLEL_GROUP [0-3]".
std::string GroupText(const std::string& desc, const std::vector<uint32_t>& ranks);

}  // namespace rankwatch::fr
