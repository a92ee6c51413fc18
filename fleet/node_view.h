// NodeView: what the fleet view of nodes answers (docs/fleet.md) — the interface the gRPC
// service, the web UI and the CLI read, implemented by NodeLedger (fleet/node_ledger.h).
//
// Thread-safe: implementations answer from any thread.
#pragma once

#include <cstdint>

#include "rankwatch/v1/service.pb.h"

namespace rankwatch {

class NodeView {
 public:
  virtual ~NodeView() = default;
  // The top nodes by lost rank-seconds within the horizon as of `now_unix_ns`, or one node
  // (request.node) with its jobs. An unknown node gives an empty `nodes`.
  virtual v1::ListNodesResponse ListNodes(const v1::ListNodesRequest& request,
                                          int64_t now_unix_ns) const = 0;
};

}  // namespace rankwatch
