// `rankwatch nodes [--server ADDR] [--node NAME] [--limit N] [--json]`: the fleet view of
// nodes (docs/fleet.md) from rankwatchd's ListNodes — the nodes that were culprits of straggler
// alerts across jobs, by what they cost (lost rank-hours), with the node alert's state; with
// --node, one node with a line per job it slowed. Printed by cli/nodes_table.h.
#include <chrono>
#include <cstdio>

#include "cli/commands.h"
#include "cli/grpc_client.h"
#include "cli/nodes_table.h"
#include "common/wall_clock.h"
#include "rankwatch/v1/service.grpc.pb.h"

namespace rankwatch {
namespace {

struct NodesFlags {
  GrpcClientFlags client;
  std::string node;
  uint32_t limit = 50;
  bool json = false;
  double timeout_s = 10;
};

int RunNodes(const NodesFlags& f) {
  auto channel = OpenChannel(f.client);
  if (!channel.ok()) {
    std::fprintf(stderr, "rankwatch nodes: %s\n", std::string(channel.status().message()).c_str());
    return 2;
  }
  auto stub = v1::RankWatch::NewStub(*channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::milliseconds(static_cast<int64_t>(f.timeout_s * 1000)));
  v1::ListNodesRequest request;
  request.set_node(f.node);
  request.set_limit(f.limit);
  v1::ListNodesResponse response;
  const grpc::Status status = stub->ListNodes(&ctx, request, &response);
  if (!status.ok()) {
    std::fprintf(stderr, "rankwatch nodes: %s\n", Explain(status, f.client).c_str());
    return 1;
  }
  if (f.json) {
    std::printf("%s", AnswerJson(response).c_str());
    return f.node.empty() || response.nodes_size() > 0 ? 0 : 1;
  }
  const int64_t now = WallNowUnixNs();
  if (f.node.empty()) {
    std::printf("%s", NodesTable(response, now).c_str());
    return 0;
  }
  if (response.nodes_size() == 0) {
    std::fprintf(stderr,
                 "rankwatch nodes: rankwatchd at %s holds no record of node '%s' within %s%s\n",
                 f.client.server.c_str(), f.node.c_str(), Span(response.horizon_seconds()).c_str(),
                 response.complete() ? "" : " (it is still reading the nodes topic)");
    return 1;
  }
  std::printf("%s", NodeDetail(response, now).c_str());
  return 0;
}

}  // namespace

CommandRunner AddNodesCommand(CLI::App& app) {
  auto f = std::make_shared<NodesFlags>();
  CLI::App* cmd = app.add_subcommand(
      "nodes", "the fleet view of nodes: which nodes slowed which jobs, and what it cost");
  AddGrpcClientFlags(cmd, &f->client);
  cmd->add_option("--node", f->node, "one node, with a line per job it slowed");
  cmd->add_option("--limit", f->limit, "the top N nodes by lost rank-hours")
      ->capture_default_str()
      ->check(CLI::Range(1u, 100000u));
  cmd->add_flag("--json", f->json, "the ListNodesResponse in the protobuf JSON mapping");
  cmd->add_option("--timeout", f->timeout_s, "seconds to wait for the answer")
      ->capture_default_str()
      ->check(CLI::Range(0.1, 600.0));
  return [cmd, f]() -> int { return cmd->parsed() ? RunNodes(*f) : -1; };
}

}  // namespace rankwatch
