#include "runtime/job_router.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <type_traits>

#include "state/job_state_store.h"

namespace rankwatch {

static_assert(std::is_same_v<SnapshotStore::Map, JobSnapshotMap>,
              "tick hooks read the SnapshotStore's map as it is");

JobRouter::JobRouter(JobRouterOptions options, TaskSinks sinks)
    : options_(std::move(options)),
      sinks_(sinks),
      decoder_(options_.limits),
      lanes_(std::max<size_t>(1, options_.ingest_threads)),
      rejected_too_many_jobs_(sinks.metrics->rejected_too_many_jobs) {
  if (options_.ingest_threads > 1) {
    fork_join_ = std::make_unique<ForkJoin>(options_.ingest_threads - 1);
  }
}

JobRouter::~JobRouter() = default;

PartitionTask& JobRouter::TaskOf(int32_t partition) {
  std::unique_ptr<PartitionTask>& task = tasks_[partition];
  if (task == nullptr) task = std::make_unique<PartitionTask>(partition, &options_.task, &sinks_);
  return *task;
}

void JobRouter::HandleMessage(std::string_view payload, int32_t partition, int64_t offset,
                              TimePoint now, int64_t wall_now_unix_ns) {
  Lane& lane = lanes_[0];
  const RejectReason reason =
      decoder_.Decode(payload, &lane.batch, &lane.detail, wall_now_unix_ns, &lane.notes);
  if (reason == RejectReason::kNone) {
    Route(partition, lane, now, wall_now_unix_ns);
  } else {
    Rejected(reason, now, lane.detail);
  }
  // Rejected messages count too: they are consumed, and never read again.
  TaskOf(partition).Consumed(offset);
}

void JobRouter::HandleMessage(std::string_view payload, TimePoint now, int64_t wall_now_unix_ns) {
  Lane& lane = lanes_[0];
  const RejectReason reason =
      decoder_.Decode(payload, &lane.batch, &lane.detail, wall_now_unix_ns, &lane.notes);
  if (reason != RejectReason::kNone) {
    Rejected(reason, now, lane.detail);
    return;
  }
  Route(-1, lane, now, wall_now_unix_ns);
}

void JobRouter::HandleMessages(const std::vector<Message>& messages, TimePoint (*steady_now)(),
                               int64_t (*wall_now_unix_ns)()) {
  auto in_turn = [&] {
    for (const Message& m : messages) {
      HandleMessage(m.payload, m.partition, m.offset, steady_now(), wall_now_unix_ns());
    }
  };
  if (fork_join_ == nullptr) return in_turn();
  // Each partition's messages, in order; a partition's `done` are handled.
  struct Group {
    int32_t partition = 0;
    std::vector<const Message*> messages;
    size_t done = 0;
    bool one_by_one = false;  // left for after the threads
    PartitionTask* task = nullptr;
  };
  std::vector<Group> groups;  // in the order their partitions first came
  std::map<int32_t, size_t> group_of;
  std::map<std::string_view, size_t> group_of_key;
  for (const Message& m : messages) {
    auto [it, added] = group_of.try_emplace(m.partition, groups.size());
    if (added) groups.push_back({m.partition, {}, 0, false, nullptr});
    Group& g = groups[it->second];
    g.messages.push_back(&m);
    if (m.key.empty()) {
      g.one_by_one = true;
    } else if (auto [k, first] = group_of_key.try_emplace(m.key, it->second);
               !first && k->second != it->second) {
      g.one_by_one = groups[k->second].one_by_one = true;
    }
  }
  std::vector<Group*> shared;  // the groups the threads take, largest first
  for (Group& g : groups) {
    if (!g.one_by_one) shared.push_back(&g);
  }
  if (shared.size() < 2) return in_turn();
  {
    for (Group* g : shared) g->task = &TaskOf(g->partition);  // none is created while they run
    std::stable_sort(shared.begin(), shared.end(), [](const Group* a, const Group* b) {
      return a->messages.size() > b->messages.size();
    });
    std::atomic<size_t> next{0};
    fork_join_->Run([&](size_t index) {
      Lane& lane = lanes_[index];
      for (size_t k; (k = next.fetch_add(1)) < shared.size();) {
        Group& g = *shared[k];
        for (; g.done < g.messages.size(); ++g.done) {
          const Message& m = *g.messages[g.done];
          const TimePoint now = steady_now();
          const int64_t wall = wall_now_unix_ns();
          const RejectReason reason =
              decoder_.Decode(m.payload, &lane.batch, &lane.detail, wall, &lane.notes);
          if (reason != RejectReason::kNone) {
            std::lock_guard<std::mutex> lock(table_mu_);
            Rejected(reason, now, lane.detail);
          } else if (!RouteInLane(*g.task, lane, now, wall)) {
            break;  // this one and the rest of the partition's wait for the whole table
          }
          g.task->Consumed(m.offset);
        }
      }
    });
  }
  for (Group& g : groups) {
    for (; g.done < g.messages.size(); ++g.done) {
      const Message& m = *g.messages[g.done];
      HandleMessage(m.payload, m.partition, m.offset, steady_now(), wall_now_unix_ns());
    }
  }
}

void JobRouter::Rejected(RejectReason reason, TimePoint now, const std::string& detail) {
  sinks_.metrics->rejected_by_reason[static_cast<int>(reason)]->Add(1);
  // Rejected input means a producer to fix: one line the first time, then at most one a
  // minute per reason with the count since (a flood of bad messages cannot flood the log).
  if (std::optional<uint64_t> since = reject_log_[static_cast<int>(reason)].Admit(now)) {
    spdlog::warn("rejected {} telemetry message{} ({}); the latest: {}", *since,
                 *since == 1 ? "" : "s", RejectReasonName(reason), detail);
  }
}

JobRouter::Index::iterator JobRouter::Track(const std::string& name, int32_t partition,
                                            uint32_t world_size, bool provisional, TimePoint now) {
  auto it = job_partition_.find(name);
  if (it != job_partition_.end()) Untrack(it);
  it = job_partition_.emplace(name, Entry{partition, world_size, false, false, 0, now}).first;
  total_ranks_ += world_size;
  SetProvisional(it, provisional, 1, now);
  return it;
}

void JobRouter::Track(const state::v1::JobMeta& meta, int32_t partition, TimePoint now) {
  const uint64_t complete =
      meta.aligned_steps() - std::min(meta.aligned_steps(), meta.timed_out_steps());
  Track(meta.training_job(), partition, meta.world_size(), complete < options_.established_steps,
        now);
}

void JobRouter::Untrack(Index::iterator it) {
  SetProvisional(it, false, 0, it->second.last_input);
  total_ranks_ -= it->second.world_size;
  job_partition_.erase(it);
}

void JobRouter::SetProvisional(Index::iterator it, bool provisional, uint32_t batches,
                               TimePoint now) {
  Entry& e = it->second;
  if (e.provisional) {
    provisional_.erase({e.job, e.batches, e.last_input, it->first});
    provisional_ranks_ -= e.world_size;
  }
  e.provisional = provisional;
  e.batches = batches;
  e.last_input = now;
  if (provisional) {
    e.job = sinks_.metrics->IsJob(it->first);
    provisional_.emplace(e.job, e.batches, e.last_input, it->first);
    provisional_ranks_ += e.world_size;
  }
}

void JobRouter::Evict(Index::iterator it) {
  if (auto task = tasks_.find(it->second.partition); task != tasks_.end()) {
    task->second->Evict(it->first);
  }
  Untrack(it);
  sinks_.metrics->jobs_evicted->Add(1);
  ++evicted_since_log_;
}

bool JobRouter::MakeRoom(size_t jobs, uint64_t ranks, std::string_view keep, TimePoint now) {
  auto fits = [&] { return Fits(jobs, ranks); };
  // Evict nothing unless evicting every provisional job but `keep` would make room.
  size_t evictable_jobs = provisional_.size();
  uint64_t evictable_ranks = provisional_ranks_;
  if (auto k = job_partition_.find(keep); k != job_partition_.end() && k->second.provisional) {
    --evictable_jobs;
    evictable_ranks -= k->second.world_size;
  }
  const bool possible = job_partition_.size() - evictable_jobs + jobs <= options_.max_jobs &&
                        total_ranks_ - evictable_ranks + ranks <= options_.max_ranks;
  auto next = provisional_.begin();
  while (possible && !fits() && next != provisional_.end()) {
    const std::string& name = std::get<3>(*next++);
    if (name == keep) continue;
    auto victim = job_partition_.find(name);
    Evict(victim);  // invalidates only its own key in provisional_, which `next` has passed
  }
  const bool ok = fits();
  if (ok && evicted_since_log_ == 0) return ok;
  // Refused messages are the events counted; evictions alone make a report due too.
  if (std::optional<uint64_t> refused = reject_log_[kRejectReasonCount].Admit(now, ok ? 0 : 1)) {
    spdlog::warn(
        "the job table is full ({} jobs of at most {}, {} ranks of at most {}): evicted {} jobs "
        "that had not completed {} steps and refused {} messages of new jobs since the last "
        "report (max-jobs, max-ranks)",
        job_partition_.size(), options_.max_jobs, total_ranks_, options_.max_ranks,
        evicted_since_log_, options_.established_steps, *refused);
    evicted_since_log_ = 0;
  }
  return ok;
}

void JobRouter::Route(int32_t partition, const Lane& lane, TimePoint now,
                      int64_t wall_now_unix_ns) {
  const v1::Batch& batch = lane.batch;
  const std::string& name = batch.source().training_job();
  const uint32_t world_size = batch.source().world_size();
  auto known = job_partition_.find(name);
  if (known == job_partition_.end()) {
    if (!MakeRoom(1, world_size, name, now)) {
      rejected_too_many_jobs_->Add(1);
      return;
    }
  } else if (world_size > known->second.world_size &&
             !MakeRoom(0, world_size - known->second.world_size, name, now)) {
    rejected_too_many_jobs_->Add(1);  // an elastic restart to more ranks than fit
    return;
  }
  // A message without a partition goes to the job's task, wherever that is.
  if (partition < 0 && known != job_partition_.end()) partition = known->second.partition;
  PartitionTask& task = TaskOf(partition);
  if (known != job_partition_.end() && known->second.partition != partition) {
    // The job's records arrive on another partition now (or it was restored without one):
    // its state moves to that partition's task.
    if (auto it = tasks_.find(known->second.partition); it != tasks_.end()) {
      it->second->MoveJob(name, &task);
    }
  }
  task.Add(batch, now, wall_now_unix_ns);
  if (known == job_partition_.end()) {
    known = Track(name, partition, world_size, true, now);
    sinks_.metrics->jobs->Set(static_cast<double>(job_partition_.size()));
  }
  known->second.partition = partition;
  Routed(known, task, now);
  CountBatch(lane, wall_now_unix_ns);
}

bool JobRouter::RouteInLane(PartitionTask& task, const Lane& lane, TimePoint now,
                            int64_t wall_now_unix_ns) {
  const v1::Batch& batch = lane.batch;
  const std::string& name = batch.source().training_job();
  const uint32_t world_size = batch.source().world_size();
  Index::iterator known;
  {
    std::lock_guard<std::mutex> lock(table_mu_);
    known = job_partition_.find(name);
    if (known == job_partition_.end()) {
      if (!Fits(1, world_size)) return false;
      // Tracked before its task has it (Route tracks after): the table's count holds the room
      // it takes while other threads add jobs. Routed below leaves the entry as Route would.
      known = Track(name, task.partition(), world_size, true, now);
      sinks_.metrics->jobs->Set(static_cast<double>(job_partition_.size()));
    } else if (known->second.partition != task.partition() ||
               (world_size > known->second.world_size &&
                !Fits(0, world_size - known->second.world_size))) {
      return false;
    }
  }
  task.Add(batch, now, wall_now_unix_ns);
  {
    // Entries leave the table only outside HandleMessages' threads: `known` stands.
    std::lock_guard<std::mutex> lock(table_mu_);
    Routed(known, task, now);
  }
  CountBatch(lane, wall_now_unix_ns);
  return true;
}

void JobRouter::Routed(Index::iterator known, const PartitionTask& task, TimePoint now) {
  Entry& e = known->second;
  const std::string& name = known->first;
  if (const uint32_t now_size = task.WorldSizeOf(name); now_size != e.world_size) {
    total_ranks_ = total_ranks_ - e.world_size + now_size;
    if (e.provisional) provisional_ranks_ = provisional_ranks_ - e.world_size + now_size;
    e.world_size = now_size;
  }
  if (e.provisional) {
    const bool established = task.CompleteStepsOf(name) >= options_.established_steps;
    SetProvisional(known, !established, std::min<uint32_t>(e.batches + 1, 1000), now);
  }
}

void JobRouter::CountBatch(const Lane& lane, int64_t wall_now_unix_ns) {
  const v1::Batch& batch = lane.batch;
  DaemonMetrics* m = sinks_.metrics;
  m->events_batches->Add(1);
  m->events_steps->Add(batch.steps_size());
  m->events_kernels->Add(batch.kernels_size());
  m->events_samples->Add(batch.samples_size());
  if (lane.notes.ops > 0) m->events_ops->Add(static_cast<double>(lane.notes.ops));
  if (lane.notes.unknown_op_types > 0) {
    m->events_unknown_ops->Add(static_cast<double>(lane.notes.unknown_op_types));
  }
  if (batch.created_unix_ns() > 0) {
    m->ingest_lag_seconds->Set(static_cast<double>(wall_now_unix_ns - batch.created_unix_ns()) *
                               1e-9);
  }
}

void JobRouter::Tick(TimePoint now, int64_t wall_now_unix_ns, bool input_idle) {
  TickOutput out;
  Duration costs{};
  // The fleet's share bounds evaluations only while they take time from input.
  const Duration fleet_cost = input_idle ? Duration{} : evaluation_costs_;
  if (fork_join_ != nullptr) {
    // The snapshots, the evaluations' cost, are taken on every ingest thread, a job on one.
    std::vector<std::vector<PartitionTask::DueEvaluation>> due(tasks_.size());
    size_t k = 0, jobs = 0;
    for (auto& [partition, task] : tasks_) {
      task->PlanEvaluation(now, wall_now_unix_ns, &out, fleet_cost, &due[k]);
      jobs += due[k++].size();
    }
    if (jobs == 1) {
      for (auto& d : due) {
        for (PartitionTask::DueEvaluation& e : d) e.Run(now, options_.task.stopwatch);
      }
    } else if (jobs > 1) {
      std::vector<PartitionTask::DueEvaluation*> all;
      all.reserve(jobs);
      for (auto& d : due) {
        for (PartitionTask::DueEvaluation& e : d) all.push_back(&e);
      }
      std::atomic<size_t> next{0};
      fork_join_->Run([&](size_t) {
        for (size_t i; (i = next.fetch_add(1)) < all.size();) {
          all[i]->Run(now, options_.task.stopwatch);
        }
      });
    }
    k = 0;
    for (auto& [partition, task] : tasks_)
      task->FinishEvaluation(wall_now_unix_ns, &due[k++], &out);
  }
  for (auto& [partition, task] : tasks_) {
    if (fork_join_ == nullptr) task->Evaluate(now, wall_now_unix_ns, &out, fleet_cost);
    costs += task->evaluation_costs();
    for (const std::string& name : task->TakeRemoved()) {
      if (auto it = job_partition_.find(name); it != job_partition_.end()) Untrack(it);
    }
    task->TakeDroppedSnapshots(&out.removed_snapshots);
  }
  evaluation_costs_ = costs;
  sinks_.metrics->jobs->Set(static_cast<double>(job_partition_.size()));
  for (const auto& s : out.snapshots) sinks_.metrics->PublishJob(*s);
  if (!out.snapshots.empty() || !out.removed_snapshots.empty()) {
    sinks_.snapshots->Update(out.snapshots, out.removed_snapshots);
  }
  for (auto& [partition, task] : tasks_) task->RaiseAlerts(wall_now_unix_ns, &out);
  if (!sinks_.hooks.empty()) {
    TickView tick;
    tick.now_unix_ns = wall_now_unix_ns;
    tick.evaluated = &out.snapshots;
    tick.removed = &out.removed_snapshots;
    tick.latest = sinks_.snapshots->Get();
    tick.node_charges = &out.node_charges;
    for (TickHook* hook : sinks_.hooks) hook->OnTick(tick, &out.alerts);
  }
  // Every alert of the tick in one write; the ingest thread never waits for it.
  if (sinks_.alert_hub != nullptr && (!out.alerts.empty() || !out.alert_states.empty())) {
    sinks_.alert_hub->Append(std::move(out.alerts), std::move(out.alert_states));
  }
}

bool JobRouter::Checkpoint(rankwatch::Checkpoint* c, TimePoint now, int64_t wall_now_unix_ns,
                           std::map<int32_t, rankwatch::Checkpoint>* by_partition,
                           size_t max_bytes) {
  ++checkpoint_calls_;
  std::vector<std::pair<uint64_t, int32_t>> order;  // (first seen changed, partition)
  for (const auto& [partition, task] : tasks_) {
    if (!task->changed()) continue;
    order.emplace_back(changed_since_.try_emplace(partition, checkpoint_calls_).first->second,
                       partition);
  }
  std::sort(order.begin(), order.end());
  size_t collected = 0;
  const size_t bytes_before = c->bytes();
  for (const auto& [since, partition] : order) {
    if (c->bytes() - bytes_before >= max_bytes) break;
    rankwatch::Checkpoint part;
    tasks_[partition]->Checkpoint(now, wall_now_unix_ns, &part);
    // A partition whose only change is its offset goes to the changelog too: where its input
    // begins (StartsAt) is what a new owner must resume from to count a loss.
    if (by_partition != nullptr && partition >= 0) (*by_partition)[partition].Append(part);
    c->Append(std::move(part));
    changed_since_.erase(partition);
    ++collected;
  }
  // A partition's offset goes with its changes, or alone when it has none left.
  for (const auto& [partition, task] : tasks_) {
    if (partition < 0 || changed_since_.count(partition)) continue;
    if (auto next = task->next_offset()) c->SetOffset(options_.topic, partition, *next);
  }
  return collected == order.size();
}

absl::Status JobRouter::Restore(const StateStore& store, TimePoint now, int64_t wall_now_unix_ns) {
  auto stored = job_state::ReadJobs(store);
  if (!stored.ok()) return stored.status();
  std::map<int32_t, std::vector<job_state::StoredJob>> by_partition;
  for (job_state::StoredJob& job : *stored) {
    const int32_t p = job.meta.has_kafka_partition() ? job.meta.kafka_partition() : -1;
    by_partition[p].push_back(std::move(job));
  }
  for (auto& [partition, jobs] : by_partition) {
    for (const auto& job : jobs) Track(job.meta, partition, now);
    if (absl::Status s = TaskOf(partition).Restore(std::move(jobs), now, wall_now_unix_ns);
        !s.ok()) {
      return s;
    }
  }
  sinks_.metrics->jobs->Set(static_cast<double>(job_partition_.size()));
  if (!stored->empty()) {
    spdlog::info("restored {} training jobs from the state store", stored->size());
  }
  return absl::OkStatus();
}

absl::Status JobRouter::RestorePartition(const StateStore& store, int32_t partition, TimePoint now,
                                         int64_t wall_now_unix_ns) {
  ReleasePartition(partition);
  auto stored = job_state::ReadJobs(store, partition);
  if (!stored.ok()) return stored.status();
  for (const auto& job : *stored) {
    const std::string& name = job.meta.training_job();
    auto it = job_partition_.find(name);
    if (it != job_partition_.end()) {
      // Restored at start under another partition that this instance does not own: the stored
      // state of this partition wins.
      if (auto t = tasks_.find(it->second.partition); t != tasks_.end()) t->second->Forget(name);
    }
    Track(job.meta, partition, now);
  }
  PartitionTask& task = TaskOf(partition);
  const size_t restored = stored->size();
  absl::Status s = task.Restore(std::move(*stored), now, wall_now_unix_ns);
  sinks_.metrics->jobs->Set(static_cast<double>(job_partition_.size()));
  if (s.ok() && restored > 0) {
    spdlog::info("partition {}: restored {} training jobs", partition, restored);
  }
  return s;
}

void JobRouter::InputLost(int32_t partition, uint64_t messages, int64_t log_end) {
  TaskOf(partition).InputLost(messages, log_end);
}

void JobRouter::ReleasePartition(int32_t partition) {
  auto it = tasks_.find(partition);
  if (it == tasks_.end()) return;
  for (const std::string& name : it->second->JobNames()) {
    if (auto job = job_partition_.find(name); job != job_partition_.end()) Untrack(job);
  }
  it->second->Release();
  std::vector<std::string> dropped;
  it->second->TakeDroppedSnapshots(&dropped);
  sinks_.snapshots->Update({}, dropped);
  tasks_.erase(it);
  changed_since_.erase(partition);
  sinks_.metrics->jobs->Set(static_cast<double>(job_partition_.size()));
}

std::vector<std::string> JobRouter::JobsOf(int32_t partition) const {
  auto it = tasks_.find(partition);
  return it == tasks_.end() ? std::vector<std::string>() : it->second->JobNames();
}

std::set<int32_t> JobRouter::Partitions() const {
  std::set<int32_t> out;
  for (const auto& [partition, task] : tasks_) out.insert(partition);
  return out;
}

std::optional<int64_t> JobRouter::CoveredOffset(int32_t partition) const {
  auto it = tasks_.find(partition);
  if (it == tasks_.end()) return std::nullopt;
  return it->second->covered_offset();
}

}  // namespace rankwatch
