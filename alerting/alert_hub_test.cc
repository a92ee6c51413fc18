#include "alerting/alert_hub.h"

#include "state/job_state_store.h"

#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <future>
#include <thread>

namespace rankwatch {
namespace {

v1::Alert MakeAlert(const std::string& job, v1::AlertState state, v1::Severity severity) {
  v1::Alert a;
  a.set_id(job + "|straggler|rank:1");
  a.set_training_job(job);
  a.set_kind(v1::ALERT_STRAGGLER);
  a.set_state(state);
  a.set_severity(severity);
  return a;
}

std::vector<uint64_t> Backlog(const AlertHub& hub, uint64_t after, uint64_t before,
                              const AlertFilter& filter = {}) {
  std::vector<uint64_t> out;
  hub.Backlog(after, before, filter,
              [&](std::shared_ptr<const v1::Alert> a) { out.push_back(a->sequence()); });
  return out;
}

class AlertHubTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("alert-hub-test-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    Reopen();
  }
  void TearDown() override {
    writer_.reset();
    store_.reset();
    std::filesystem::remove_all(dir_);
  }
  void Reopen() {
    writer_.reset();
    store_.reset();
    auto s = StateStore::Open({dir_});
    ASSERT_TRUE(s.ok()) << s.status();
    store_ = std::move(*s);
    writer_ = std::make_unique<CheckpointWriter>(store_.get(), CheckpointWriterOptions{}, nullptr,
                                                 nullptr);
  }
  // Appends `alerts` and waits until they are stored and published.
  static absl::Status Store(AlertHub& hub, std::vector<v1::Alert> alerts) {
    hub.Append(std::move(alerts), {});
    return hub.Flush();
  }
  std::filesystem::path dir_;
  std::unique_ptr<StateStore> store_;
  std::unique_ptr<CheckpointWriter> writer_;
};

TEST_F(AlertHubTest, SequencesAreConsecutiveAndContinueAfterARestart) {
  {
    AlertHub hub(store_.get(), writer_.get(), {}, {});
    ASSERT_TRUE(Store(hub, {MakeAlert("a", v1::ALERT_FIRING, v1::SEVERITY_WARN),
                            MakeAlert("b", v1::ALERT_FIRING, v1::SEVERITY_CRIT)})
                    .ok());
    ASSERT_TRUE(Store(hub, {MakeAlert("a", v1::ALERT_RESOLVED, v1::SEVERITY_WARN)}).ok());
    EXPECT_EQ(hub.last_sequence(), 3u);
    EXPECT_EQ(hub.Firing("b"), std::vector<std::string>{"b|straggler|rank:1"});
    EXPECT_TRUE(hub.Firing("a").empty());
  }
  Reopen();
  AlertHub hub(store_.get(), writer_.get(), {}, {});
  EXPECT_EQ(hub.last_sequence(), 3u);
  ASSERT_TRUE(Store(hub, {MakeAlert("c", v1::ALERT_FIRING, v1::SEVERITY_WARN)}).ok());
  EXPECT_EQ(Backlog(hub, 0, 100), (std::vector<uint64_t>{1, 2, 3, 4}));  // from the store
  EXPECT_EQ(Backlog(hub, 2, 4), (std::vector<uint64_t>{3}));
  AlertFilter crit;
  crit.min_severity = v1::SEVERITY_CRIT;
  EXPECT_EQ(Backlog(hub, 0, 100, crit), (std::vector<uint64_t>{2}));
  AlertFilter job_c;
  job_c.training_job = "c";
  EXPECT_EQ(Backlog(hub, 0, 100, job_c), (std::vector<uint64_t>{4}));
}

TEST_F(AlertHubTest, ASubscriberGetsLiveAlertsAfterItsBacklogPosition) {
  AlertHub hub(store_.get(), writer_.get(), {}, {});
  ASSERT_TRUE(Store(hub, {MakeAlert("a", v1::ALERT_FIRING, v1::SEVERITY_WARN)}).ok());
  auto sub = hub.Subscribe({});
  EXPECT_EQ(sub->live_from(), 2u);
  ASSERT_TRUE(Store(hub, {MakeAlert("a", v1::ALERT_RESOLVED, v1::SEVERITY_WARN)}).ok());
  std::shared_ptr<const v1::Alert> a;
  ASSERT_EQ(sub->Next(std::chrono::milliseconds(100), &a), AlertHub::Subscription::Wait::kAlert);
  EXPECT_EQ(a->sequence(), 2u);
  EXPECT_EQ(sub->Next(std::chrono::milliseconds(10), &a), AlertHub::Subscription::Wait::kTimeout);
}

TEST_F(AlertHubTest, AFullQueueOverflowsWithoutBlockingAndOthersGoOn) {
  AlertHubOptions options;
  options.subscriber_queue = 2;
  PrometheusRegistry registry;
  MetricCell* dropped = registry.Counter("test_dropped_total", "test", {})->WithLabels({});
  AlertHub hub(store_.get(), writer_.get(), options, {nullptr, dropped, nullptr});
  auto slow = hub.Subscribe({});
  auto fast = hub.Subscribe({});
  std::shared_ptr<const v1::Alert> a;
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(Store(hub, {MakeAlert("a", v1::ALERT_FIRING, v1::SEVERITY_WARN)}).ok());
    ASSERT_EQ(fast->Next(std::chrono::milliseconds(100), &a), AlertHub::Subscription::Wait::kAlert);
    EXPECT_EQ(a->sequence(), static_cast<uint64_t>(i + 1));
  }
  EXPECT_EQ(slow->Next(std::chrono::milliseconds(10), &a), AlertHub::Subscription::Wait::kOverflow);
  EXPECT_EQ(dropped->Get(), 1);
}

TEST_F(AlertHubTest, OldAlertsBeyondTheRetentionAreDeleted) {
  AlertHubOptions options;
  options.log_retention = 3;
  options.ring_capacity = 1;  // the backlog comes from the store
  AlertHub hub(store_.get(), writer_.get(), options, {});
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(Store(hub, {MakeAlert("a", v1::ALERT_FIRING, v1::SEVERITY_WARN)}).ok());
  }
  std::vector<uint64_t> got;
  const bool complete = hub.Backlog(
      0, 100, {}, [&](std::shared_ptr<const v1::Alert> x) { got.push_back(x->sequence()); });
  EXPECT_EQ(got, (std::vector<uint64_t>{3, 4, 5}));
  EXPECT_FALSE(complete);  // 1 and 2 are gone
}

TEST_F(AlertHubTest, AppendNeverWaitsForTheDiskAndPublishesOnlyWhatIsStored) {
  AlertHub hub(store_.get(), writer_.get(), {}, {});
  auto sub = hub.Subscribe({});
  // A checkpoint whose write does not finish until released holds the writer.
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  ASSERT_TRUE(writer_
                  ->Enqueue(Checkpoint(),
                            [released] {
                              released.wait();
                              return absl::OkStatus();
                            })
                  .ok());
  // Far more appends than the writer's queue admits: none of them waits.
  for (int i = 0; i < 1000; ++i)
    hub.Append({MakeAlert("a", v1::ALERT_FIRING, v1::SEVERITY_WARN)}, {});
  std::shared_ptr<const v1::Alert> a;
  EXPECT_EQ(sub->Next(std::chrono::milliseconds(50), &a), AlertHub::Subscription::Wait::kTimeout);
  EXPECT_EQ(hub.last_sequence(), 0u);  // nothing published before it is stored
  release.set_value();
  ASSERT_TRUE(hub.Flush().ok());
  EXPECT_EQ(hub.last_sequence(), 1000u);
  ASSERT_EQ(sub->Next(std::chrono::milliseconds(100), &a), AlertHub::Subscription::Wait::kAlert);
  EXPECT_EQ(a->sequence(), 1u);
  auto stored = job_state::LastAlertSequence(*store_);
  ASSERT_TRUE(stored.ok());
  EXPECT_EQ(*stored, 1000u);
}

// Reads every alert after `after` as WatchAlerts does (subscribe, backlog up to live_from, then
// live), resuming from the last one it got when its queue overflowed, until it has `total`.
// Returns the sequences in the order they were read.
std::vector<uint64_t> ReadLikeWatchAlerts(AlertHub& hub, uint64_t total,
                                          std::chrono::milliseconds pause_every_16) {
  std::vector<uint64_t> got;
  uint64_t last = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (last < total && std::chrono::steady_clock::now() < deadline) {
    auto sub = hub.Subscribe({});
    EXPECT_TRUE(hub.Backlog(last, sub->live_from(), {}, [&](std::shared_ptr<const v1::Alert> a) {
      got.push_back(a->sequence());
      last = a->sequence();
    }));
    for (;;) {
      std::shared_ptr<const v1::Alert> a;
      const auto wait = sub->Next(std::chrono::milliseconds(20), &a);
      if (wait == AlertHub::Subscription::Wait::kOverflow) break;  // resume after `last`
      if (wait == AlertHub::Subscription::Wait::kClosed) return got;
      if (wait == AlertHub::Subscription::Wait::kTimeout) {
        if (last >= total) return got;
        continue;
      }
      if (a->sequence() <= last) continue;  // also read as backlog
      got.push_back(a->sequence());
      last = a->sequence();
      if (got.size() % 16 == 0) std::this_thread::sleep_for(pause_every_16);
      if (last >= total) return got;
    }
  }
  return got;
}

// Concurrency (run under TSan by scripts/test.sh --sanitize=thread): the ingest thread appends
// while the writer thread stores and publishes, four readers on threads of their own read as
// WatchAlerts does (two of them slow enough to overflow and resume), a stuck subscriber is
// cancelled by the reaper, and another thread asks for the firing alerts as ListJobs does.
// Every reader gets every alert exactly once, in order.
TEST_F(AlertHubTest, ReadersTheReaperAndAppendRaceWithoutLosingOrDuplicatingAlerts) {
  AlertHubOptions options;
  options.subscriber_queue = 8;
  options.ring_capacity = 64;  // resumption reads older alerts from the store
  options.stuck_after = std::chrono::milliseconds(50);
  AlertHub hub(store_.get(), writer_.get(), options, {});
  constexpr uint64_t kAlerts = 1500;
  std::atomic<bool> stuck_cancelled{false};
  auto stuck = hub.Subscribe({}, [&] { stuck_cancelled = true; });  // never reads
  std::vector<std::vector<uint64_t>> got(4);
  std::vector<std::thread> readers;
  for (size_t r = 0; r < got.size(); ++r) {
    readers.emplace_back([&, r] {
      got[r] = ReadLikeWatchAlerts(hub, kAlerts, std::chrono::milliseconds(r < 2 ? 0 : 3));
    });
  }
  std::atomic<bool> done{false};
  std::atomic<int> queries{0};
  std::thread lister([&] {
    while (!done) {
      for (const std::string& id : hub.Firing("job-1")) EXPECT_EQ(id, "job-1|straggler|rank:1");
      EXPECT_LE(hub.last_sequence(), kAlerts);
      ++queries;
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  });
  std::thread ingest([&] {
    uint64_t appended = 0;
    for (int round = 0; appended < kAlerts; ++round) {
      std::vector<v1::Alert> alerts;
      for (int i = 0; i < 1 + round % 3 && appended < kAlerts; ++i, ++appended) {
        alerts.push_back(MakeAlert("job-" + std::to_string(appended % 3),
                                   appended % 2 ? v1::ALERT_RESOLVED : v1::ALERT_FIRING,
                                   v1::SEVERITY_WARN));
      }
      hub.Append(std::move(alerts), {});
      if (round % 20 == 19) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    EXPECT_TRUE(hub.Flush().ok());
  });
  ingest.join();
  for (std::thread& t : readers) t.join();
  done = true;
  lister.join();
  std::vector<uint64_t> all(kAlerts);
  for (uint64_t i = 0; i < kAlerts; ++i) all[i] = i + 1;
  for (size_t r = 0; r < got.size(); ++r) EXPECT_EQ(got[r], all) << "reader " << r;
  EXPECT_EQ(hub.last_sequence(), kAlerts);
  EXPECT_GT(queries.load(), 0);
  // The stuck subscriber overflowed long ago; the reaper (every 250 ms) cancels it.
  for (int i = 0; i < 200 && !stuck_cancelled; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(stuck_cancelled.load());
  std::shared_ptr<const v1::Alert> a;
  EXPECT_EQ(stuck->Next(std::chrono::milliseconds(0), &a), AlertHub::Subscription::Wait::kOverflow);
}

}  // namespace
}  // namespace rankwatch
