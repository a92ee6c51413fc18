// What `rankwatch nodes` prints: relative times, rank-hours, the top nodes table and a node's
// jobs, from ListNodesResponses built here.
#include "cli/nodes_table.h"

#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

namespace rankwatch {
namespace {

constexpr int64_t kS = 1'000'000'000;
constexpr int64_t kNow = 1'790'000'000 * kS;

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

// The whitespace-separated words of a line.
std::vector<std::string> Words(const std::string& line) {
  std::vector<std::string> out;
  std::istringstream in(line);
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

v1::ListNodesResponse Response() {
  v1::ListNodesResponse n;
  n.set_nodes_total(12);
  n.set_horizon_seconds(7 * 86400);
  n.set_alert_window_seconds(86400);
  n.set_alert_jobs(3);
  n.set_complete(true);
  v1::NodeRecord* a = n.add_nodes();
  a->set_node("gpu-17");
  a->set_jobs(3);
  a->set_jobs_in_alert_window(3);
  a->set_episodes(4);
  a->set_lost_rank_seconds(41.2 * 3600);
  a->set_first_unix_ns(kNow - 2 * 86400 * kS);
  a->set_last_unix_ns(kNow - 90 * kS);
  a->set_alert_firing(true);
  v1::NodeRecord* b = n.add_nodes();
  b->set_node("a-much-longer-node-name.cluster.local");
  b->set_jobs(1);
  b->set_episodes(1);
  b->set_lost_rank_seconds(36);
  b->set_first_unix_ns(kNow - 3 * 3600 * kS);
  b->set_last_unix_ns(kNow - 3 * 3600 * kS);
  return n;
}

TEST(NodesTableTest, AgoSaysHowLongBeforeNow) {
  EXPECT_EQ(Ago(0, kNow), "-");
  EXPECT_EQ(Ago(kNow, kNow), "now");
  EXPECT_EQ(Ago(kNow + 5 * kS, kNow), "now");  // another instance's clock ahead of ours
  EXPECT_EQ(Ago(kNow - 12 * kS, kNow), "12s ago");
  EXPECT_EQ(Ago(kNow - 7 * 60 * kS - 59 * kS, kNow), "7m ago");
  EXPECT_EQ(Ago(kNow - 3 * 3600 * kS, kNow), "3h ago");
  EXPECT_EQ(Ago(kNow - 9 * 86400 * kS, kNow), "9d ago");
}

TEST(NodesTableTest, RankHoursKeepSmallCostsVisible) {
  EXPECT_EQ(RankHours(0), "0");
  EXPECT_EQ(RankHours(-1), "0");
  EXPECT_EQ(RankHours(1), "<0.001");
  EXPECT_EQ(RankHours(36), "0.010");
  EXPECT_EQ(RankHours(2.5 * 3600), "2.50");
  EXPECT_EQ(RankHours(41.24 * 3600), "41.2");
  EXPECT_EQ(RankHours(1234.4 * 3600), "1234");
  EXPECT_EQ(Span(7 * 86400), "7d");
  EXPECT_EQ(Span(24 * 3600), "24h");
  EXPECT_EQ(Span(48 * 3600), "48h");
  EXPECT_EQ(Span(72 * 3600), "3d");
  EXPECT_EQ(Span(36 * 3600), "36h");
  EXPECT_EQ(Span(90 * 60), "90m");
  EXPECT_EQ(Span(45), "45s");
}

TEST(NodesTableTest, TheTopNodesOneLineEach) {
  const std::vector<std::string> lines = Lines(NodesTable(Response(), kNow));
  ASSERT_EQ(lines.size(), 5u) << NodesTable(Response(), kNow);
  EXPECT_EQ(lines[0],
            "12 culprit nodes within 7d, the top 2 by lost rank-hours (node alert: 3 jobs within "
            "24h)");
  EXPECT_EQ(lines[1], "");
  EXPECT_EQ(Words(lines[2]),
            (std::vector<std::string>{"NODE", "JOBS", "IN", "24h", "EPISODES", "LOST", "RANK-H",
                                      "FIRST", "SEEN", "LAST", "SEEN", "ALERT"}));
  EXPECT_EQ(Words(lines[3]), (std::vector<std::string>{"gpu-17", "3", "3", "4", "41.2", "2d", "ago",
                                                       "1m", "ago", "firing"}));
  EXPECT_EQ(Words(lines[4]),
            (std::vector<std::string>{"a-much-longer-node-name.cluster.local", "1", "0", "1",
                                      "0.010", "3h", "ago", "3h", "ago", "-"}));
  // The columns line up under the longest name: only the last column's width differs.
  EXPECT_EQ(lines[2].size(), lines[4].size() + std::string("ALERT").size() - 1);
  EXPECT_EQ(lines[3].size(), lines[4].size() + std::string("firing").size() - 1);
}

TEST(NodesTableTest, AnEmptyOrIncompleteViewSaysSo) {
  v1::ListNodesResponse n = Response();
  n.clear_nodes();
  n.set_nodes_total(0);
  n.set_complete(false);
  EXPECT_EQ(NodesTable(n, kNow),
            "0 culprit nodes within 7d (node alert: 3 jobs within 24h; the daemon is still "
            "reading the nodes topic: incomplete)\n");
}

TEST(NodesTableTest, ANodeWithALinePerJob) {
  v1::ListNodesResponse n = Response();
  n.mutable_nodes()->DeleteSubrange(1, 1);
  v1::NodeRecord* r = n.mutable_nodes(0);
  for (int j = 0; j < 2; ++j) {
    v1::NodeJob* job = r->add_by_job();
    job->set_training_job(j == 0 ? "research/llama-70b" : "bert");
    if (j == 0) job->set_namespace_("research");
    job->set_episodes(j + 1);
    job->set_lost_rank_seconds(j == 0 ? 40 * 3600 : 1.2 * 3600);
    job->add_ranks(9);
    if (j == 1) job->add_ranks(14);
    job->set_first_unix_ns(kNow - (j + 1) * 3600 * kS);
    job->set_last_unix_ns(kNow - 90 * kS);
    job->set_firing(j == 0);
  }
  const std::string text = NodeDetail(n, kNow);
  const std::vector<std::string> lines = Lines(text);
  ASSERT_EQ(lines.size(), 7u) << text;
  EXPECT_EQ(lines[0],
            "node gpu-17: culprit in 3 jobs (3 within 24h), 4 episodes, 41.2 rank-hours lost");
  EXPECT_EQ(lines[1].rfind("first seen 2d ago (20", 0), 0u) << lines[1];
  EXPECT_NE(lines[1].find("), last seen 1m ago (20"), std::string::npos) << lines[1];
  EXPECT_EQ(lines[2], "node alert: FIRING (fires at 3 jobs within 24h)");
  EXPECT_EQ(Words(lines[4]),
            (std::vector<std::string>{"JOB", "NAMESPACE", "RANKS", "EPISODES", "LOST", "RANK-H",
                                      "FIRST", "SEEN", "LAST", "SEEN", "FIRING"}));
  EXPECT_EQ(Words(lines[5]), (std::vector<std::string>{"research/llama-70b", "research", "9", "1",
                                                       "40.0", "1h", "ago", "1m", "ago", "yes"}));
  EXPECT_EQ(Words(lines[6]), (std::vector<std::string>{"bert", "-", "9,14", "2", "1.20", "2h",
                                                       "ago", "1m", "ago", "-"}));
}

}  // namespace
}  // namespace rankwatch
