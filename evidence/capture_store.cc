#include "evidence/capture_store.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <unordered_map>

#include "evidence/capture_ranks.h"
#include "operators/capture_compare.h"

namespace rankwatch {
namespace {

bool Finished(v1::CaptureState s) {
  return s == v1::CAPTURE_DONE || s == v1::CAPTURE_FAILED || s == v1::CAPTURE_EXPIRED;
}

std::string RankList(const std::vector<uint32_t>& ranks) {
  std::string out;
  for (uint32_t r : ranks) out += (out.empty() ? "" : ", ") + std::to_string(r);
  return out;
}

}  // namespace

CaptureStore::CaptureStore(CaptureStoreOptions options, Sender send)
    : options_(std::move(options)),
      send_(std::move(send)),
      requests_("cap", options_.answer_deadline) {}

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

  v1::ControlRequest request;
  {
    std::lock_guard<std::mutex> lock(mu_);
    MakeRoom();
    if (captures_.size() >= options_.max_captures) {
      return absl::ResourceExhaustedError(std::to_string(captures_.size()) +
                                          " captures are still running");
    }
    request = requests_.Open(job, ranks, now_unix_ns);
  }
  request.set_requested_by(requested_by.substr(0, 256));
  request.mutable_capture()->set_steps(steps);
  v1::Capture c;
  c.set_id(request.id());
  c.set_training_job(job);
  c.set_state(v1::CAPTURE_REQUESTED);
  c.set_requested_by(requested_by);
  c.set_requested_unix_ns(now_unix_ns);
  c.set_deadline_unix_ns(request.deadline_unix_ns());
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
      const double step_s = RankMeanSeconds(*snapshot, r, Phase::kStep);
      if (!std::isnan(step_s)) {
        cr->set_step_seconds_before(step_s);
        slowest_step_s = std::max(slowest_step_s, step_s);
      }
    }
  }
  if (absl::Status s = send_(job, request.SerializeAsString()); !s.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    requests_.Close(request.id());
    return s;
  }

  Entry e;
  e.capture = c;
  // The ranks start before the deadline, then need their steps, profiled (slower): three times
  // the steps at the slowest rank's step time, at least a minute.
  const int64_t minute_ns = std::chrono::nanoseconds(std::chrono::minutes(1)).count();
  e.finish_by_unix_ns =
      c.deadline_unix_ns() +
      std::max<int64_t>(minute_ns, static_cast<int64_t>(3.0 * steps * slowest_step_s * 1e9));
  for (int i = 0; i < c.ranks_size(); ++i) e.index_of_rank[c.ranks(i).rank()] = i;
  e.busy_for_ns = static_cast<int64_t>(3.0 * steps * slowest_step_s * 1e9) +
                  std::chrono::nanoseconds(std::chrono::seconds(30)).count();
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
    // Replies to unknown requests (another daemon's, or one this daemon forgot), of another
    // job, from ranks not asked, or after the rank's last word are ignored.
    const ControlRequestTracker::Request* request =
        requests_.Apply(batch.source().training_job(), rank, reply);
    if (request == nullptr) continue;
    auto it = captures_.find(request->id);
    if (it == captures_.end()) continue;  // its request is still being sent
    Entry& e = it->second;
    auto at = e.index_of_rank.find(rank);
    if (at == e.index_of_rank.end()) continue;
    v1::CaptureRank* cr = e.capture.mutable_ranks(at->second);
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
  const int64_t interval_ns = std::chrono::nanoseconds(options_.auto_interval).count();
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = last_auto_unix_ns_.find(job);
    if (it != last_auto_unix_ns_.end() && now_unix_ns - it->second < interval_ns) {
      return;
    }
    last_auto_unix_ns_[job] = now_unix_ns;
    if (last_auto_unix_ns_.size() > 4 * options_.max_captures) {
      // Forget the jobs whose interval is over: they could capture again anyway.
      for (auto j = last_auto_unix_ns_.begin(); j != last_auto_unix_ns_.end();) {
        j = now_unix_ns - j->second >= interval_ns ? last_auto_unix_ns_.erase(j) : std::next(j);
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

void CaptureStore::OnTick(const TickView& tick, std::vector<v1::Alert>* alerts) {
  // The job's newest comparison goes into each alert's evidence; a straggler alert that fires
  // may ask its culprit and a typical rank for a new capture.
  for (v1::Alert& a : *alerts) {
    if (!a.has_evidence()) continue;
    if (auto c = LatestComparison(a.training_job(), kEvidenceCaptureRows)) {
      *a.mutable_evidence()->mutable_capture() = std::move(*c);
    }
  }
  for (const v1::Alert& a : *alerts) {
    auto it = tick.latest->find(a.training_job());
    OnAlert(a, it == tick.latest->end() ? nullptr : it->second.get(), tick.now_unix_ns);
  }
  Expire(tick.now_unix_ns);
}

void CaptureStore::Expire(int64_t now_unix_ns) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [id, e] : captures_) {
    v1::Capture& c = e.capture;
    if (Finished(c.state())) continue;
    for (const v1::CaptureRank& r : c.ranks()) {
      if (r.state() == v1::CONTROL_ACCEPTED) e.accepted_seen_unix_ns.emplace(r.rank(), now_unix_ns);
    }
    const ControlRequestTracker::Request* request = requests_.Find(id);
    if (request == nullptr) {
      // Requests close only when their captures are dropped.
      spdlog::critical("capture {} has no open request", id);
      std::abort();
    }
    const std::vector<uint32_t> silent = request->RanksIn(v1::CONTROL_STATE_UNSPECIFIED);
    const std::vector<uint32_t> unfinished = request->RanksIn(v1::CONTROL_ACCEPTED);
    std::string reason;
    if (!silent.empty() && request->PastDeadline(now_unix_ns)) {
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

std::vector<uint32_t> CaptureStore::BusyRanks(const std::string& job, int64_t now_unix_ns) const {
  std::vector<uint32_t> busy;
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [id, e] : captures_) {
    const v1::Capture& c = e.capture;
    if (c.training_job() != job || Finished(c.state()) || now_unix_ns > e.finish_by_unix_ns) {
      continue;
    }
    for (const v1::CaptureRank& r : c.ranks()) {
      if (r.state() != v1::CONTROL_ACCEPTED) continue;
      const auto seen = e.accepted_seen_unix_ns.find(r.rank());
      // Not yet seen by a tick: it accepted since the last one.
      if (seen == e.accepted_seen_unix_ns.end() || now_unix_ns < seen->second + e.busy_for_ns) {
        busy.push_back(r.rank());
      }
    }
  }
  std::sort(busy.begin(), busy.end());
  busy.erase(std::unique(busy.begin(), busy.end()), busy.end());
  return busy;
}

void CaptureStore::MakeRoom() {
  // The oldest finished captures go first; running ones stay.
  for (auto it = order_.begin(); captures_.size() >= options_.max_captures && it != order_.end();) {
    auto c = captures_.find(*it);
    if (c != captures_.end() && Finished(c->second.capture.state())) {
      requests_.Close(c->first);
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
