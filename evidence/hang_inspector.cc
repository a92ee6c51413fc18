#include "evidence/hang_inspector.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <set>
#include <utility>

#include "common/rank_ranges.h"
#include "operators/step_time_diagnosis.h"

namespace rankwatch {
namespace {

// "rank 3", "ranks 0–2, 4, 6–7" (an en dash in runs)
std::string Ranks(const std::vector<uint32_t>& sorted) {
  return (sorted.size() == 1 ? "rank " : "ranks ") + FormatRankRanges(sorted, {.dash = "\u2013"});
}

std::string Basename(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// Python's own files and installed libraries (torch, the rankwatch package): not the script's.
bool LibraryFile(const std::string& file) {
  if (file.empty() || file[0] == '<') return true;  // <frozen importlib._bootstrap>, <string>
  if (file.find("/site-packages/") != std::string::npos ||
      file.find("/dist-packages/") != std::string::npos ||
      file.find("/lib/python3") != std::string::npos) {
    return true;
  }
  static const char* const kOwn[] = {"/rankwatch/collector.py", "/rankwatch/torch_hooks.py",
                                     "/rankwatch/capture.py", "/rankwatch/stacks.py"};
  for (const char* own : kOwn) {
    const size_t n = std::char_traits<char>::length(own);
    if (file.size() >= n && file.compare(file.size() - n, n, own) == 0) return true;
  }
  return false;
}

std::string FrameText(const v1::StackFrame& f) {
  return Basename(f.file()) + ":" + std::to_string(f.line()) + " in " + f.function();
}

// "train.py:57 in load_shard", or "train.py:40 in step → tensor.py:396 in backward" when the
// thread is inside a library called from the script.
std::string Where(const v1::ThreadStack& t) {
  if (t.frames_size() == 0) return "(no frames)";
  const v1::StackFrame& inner = t.frames(t.frames_size() - 1);
  for (int i = t.frames_size() - 1; i >= 0; --i) {
    if (LibraryFile(t.frames(i).file())) continue;
    if (i == t.frames_size() - 1) return FrameText(inner);
    return FrameText(t.frames(i)) + " \u2192 \u2026 \u2192 " + FrameText(inner);
  }
  return FrameText(inner);
}

std::string StackKey(const v1::ThreadStack& t) {
  std::string key;
  for (const v1::StackFrame& f : t.frames()) {
    key += f.file();
    key += ':';
    key += std::to_string(f.line());
    key += ':';
    key += f.function();
    key += '\n';
  }
  return key;
}

// The thread that runs the training steps: the one marked so, else the main thread, else the
// first one.
const v1::ThreadStack* TrainingThread(const v1::ControlReply& r) {
  for (const v1::ThreadStack& t : r.stacks()) {
    if (t.training()) return &t;
  }
  for (const v1::ThreadStack& t : r.stacks()) {
    if (t.name() == "MainThread") return &t;
  }
  return r.stacks_size() > 0 ? &r.stacks(0) : nullptr;
}

}  // namespace

HangInspector::HangInspector(HangInspectorOptions options, Sender send)
    : options_(std::move(options)),
      send_(std::move(send)),
      requests_("stk", options_.answer_deadline) {}

HangInspector::Heard HangInspector::HeardOf(v1::ControlState state) {
  if (ControlRequestTracker::Final(state)) return Heard::kFinal;
  return state == v1::CONTROL_ACCEPTED ? Heard::kAlive : Heard::kNothing;
}

v1::HangStacks HangInspector::Summarize(const std::map<uint32_t, RankAnswer>& answers,
                                        const std::vector<v1::ThreadStack>& stacks,
                                        const std::vector<Heard>& heard) {
  v1::HangStacks out;
  out.set_ranks_asked(static_cast<uint32_t>(heard.size()));
  out.set_ranks_answered(static_cast<uint32_t>(answers.size()));

  // Groups by training-thread stack.
  std::map<int32_t, std::vector<uint32_t>> by_stack;
  for (const auto& [rank, a] : answers) by_stack[a.stack].push_back(rank);
  std::vector<std::pair<int32_t, std::vector<uint32_t>>> groups(by_stack.begin(), by_stack.end());
  std::stable_sort(groups.begin(), groups.end(), [](const auto& a, const auto& b) {
    if (a.second.size() != b.second.size()) return a.second.size() < b.second.size();
    return a.second.front() < b.second.front();
  });
  for (const auto& [index, ranks] : groups) {
    v1::StackGroup* g = out.add_groups();
    for (uint32_t r : ranks) g->add_ranks(r);
    if (index >= 0 && static_cast<size_t>(index) < stacks.size()) {
      const v1::ThreadStack& t = stacks[index];
      *g->mutable_frames() = t.frames();
      g->set_frames_omitted(t.frames_omitted());
      g->set_where(Where(t));
    } else {
      g->set_where(index == kOtherStack ? "(one of more stacks than are kept)"
                                        : "(no training thread in the answer)");
    }
    for (const v1::CollectiveCounter& c : answers.at(ranks.front()).collectives) {
      *g->add_collectives() = c;
    }
  }

  // Collective progress per process group: who never entered the collective the others are in.
  std::map<std::string, std::vector<std::pair<uint32_t, const v1::CollectiveCounter*>>> by_group;
  for (const auto& [rank, a] : answers) {
    for (const v1::CollectiveCounter& c : a.collectives) by_group[c.group()].emplace_back(rank, &c);
  }
  std::set<uint32_t> culprits;
  for (const auto& [name, counters] : by_group) {
    if (counters.size() < 2) continue;
    uint64_t most = 0;
    for (const auto& [rank, c] : counters) most = std::max(most, c->entered());
    v1::CollectiveProgress* p = out.add_collectives();
    p->set_group(name);
    p->set_entered(most);
    for (const auto& [rank, c] : counters) {
      if (c->entered() < most) {
        p->add_behind_ranks(rank);
        culprits.insert(rank);
      }
      if (c->entered() > c->completed()) p->add_waiting_ranks(rank);
    }
  }
  for (uint32_t r : culprits) out.add_culprit_ranks(r);

  std::vector<uint32_t> gone, silent;
  for (uint32_t r = 0; r < heard.size(); ++r) {
    if (heard[r] == Heard::kNothing) {
      gone.push_back(r);
    } else if (answers.find(r) == answers.end()) {
      silent.push_back(r);
    }
  }
  for (uint32_t r : gone) out.add_gone_ranks(r);
  for (uint32_t r : silent) out.add_silent_ranks(r);
  out.set_same_place(out.groups_size() == 1 && culprits.empty() && answers.size() >= 2);

  // One line, culprits first.
  std::vector<std::string> parts;
  if (!culprits.empty()) {
    const std::vector<uint32_t> c(culprits.begin(), culprits.end());
    std::vector<uint32_t> waiting;
    for (const v1::CollectiveProgress& p : out.collectives()) {
      if (p.behind_ranks_size() > 0)
        waiting.assign(p.waiting_ranks().begin(), p.waiting_ranks().end());
    }
    parts.push_back(Ranks(c) + " never entered the collective the others wait in" +
                    (waiting.empty() ? "" : " (" + Ranks(waiting) + " waiting)"));
  }
  if (!gone.empty()) {
    parts.push_back(Ranks(gone) + ": gone (no answer: not running, or cut off from Kafka)");
  }
  if (out.same_place()) {
    parts.push_back("every rank that answered is in the same place: " + out.groups(0).where() +
                    "; no rank is behind on collectives");
  } else {
    for (const v1::StackGroup& g : out.groups()) {
      const std::vector<uint32_t> r(g.ranks().begin(), g.ranks().end());
      parts.push_back(Ranks(r) + ": " + g.where());
    }
  }
  if (!silent.empty()) parts.push_back(Ranks(silent) + ": alive, no stacks");
  if (answers.empty() && gone.empty() && silent.empty()) parts.push_back("no rank was asked");
  std::string summary;
  for (const std::string& p : parts) summary += (summary.empty() ? "" : "; ") + p;
  out.set_summary(std::move(summary));
  return out;
}

void HangInspector::OnSnapshots(const std::vector<std::shared_ptr<const JobSnapshot>>& snapshots,
                                int64_t now_unix_ns) {
  std::vector<std::pair<std::string, v1::ControlRequest>> to_send;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& s : snapshots) {
      const std::string& job = s->training_job;
      auto it = inquiries_.find(job);
      // Progress is a step every rank completed: steps that aligned at their timeout with
      // ranks missing (the last steps of ranks that died) are not.
      const uint64_t complete = s->aligned_steps - std::min(s->aligned_steps, s->timed_out_steps);
      if (it != inquiries_.end() && it->second.complete_steps != complete) {
        Erase(it);
        it = inquiries_.end();
      }
      const bool hung = s->step.label == StepLabel::kHang && !s->finished && s->world_size > 0;
      if (!hung || it != inquiries_.end()) continue;  // asked for this hang already
      if (inquiries_.size() >= options_.max_inquiries) {
        // Room: the oldest settled inquiry goes; with none settled, this hang is not asked.
        auto oldest = inquiries_.end();
        for (auto i = inquiries_.begin(); i != inquiries_.end(); ++i) {
          if (i->second.settled &&
              (oldest == inquiries_.end() ||
               i->second.result.requested_unix_ns() < oldest->second.result.requested_unix_ns())) {
            oldest = i;
          }
        }
        if (oldest == inquiries_.end()) continue;
        Erase(oldest);
      }
      // Every rank: the request names none.
      v1::ControlRequest request = requests_.OpenToEveryRank(job, s->world_size, now_unix_ns);
      request.set_requested_by(
          "hang diagnosis (no step aligned for " +
          std::to_string(static_cast<int64_t>(s->step.seconds_since_last_aligned)) + " s)");
      request.mutable_stacks()->set_max_frames(options_.max_frames);
      Inquiry q;
      q.result.set_request_id(request.id());
      q.result.set_requested_unix_ns(now_unix_ns);
      q.result.set_aligned_steps(s->aligned_steps);
      q.result.set_ranks_asked(s->world_size);
      q.complete_steps = complete;
      inquiries_.emplace(job, std::move(q));
      to_send.emplace_back(job, std::move(request));
    }
  }
  for (auto& [job, request] : to_send) {
    absl::Status sent = send_(job, request.SerializeAsString());
    std::lock_guard<std::mutex> lock(mu_);
    auto it = inquiries_.find(job);
    if (sent.ok()) {
      ++counters_.requests;
      spdlog::info("training job '{}' is hung: asked its {} ranks for their stacks ({})", job,
                   it == inquiries_.end() ? 0 : it->second.result.ranks_asked(), request.id());
      continue;
    }
    ++counters_.send_failures;
    spdlog::warn("training job '{}' is hung: the stacks request could not be sent: {}", job,
                 std::string(sent.message()));
    requests_.Close(request.id());
    if (it != inquiries_.end() && it->second.result.request_id() == request.id()) {
      it->second.settled = true;
      it->second.result.set_settled_unix_ns(now_unix_ns);
      it->second.result.set_summary("the stacks request could not be sent: " +
                                    std::string(sent.message()));
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [job, q] : inquiries_) {
    if (q.settled) continue;
    const ControlRequestTracker::Request* request = requests_.Find(q.result.request_id());
    if (request == nullptr || request->AllFinal() || request->PastDeadline(now_unix_ns)) {
      Settle(q, now_unix_ns);
      settled_.push_back(job);
    }
  }
}

v1::HangStacks HangInspector::SummarizeOpen(const Inquiry& q) const {
  std::vector<Heard> heard(q.result.ranks_asked(), Heard::kNothing);
  if (const ControlRequestTracker::Request* request = requests_.Find(q.result.request_id())) {
    // The request addresses ranks 0 to ranks_asked - 1.
    for (size_t i = 0; i < request->ranks.size() && request->ranks[i] < heard.size(); ++i) {
      heard[request->ranks[i]] = HeardOf(request->states[i]);
    }
  }
  v1::HangStacks r = Summarize(q.answers, q.stacks, heard);
  r.set_request_id(q.result.request_id());
  r.set_requested_unix_ns(q.result.requested_unix_ns());
  r.set_aligned_steps(q.result.aligned_steps());
  return r;
}

void HangInspector::Settle(Inquiry& q, int64_t now_unix_ns) {
  v1::HangStacks r = SummarizeOpen(q);
  r.set_settled_unix_ns(now_unix_ns);
  if (r.ranks_answered() == r.ranks_asked()) {
    ++counters_.settled_all;
  } else {
    ++counters_.settled_partial;
  }
  // Later replies are ignored; the stacks are in the result now and the per-rank answers are
  // not needed any more.
  requests_.Close(q.result.request_id());
  q.result = std::move(r);
  q.settled = true;
  q.answers.clear();
  q.stacks.clear();
  q.stack_index.clear();
}

void HangInspector::Erase(std::map<std::string, Inquiry>::iterator it) {
  requests_.Close(it->second.result.request_id());
  inquiries_.erase(it);
}

void HangInspector::Forget(const std::string& job) {
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = inquiries_.find(job); it != inquiries_.end()) Erase(it);
  hang_alerts_.Forget(job);
}

void HangInspector::OnBatch(const v1::Batch& batch) {
  if (batch.control_replies_size() == 0) return;
  const uint32_t rank = batch.source().rank();
  std::lock_guard<std::mutex> lock(mu_);
  for (const v1::ControlReply& reply : batch.control_replies()) {
    // Replies to unknown or settled requests, of other jobs, from ranks out of range, or after
    // the rank's last word are ignored.
    const ControlRequestTracker::Request* request =
        requests_.Apply(batch.source().training_job(), rank, reply);
    if (request == nullptr || reply.state() != v1::CONTROL_DONE) continue;
    auto it = inquiries_.find(request->training_job);
    if (it == inquiries_.end() || it->second.result.request_id() != request->id) continue;
    Inquiry& q = it->second;
    RankAnswer a;
    a.collectives.assign(reply.collectives().begin(), reply.collectives().end());
    if (const v1::ThreadStack* t = TrainingThread(reply)) {
      std::string key = StackKey(*t);
      auto known = q.stack_index.find(key);
      if (known != q.stack_index.end()) {
        a.stack = known->second;
      } else if (q.stacks.size() < options_.max_groups) {
        a.stack = static_cast<int32_t>(q.stacks.size());
        q.stacks.push_back(*t);
        q.stack_index.emplace(std::move(key), a.stack);
      } else {
        a.stack = kOtherStack;
      }
    }
    q.answers.emplace(rank, std::move(a));
  }
}

void HangInspector::OnTick(const TickView& tick, std::vector<v1::Alert>* alerts) {
  OnSnapshots(*tick.evaluated, tick.now_unix_ns);
  for (const std::string& job : *tick.removed) Forget(job);
  std::lock_guard<std::mutex> lock(mu_);
  // A hang alert carries the stacks once they came.
  hang_alerts_.Attach(alerts, [this](const std::string& job, v1::Alert* a) {
    auto s = GetLocked(job);
    if (!s || s->settled_unix_ns() == 0) return false;
    *a->mutable_evidence()->mutable_hang_stacks() = std::move(*s);
    return true;
  });
  // Stacks that came after the job's hang alert was raised: the alert again, with them.
  const auto newer_stacks = [this](const std::string& job, v1::Alert* a) {
    auto s = GetLocked(job);
    if (!s) return false;
    const v1::Diagnosis& carried = a->evidence();
    if (carried.has_hang_stacks() && carried.hang_stacks().request_id() == s->request_id()) {
      return false;
    }
    *a->mutable_evidence()->mutable_hang_stacks() = std::move(*s);
    return true;
  };
  for (const std::string& job : std::exchange(settled_, {})) {
    hang_alerts_.Republish(job, tick.now_unix_ns, newer_stacks, alerts);
  }
}

std::optional<v1::HangStacks> HangInspector::Get(const std::string& job) const {
  std::lock_guard<std::mutex> lock(mu_);
  return GetLocked(job);
}

std::optional<v1::HangStacks> HangInspector::GetLocked(const std::string& job) const {
  auto it = inquiries_.find(job);
  if (it == inquiries_.end()) return std::nullopt;
  if (it->second.settled) return it->second.result;
  // Still awaiting answers: what is known so far.
  v1::HangStacks r = SummarizeOpen(it->second);
  r.set_summary("awaiting answers (" + std::to_string(r.ranks_answered()) + " of " +
                std::to_string(r.ranks_asked()) + " ranks so far): " + r.summary());
  return r;
}

std::vector<std::string> HangInspector::TakeSettled() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> out;
  out.swap(settled_);
  return out;
}

HangInspectorCounters HangInspector::counters() const {
  std::lock_guard<std::mutex> lock(mu_);
  return counters_;
}

}  // namespace rankwatch
