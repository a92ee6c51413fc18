// How `rankwatch nodes` (cli/cmd_nodes.cc) prints the fleet view of nodes (docs/fleet.md): the
// top nodes as a table, or one node's record with a line per job it slowed. Pure functions of
// a ListNodesResponse and the time they are printed at; thread-safe.
#pragma once

#include <cstdint>
#include <string>

#include "rankwatch/v1/service.pb.h"

namespace rankwatch {

// How long before `now_unix_ns` `then_unix_ns` was: "12s ago", "7m ago", "3h ago", "2d ago";
// "now" within a second (or ahead of `now`, another instance's clock); "-" when unset (0).
std::string Ago(int64_t then_unix_ns, int64_t now_unix_ns);

// Rank-seconds as rank-hours to three significant figures or so: "41.2", "2.50", "0.013";
// "<0.001" for a cost too small to show, "0" for none.
std::string RankHours(double rank_seconds);

// A span of seconds as the daemon's flags write it: "7d", "24h", "36h", "90m", "45s" (days
// from 3 days on).
std::string Span(int64_t seconds);

// The top nodes: a heading (how many nodes the view holds over which horizon, the node alert's
// rule, whether the view is complete), then a line per node: NODE, JOBS, IN <window> (jobs
// within the alert window), EPISODES, LOST RANK-H, FIRST SEEN, LAST SEEN, ALERT.
std::string NodesTable(const v1::ListNodesResponse& nodes, int64_t now_unix_ns);

// `nodes.nodes(0)` with its jobs: a paragraph on the node, then a line per job: JOB, NAMESPACE,
// RANKS, EPISODES, LOST RANK-H, FIRST SEEN, LAST SEEN, FIRING. Needs one node in `nodes`.
std::string NodeDetail(const v1::ListNodesResponse& nodes, int64_t now_unix_ns);

}  // namespace rankwatch
