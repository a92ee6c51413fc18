#include "sinks/capture_store.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <unordered_map>

#include "operators/capture_compare.h"
#include "operators/step_time_diagnosis.h"

namespace rankwatch {
namespace {

constexpr int64_t kSecond = 1'000'000'000;

bool Finished(v1::CaptureState s) {
  return s == v1::CAPTURE_DONE || s == v1::CAPTURE_FAILED || s == v1::CAPTURE_EXPIRED;
}

std::string RankList(const std::vector<uint32_t>& ranks) {
  std::string out;
  for (uint32_t r : ranks) out += (out.empty() ? "" : ", ") + std::to_string(r);
  return out;
}

// A rank's mean of `phase` over the window; NaN when unknown.
double MeanOf(const JobSnapshot& s, uint32_t rank, Phase phase) {
  if (!s.rank_totals || rank >= s.rank_totals->size()) return std::nan("");
  return WindowMean((*s.rank_totals)[rank], phase);
}

// A rank's own compute per step: forward + backward + optimizer (or forward_backward) minus its
// time in collectives; NaN when it reports none of them.
double ComputeOf(const JobSnapshot& s, uint32_t rank) {
  double sum = 0;
  bool any = false;
  for (Phase p : {Phase::kForward, Phase::kBackward, Phase::kOptimizer, Phase::kForwardBackward}) {
    const double m = MeanOf(s, rank, p);
    if (!std::isnan(m)) {
      sum += m;
      any = true;
    }
  }
  if (!any) return std::nan("");
  const double collective = MeanOf(s, rank, Phase::kCollective);
  return std::isnan(collective) ? sum : sum - collective;
}

}  // namespace

CaptureStore::CaptureStore(CaptureStoreOptions options, Sender send)
    : options_(std::move(options)), send_(std::move(send)) {}

std::optional<std::pair<uint32_t, uint32_t>> CaptureStore::CulpritAndReference(
    const JobSnapshot& s) {
  if (s.step.culprit_ranks.empty() || s.world_size < 2) return std::nullopt;
  const uint32_t culprit = s.step.culprit_ranks.front();
  std::vector<std::pair<double, uint32_t>> typical;  // (compute time, rank), non-culprits
  for (uint32_t r = 0; r < s.world_size; ++r) {
    if (std::find(s.step.culprit_ranks.begin(), s.step.culprit_ranks.end(), r) !=
        s.step.culprit_ranks.end()) {
      continue;
    }
    double t = ComputeOf(s, r);
    if (std::isnan(t)) t = MeanOf(s, r, Phase::kStep);
    if (!std::isnan(t)) typical.emplace_back(t, r);
  }
  if (typical.empty()) {
    // No per-rank figures: any rank that is not a culprit.
    for (uint32_t r = 0; r < s.world_size; ++r) {
      if (r != culprit) return std::make_pair(culprit, r);
    }
    return std::nullopt;
  }
  std::nth_element(typical.begin(), typical.begin() + typical.size() / 2, typical.end());
  return std::make_pair(culprit, typical[typical.size() / 2].second);
}

absl::StatusOr<v1::Capture> CaptureStore::Request(
    const std::string& job, std::vector<uint32_t> ranks, int32_t culprit, int32_t reference,
    uint32_t steps, const std::string& requested_by, const std::string& alert_id,
    const JobSnapshot* snapshot, int64_t now_unix_ns) {
  if (job.empty()) return absl::InvalidArgumentError("no training job");
  if (steps == 0) steps = options_.default_steps;
  if (steps > options_.max_steps) {
    return absl::InvalidArgumentError("a capture of " + std::to_string(steps) + " steps; at most " +
                                      std::to_string(options_.max_steps));
  }
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  if (ranks.empty()) return absl::InvalidArgumentError("no ranks to capture");
  if (ranks.size() > 1024) return absl::InvalidArgumentError("more than 1,024 ranks");
  if (snapshot != nullptr && ranks.back() >= snapshot->world_size) {
    return absl::InvalidArgumentError("training job '" + job + "' has " +
                                      std::to_string(snapshot->world_size) + " ranks, not " +
                                      std::to_string(ranks.back() + 1));
  }
  auto among = [&](int32_t r) {
    return r < 0 || std::binary_search(ranks.begin(), ranks.end(), static_cast<uint32_t>(r));
  };
  if (!among(culprit) || !among(reference)) {
    return absl::InvalidArgumentError("the compared ranks must be among the ranks captured");
  }

  v1::Capture c;
  v1::ControlRequest request;
  {
    std::lock_guard<std::mutex> lock(mu_);
    MakeRoom();
    if (captures_.size() >= options_.max_captures) {
      return absl::ResourceExhaustedError(std::to_string(captures_.size()) +
                                          " captures are still running");
    }
    c.set_id("cap-" + std::to_string(now_unix_ns / 1'000'000) + "-" + std::to_string(++sequence_));
  }
  c.set_training_job(job);
  c.set_state(v1::CAPTURE_REQUESTED);
  c.set_requested_by(requested_by);
  c.set_requested_unix_ns(now_unix_ns);
  c.set_deadline_unix_ns(now_unix_ns + options_.answer_deadline.count() * kSecond);
  c.set_steps(steps);
  c.set_culprit_rank(culprit);
  c.set_reference_rank(reference);
  c.set_alert_id(alert_id);
  double slowest_step_s = 0;
  for (uint32_t r : ranks) {
    v1::CaptureRank* cr = c.add_ranks();
    cr->set_rank(r);
    cr->set_role(static_cast<int32_t>(r) == culprit     ? "culprit"
                 : static_cast<int32_t>(r) == reference ? "reference"
                                                        : "");
    cr->set_first_step(-1);
    if (snapshot != nullptr) {
      cr->set_node(snapshot->NodeOf(r));
      const double step_s = MeanOf(*snapshot, r, Phase::kStep);
      if (!std::isnan(step_s)) {
        cr->set_step_seconds_before(step_s);
        slowest_step_s = std::max(slowest_step_s, step_s);
      }
    }
  }
  request.set_id(c.id());
  request.set_training_job(job);
  for (uint32_t r : ranks) request.add_ranks(r);
  request.set_issued_unix_ns(now_unix_ns);
  request.set_deadline_unix_ns(c.deadline_unix_ns());
  request.set_requested_by(requested_by.substr(0, 256));
  request.mutable_capture()->set_steps(steps);
  if (absl::Status s = send_(job, request.SerializeAsString()); !s.ok()) return s;

  Entry e;
  e.capture = c;
  // The ranks start before the deadline, then need their steps, profiled (slower): three times
  // the steps at the slowest rank's step time, at least a minute.
  e.finish_by_unix_ns =
      c.deadline_unix_ns() +
      std::max<int64_t>(60 * kSecond, static_cast<int64_t>(3.0 * steps * slowest_step_s * kSecond));
  for (int i = 0; i < c.ranks_size(); ++i) e.index_of_rank[c.ranks(i).rank()] = i;
  {
    std::lock_guard<std::mutex> lock(mu_);
    order_.push_back(c.id());
    captures_.emplace(c.id(), std::move(e));
  }
  spdlog::info("capture {} of training job '{}': ranks {}, {} steps ({})", c.id(), job,
               RankList(ranks), steps, requested_by);
  return c;
}

void CaptureStore::OnBatch(const v1::Batch& batch) {
  const bool events = !batch.trace().capture_id().empty();
  if (batch.control_replies_size() == 0 && !events) return;
  const uint32_t rank = batch.source().rank();
  std::lock_guard<std::mutex> lock(mu_);
  if (events) {
    auto it = captures_.find(batch.trace().capture_id());
    if (it != captures_.end() &&
        it->second.capture.training_job() == batch.source().training_job()) {
      Entry& e = it->second;
      auto at = e.index_of_rank.find(rank);
      if (at != e.index_of_rank.end()) {
        v1::CaptureRank* cr = e.capture.mutable_ranks(at->second);
        v1::CaptureTrace& t = e.traces[rank];
        t.set_rank(rank);
        // The batch's string indexes, remapped into the trace's own table.
        std::unordered_map<uint32_t, uint32_t> remap;
        auto name = [&](uint32_t i) -> uint32_t {
          if (i == 0 || static_cast<int>(i) >= batch.strings_size()) return 0;
          auto [r, added] = remap.emplace(i, 0);
          if (added) {
            if (t.names_size() == 0) t.add_names("");
            r->second = t.names_size();
            t.add_names(batch.strings(i));
          }
          return r->second;
        };
        for (const v1::KernelEvent& k : batch.kernels()) {
          if (static_cast<size_t>(t.events_size()) >= options_.max_events_per_rank) break;
          v1::KernelEvent* copy = t.add_events();
          *copy = k;
          copy->set_name(name(k.name()));
          copy->set_category(name(k.category()));
          cr->set_events_received(cr->events_received() + 1);
        }
        Settle(e);
      }
    }
  }
  for (const v1::ControlReply& reply : batch.control_replies()) {
    auto it = captures_.find(reply.request_id());
    if (it == captures_.end() ||
        it->second.capture.training_job() != batch.source().training_job()) {
      continue;  // an unknown request (another daemon's, or one this daemon forgot)
    }
    Entry& e = it->second;
    auto at = e.index_of_rank.find(rank);
    if (at == e.index_of_rank.end()) continue;
    v1::CaptureRank* cr = e.capture.mutable_ranks(at->second);
    // An answer never moves a rank back (ACCEPTED arriving after DONE, say).
    if (cr->state() == v1::CONTROL_DONE || cr->state() == v1::CONTROL_REFUSED ||
        cr->state() == v1::CONTROL_FAILED) {
      continue;
    }
    cr->set_state(reply.state());
    cr->set_reason(reply.reason());
    if (reply.state() == v1::CONTROL_DONE || reply.state() == v1::CONTROL_FAILED) {
      cr->set_first_step(reply.first_step());
      cr->set_steps(reply.steps());
      cr->set_events_expected(reply.events());
      if (reply.steps() > 0) {
        cr->set_profiled_step_seconds(static_cast<double>(reply.profiled_step_ns()) * 1e-9 /
                                      reply.steps());
      }
    }
    Settle(e);
  }
}

void CaptureStore::Settle(Entry& e) {
  v1::Capture& c = e.capture;
  if (Finished(c.state())) return;
  bool all_done = true, any_started = false;
  for (const v1::CaptureRank& r : c.ranks()) {
    if (r.state() == v1::CONTROL_REFUSED || r.state() == v1::CONTROL_FAILED) {
      c.set_state(v1::CAPTURE_FAILED);
      c.set_reason("rank " + std::to_string(r.rank()) +
                   (r.state() == v1::CONTROL_REFUSED ? " refused: " : " failed: ") + r.reason());
      spdlog::warn("capture {} of training job '{}': {}", c.id(), c.training_job(), c.reason());
      return;
    }
    if (r.state() != v1::CONTROL_STATE_UNSPECIFIED) any_started = true;
    if (r.state() != v1::CONTROL_DONE) all_done = false;
  }
  if (!all_done) {
    if (any_started) c.set_state(v1::CAPTURE_RUNNING);
    return;
  }
  c.set_state(v1::CAPTURE_DONE);
  std::string missing;
  for (const v1::CaptureRank& r : c.ranks()) {
    if (r.events_received() < r.events_expected()) {
      missing += (missing.empty() ? "" : "; ") + std::string("rank ") + std::to_string(r.rank()) +
                 ": " + std::to_string(r.events_received()) + " of " +
                 std::to_string(r.events_expected()) + " events arrived";
    }
  }
  c.set_reason(missing);
  if (c.culprit_rank() >= 0 && c.reference_rank() >= 0) {
    auto profile = [&](uint32_t rank) {
      std::vector<CapturedEvent> events;
      auto it = e.traces.find(rank);
      if (it != e.traces.end()) {
        const v1::CaptureTrace& t = it->second;
        events.reserve(t.events_size());
        for (const v1::KernelEvent& k : t.events()) {
          CapturedEvent ev;
          ev.name = static_cast<int>(k.name()) < t.names_size() ? t.names(k.name()) : "";
          ev.category =
              static_cast<int>(k.category()) < t.names_size() ? t.names(k.category()) : "";
          ev.ts_ns = k.ts_ns();
          ev.dur_ns = k.dur_ns();
          ev.tid = k.tid() != 0 ? k.tid() : static_cast<uint64_t>(k.stream());
          ev.step = k.step();
          events.push_back(std::move(ev));
        }
      }
      return BuildCaptureProfile(std::move(events));
    };
    const CaptureProfile culprit = profile(static_cast<uint32_t>(c.culprit_rank()));
    const CaptureProfile reference = profile(static_cast<uint32_t>(c.reference_rank()));
    for (const OpComparison& row : CompareCaptures(culprit, reference, options_.comparison_rows)) {
      v1::CaptureOp* op = c.add_comparison();
      op->set_name(row.name);
      op->set_phase(CapturePhaseName(row.phase));
      op->set_culprit_seconds_per_step(row.culprit_seconds_per_step);
      op->set_reference_seconds_per_step(row.reference_seconds_per_step);
      op->set_excess_seconds_per_step(row.excess_seconds_per_step);
      op->set_culprit_calls_per_step(row.culprit_calls_per_step);
      op->set_reference_calls_per_step(row.reference_calls_per_step);
    }
  }
  if (c.comparison_size() > 0) {
    const v1::CaptureOp& top = c.comparison(0);
    spdlog::info(
        "capture {} of training job '{}' done: rank {} spends {:.1f} ms more per step than rank "
        "{} in {} ({})",
        c.id(), c.training_job(), c.culprit_rank(), top.excess_seconds_per_step() * 1e3,
        c.reference_rank(), top.name(), top.phase());
  } else {
    spdlog::info("capture {} of training job '{}' done", c.id(), c.training_job());
  }
}

void CaptureStore::OnAlert(const v1::Alert& alert, const JobSnapshot* snapshot,
                           int64_t now_unix_ns) {
  if (!options_.auto_capture || alert.kind() != v1::ALERT_STRAGGLER ||
      alert.state() != v1::ALERT_FIRING || snapshot == nullptr) {
    return;
  }
  const std::string& job = alert.training_job();
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = last_auto_unix_ns_.find(job);
    if (it != last_auto_unix_ns_.end() &&
        now_unix_ns - it->second < options_.auto_interval.count() * kSecond) {
      return;
    }
    last_auto_unix_ns_[job] = now_unix_ns;
    if (last_auto_unix_ns_.size() > 4 * options_.max_captures) {
      // Forget the jobs whose interval is over: they could capture again anyway.
      for (auto j = last_auto_unix_ns_.begin(); j != last_auto_unix_ns_.end();) {
        j = now_unix_ns - j->second >= options_.auto_interval.count() * kSecond
                ? last_auto_unix_ns_.erase(j)
                : std::next(j);
      }
    }
  }
  const auto pair = CulpritAndReference(*snapshot);
  if (!pair) return;
  auto c = Request(job, {pair->first, pair->second}, static_cast<int32_t>(pair->first),
                   static_cast<int32_t>(pair->second), 0, "straggler alert " + alert.id(),
                   alert.id(), snapshot, now_unix_ns);
  if (!c.ok()) {
    spdlog::warn("training job '{}': no automatic capture for alert {}: {}", job, alert.id(),
                 std::string(c.status().message()));
  }
}

void CaptureStore::Expire(int64_t now_unix_ns) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [id, e] : captures_) {
    v1::Capture& c = e.capture;
    if (Finished(c.state())) continue;
    std::vector<uint32_t> silent, unfinished;
    for (const v1::CaptureRank& r : c.ranks()) {
      if (r.state() == v1::CONTROL_STATE_UNSPECIFIED) silent.push_back(r.rank());
      if (r.state() == v1::CONTROL_ACCEPTED) unfinished.push_back(r.rank());
    }
    std::string reason;
    if (!silent.empty() && now_unix_ns > c.deadline_unix_ns()) {
      reason = "no answer from rank" + std::string(silent.size() > 1 ? "s " : " ") +
               RankList(silent) + " before the request's deadline";
    } else if (now_unix_ns > e.finish_by_unix_ns) {
      reason = "rank" + std::string(unfinished.size() > 1 ? "s " : " ") + RankList(unfinished) +
               " accepted but did not finish in time";
    }
    if (reason.empty()) continue;
    c.set_state(v1::CAPTURE_EXPIRED);
    c.set_reason(reason);
    spdlog::warn("capture {} of training job '{}' expired: {}", id, c.training_job(), reason);
  }
}

void CaptureStore::MakeRoom() {
  // The oldest finished captures go first; running ones stay.
  for (auto it = order_.begin(); captures_.size() >= options_.max_captures && it != order_.end();) {
    auto c = captures_.find(*it);
    if (c != captures_.end() && Finished(c->second.capture.state())) {
      captures_.erase(c);
      it = order_.erase(it);
    } else {
      ++it;
    }
  }
}

std::optional<v1::Capture> CaptureStore::Get(const std::string& id,
                                             std::vector<v1::CaptureTrace>* traces) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = captures_.find(id);
  if (it == captures_.end()) return std::nullopt;
  if (traces != nullptr) {
    for (const auto& [rank, t] : it->second.traces) traces->push_back(t);
  }
  return it->second.capture;
}

std::vector<v1::Capture> CaptureStore::List(const std::string& job) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<v1::Capture> out;
  for (auto it = order_.rbegin(); it != order_.rend(); ++it) {
    auto c = captures_.find(*it);
    if (c == captures_.end()) continue;
    if (job.empty() || c->second.capture.training_job() == job) out.push_back(c->second.capture);
  }
  return out;
}

std::optional<v1::Capture> CaptureStore::LatestComparison(const std::string& job, int rows) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = order_.rbegin(); it != order_.rend(); ++it) {
    auto c = captures_.find(*it);
    if (c == captures_.end() || c->second.capture.training_job() != job) continue;
    const v1::Capture& capture = c->second.capture;
    if (capture.state() != v1::CAPTURE_DONE || capture.comparison_size() == 0) continue;
    v1::Capture out = capture;
    if (out.comparison_size() > rows) {
      out.mutable_comparison()->DeleteSubrange(rows, out.comparison_size() - rows);
    }
    return out;
  }
  return std::nullopt;
}

}  // namespace rankwatch
