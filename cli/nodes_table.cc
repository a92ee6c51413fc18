#include "cli/nodes_table.h"

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <ctime>

namespace rankwatch {
namespace {

void Append(std::string* out, const char* format, ...) __attribute__((format(printf, 2, 3)));
void Append(std::string* out, const char* format, ...) {
  char buf[1024];
  va_list args;
  va_start(args, format);
  const int n = std::vsnprintf(buf, sizeof(buf), format, args);
  va_end(args);
  if (n > 0) out->append(buf, std::min<size_t>(static_cast<size_t>(n), sizeof(buf) - 1));
}

// "2026-11-27T14:02:11Z"; "-" when unset.
std::string Utc(int64_t unix_ns) {
  if (unix_ns == 0) return "-";
  const std::time_t t = static_cast<std::time_t>(unix_ns / 1'000'000'000);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char when[32];
  std::strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return when;
}

std::string Ranks(const v1::NodeJob& j) {
  std::string out;
  for (uint32_t r : j.ranks()) {
    if (!out.empty()) out += ",";
    out += std::to_string(r);
  }
  return out.empty() ? "-" : out;
}

// The node alert's rule and whether the view is complete: "3 jobs within 24h".
std::string Rule(const v1::ListNodesResponse& n) {
  std::string out =
      std::to_string(n.alert_jobs()) + " jobs within " + Span(n.alert_window_seconds());
  if (!n.complete()) out += "; the daemon is still reading the nodes topic: incomplete";
  return out;
}

}  // namespace

std::string Ago(int64_t then_unix_ns, int64_t now_unix_ns) {
  if (then_unix_ns == 0) return "-";
  const int64_t s = (now_unix_ns - then_unix_ns) / 1'000'000'000;
  if (s < 1) return "now";
  if (s < 60) return std::to_string(s) + "s ago";
  if (s < 3600) return std::to_string(s / 60) + "m ago";
  if (s < 86400) return std::to_string(s / 3600) + "h ago";
  return std::to_string(s / 86400) + "d ago";
}

std::string RankHours(double rank_seconds) {
  if (rank_seconds <= 0) return "0";
  const double h = rank_seconds / 3600;
  if (h < 0.0005) return "<0.001";
  char buf[32];
  std::snprintf(buf, sizeof(buf),
                h >= 100  ? "%.0f"
                : h >= 10 ? "%.1f"
                : h >= 1  ? "%.2f"
                          : "%.3f",
                h);
  return buf;
}

std::string Span(int64_t seconds) {
  if (seconds >= 3 * 86400 && seconds % 86400 == 0) return std::to_string(seconds / 86400) + "d";
  if (seconds > 0 && seconds % 3600 == 0) return std::to_string(seconds / 3600) + "h";
  if (seconds > 0 && seconds % 60 == 0) return std::to_string(seconds / 60) + "m";
  return std::to_string(seconds) + "s";
}

std::string NodesTable(const v1::ListNodesResponse& n, int64_t now) {
  std::string out;
  Append(&out, "%u culprit node%s within %s", n.nodes_total(), n.nodes_total() == 1 ? "" : "s",
         Span(n.horizon_seconds()).c_str());
  if (static_cast<uint32_t>(n.nodes_size()) < n.nodes_total()) {
    Append(&out, ", the top %d by lost rank-hours", n.nodes_size());
  }
  out += " (node alert: " + Rule(n) + ")\n";
  if (n.nodes_size() == 0) return out;
  int width = 4;
  for (const v1::NodeRecord& r : n.nodes()) {
    width = std::max(width, std::min(40, static_cast<int>(r.node().size())));
  }
  const std::string window = "IN " + Span(n.alert_window_seconds());
  Append(&out, "\n%-*s %5s %7s %8s %11s %10s %10s  %s\n", width, "NODE", "JOBS", window.c_str(),
         "EPISODES", "LOST RANK-H", "FIRST SEEN", "LAST SEEN", "ALERT");
  for (const v1::NodeRecord& r : n.nodes()) {
    Append(&out, "%-*s %5u %7u %8u %11s %10s %10s  %s\n", width, r.node().c_str(), r.jobs(),
           r.jobs_in_alert_window(), r.episodes(), RankHours(r.lost_rank_seconds()).c_str(),
           Ago(r.first_unix_ns(), now).c_str(), Ago(r.last_unix_ns(), now).c_str(),
           r.alert_firing() ? "firing" : "-");
  }
  return out;
}

std::string NodeDetail(const v1::ListNodesResponse& n, int64_t now) {
  const v1::NodeRecord& r = n.nodes(0);
  std::string out;
  Append(&out, "node %s: culprit in %u job%s (%u within %s), %u episode%s, %s rank-hours lost\n",
         r.node().c_str(), r.jobs(), r.jobs() == 1 ? "" : "s", r.jobs_in_alert_window(),
         Span(n.alert_window_seconds()).c_str(), r.episodes(), r.episodes() == 1 ? "" : "s",
         RankHours(r.lost_rank_seconds()).c_str());
  Append(&out, "first seen %s (%s), last seen %s (%s)\n", Ago(r.first_unix_ns(), now).c_str(),
         Utc(r.first_unix_ns()).c_str(), Ago(r.last_unix_ns(), now).c_str(),
         Utc(r.last_unix_ns()).c_str());
  out += std::string("node alert: ") + (r.alert_firing() ? "FIRING" : "not firing") +
         " (fires at " + Rule(n) + ")\n";
  if (r.by_job_size() == 0) return out;
  int width = 3;
  int ns_width = 9;
  for (const v1::NodeJob& j : r.by_job()) {
    width = std::max(width, std::min(48, static_cast<int>(j.training_job().size())));
    ns_width = std::max(ns_width, std::min(32, static_cast<int>(j.namespace_().size())));
  }
  Append(&out, "\n%-*s %-*s %-12s %8s %11s %10s %10s  %s\n", width, "JOB", ns_width, "NAMESPACE",
         "RANKS", "EPISODES", "LOST RANK-H", "FIRST SEEN", "LAST SEEN", "FIRING");
  for (const v1::NodeJob& j : r.by_job()) {
    Append(&out, "%-*s %-*s %-12s %8u %11s %10s %10s  %s\n", width, j.training_job().c_str(),
           ns_width, j.namespace_().empty() ? "-" : j.namespace_().c_str(), Ranks(j).c_str(),
           j.episodes(), RankHours(j.lost_rank_seconds()).c_str(),
           Ago(j.first_unix_ns(), now).c_str(), Ago(j.last_unix_ns(), now).c_str(),
           j.firing() ? "yes" : "-");
  }
  return out;
}

}  // namespace rankwatch
