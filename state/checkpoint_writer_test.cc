#include "state/checkpoint_writer.h"

#include <gtest/gtest.h>

#include <rocksdb/file_system.h>
#include "state/failing_file_system.h"

#include <atomic>
#include <chrono>
#include <functional>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace rankwatch {
namespace {

using namespace std::chrono_literals;

std::filesystem::path FreshDir(const std::string& name) {
  auto p = std::filesystem::path(::testing::TempDir()) / ("checkpoint_writer_" + name);
  std::filesystem::remove_all(p);
  return p;
}

// An after_commit step that holds the writer thread until `gate` is released.
std::function<absl::Status()> HoldUntil(std::shared_future<void> gate) {
  return [gate] {
    gate.wait();
    return absl::OkStatus();
  };
}

// A value that counts how often (and on which thread) it was serialised.
class CountingValue : public DeferredValue {
 public:
  CountingValue(std::string bytes, std::atomic<int>* serialised)
      : bytes_(std::move(bytes)), serialised_(serialised) {}
  void SerializeTo(std::string* out) const override {
    ++*serialised_;
    *out = bytes_;
  }
  size_t EstimatedBytes() const override { return 1; }

 private:
  std::string bytes_;
  std::atomic<int>* serialised_;
};

TEST(CheckpointWriterTest, CommitsInOrderAndRunsEachAfterCommitStepAfterItsCommit) {
  auto store = StateStore::Open({FreshDir("order")});
  ASSERT_TRUE(store.ok()) << store.status();
  std::vector<std::string> seen;  // writer thread only until Drain
  std::atomic<int> commits{0};
  std::atomic<int> serialised{0};
  CheckpointWriter writer(store->get(), {}, [&](const CheckpointCommitStats&) { ++commits; }, {});
  for (int i = 0; i < 50; ++i) {
    Checkpoint c;
    c.PutDeferred(StateFamily::kJobs, "key",
                  std::make_shared<CountingValue>(std::to_string(i), &serialised));
    c.SetOffset("t", 0, i + 1);
    ASSERT_TRUE(writer
                    .Enqueue(std::move(c),
                             [&, i]() -> absl::Status {
                               // The store is exactly as of this checkpoint's commit.
                               auto v = (*store)->Get(StateFamily::kJobs, "key");
                               seen.push_back(std::to_string(i) + "=" + **v);
                               return absl::OkStatus();
                             })
                    .ok());
  }
  ASSERT_TRUE(writer.Drain().ok());
  ASSERT_EQ(seen.size(), 50u);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(seen[i], std::to_string(i) + "=" + std::to_string(i));
  EXPECT_EQ(commits.load(), 50);
  EXPECT_EQ(serialised.load(), 50);
  EXPECT_EQ(**(*store)->Get(StateFamily::kJobs, "key"), "49");
  EXPECT_EQ((*store)->Offsets()->at({"t", 0}), 50);
}

TEST(CheckpointWriterTest, EnqueueBlocksWhileTheQueueIsFull) {
  auto store = StateStore::Open({FreshDir("backpressure")});
  ASSERT_TRUE(store.ok());
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  CheckpointWriterOptions options;
  options.max_queued = 2;
  CheckpointWriter writer(store->get(), options, {}, {});
  const auto one = [] {
    Checkpoint c;
    c.Put(StateFamily::kJobs, "k", "v");
    return c;
  };
  // The first is being written (held in its after_commit step), two more wait.
  ASSERT_TRUE(writer.Enqueue(one(), HoldUntil(released)).ok());
  std::this_thread::sleep_for(50ms);  // let the writer take it off the queue
  ASSERT_TRUE(writer.Enqueue(one()).ok());
  ASSERT_TRUE(writer.Enqueue(one()).ok());
  std::atomic<bool> fourth_queued{false};
  std::thread producer([&] {
    EXPECT_TRUE(writer.Enqueue(one()).ok());
    fourth_queued = true;
  });
  std::this_thread::sleep_for(200ms);
  EXPECT_FALSE(fourth_queued.load()) << "Enqueue did not wait for the writer";
  release.set_value();
  producer.join();
  EXPECT_TRUE(fourth_queued.load());
  EXPECT_TRUE(writer.Drain().ok());
}

TEST(CheckpointWriterTest, DestructorDrainsTheQueue) {
  const auto dir = FreshDir("drain");
  {
    auto store = StateStore::Open({dir});
    ASSERT_TRUE(store.ok());
    CheckpointWriter writer(store->get(), {}, {}, {});
    for (int i = 0; i < 20; ++i) {
      Checkpoint c;
      c.Put(StateFamily::kJobs, "k" + std::to_string(i), "v");
      c.SetOffset("t", 1, i + 1);
      ASSERT_TRUE(writer.Enqueue(std::move(c)).ok());
    }
  }
  auto store = StateStore::Open({dir});
  ASSERT_TRUE(store.ok());
  EXPECT_EQ((*store)->Offsets()->at({"t", 1}), 20);
  EXPECT_TRUE((*store)->Get(StateFamily::kJobs, "k19")->has_value());
}

TEST(CheckpointWriterTest, FlushesTheMemtablesAfterEnoughBytes) {
  auto store = StateStore::Open({FreshDir("flush")});
  ASSERT_TRUE(store.ok());
  std::vector<bool> flushed;
  CheckpointWriterOptions options;
  options.flush_after_bytes = 1000;
  CheckpointWriter writer(store->get(), options,
                          [&](const CheckpointCommitStats& s) { flushed.push_back(s.flushed); },
                          {});
  for (int i = 0; i < 3; ++i) {
    Checkpoint c;
    c.Put(StateFamily::kJobs, "k" + std::to_string(i), std::string(600, 'x'));
    ASSERT_TRUE(writer.Enqueue(std::move(c)).ok());
  }
  ASSERT_TRUE(writer.Drain().ok());
  EXPECT_EQ(flushed, (std::vector<bool>{false, true, false}));
}

TEST(CheckpointWriterTest, AFailedWriteOnTheWriterThreadIsStickyAndReportedOnce) {
  auto fs = std::make_shared<FailingFileSystem>();
  StateStoreOptions store_options{FreshDir("sticky")};
  store_options.file_system = fs;
  auto store = StateStore::Open(store_options);
  ASSERT_TRUE(store.ok()) << store.status();
  std::atomic<int> errors{0};
  std::atomic<bool> error_on_writer_thread{false};
  const std::thread::id producer = std::this_thread::get_id();
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  CheckpointWriter writer(store->get(), {}, {}, [&](const absl::Status& s) {
    EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
    error_on_writer_thread = std::this_thread::get_id() != producer;
    ++errors;
  });
  const auto put = [](const std::string& value) {
    Checkpoint c;
    c.Put(StateFamily::kJobs, "job", value);
    return c;
  };
  ASSERT_TRUE(writer.Enqueue(put("last good")).ok());
  ASSERT_TRUE(writer.Drain().ok());
  // Hold the writer, queue a checkpoint that fails and one behind it, then let it go.
  ASSERT_TRUE(writer.Enqueue(put("held"), HoldUntil(released)).ok());
  std::this_thread::sleep_for(50ms);
  ASSERT_TRUE(writer.Enqueue(put("lost")).ok());
  ASSERT_TRUE(writer.Enqueue(put("after the loss")).ok());
  fs->fail = true;
  release.set_value();
  const absl::Status s = writer.Drain();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_EQ(errors.load(), 1);
  EXPECT_TRUE(error_on_writer_thread.load());
  fs->fail = false;
  // The disk recovers, but nothing is committed again.
  EXPECT_EQ(writer.Enqueue(put("later")), s);
  EXPECT_EQ(writer.health(), s);
  EXPECT_EQ(*(*store)->Get(StateFamily::kJobs, "job"), "held");
  EXPECT_EQ(errors.load(), 1);
}

TEST(CheckpointWriterTest, AFailedAfterCommitStepIsSticky) {
  auto store = StateStore::Open({FreshDir("after_commit")});
  ASSERT_TRUE(store.ok());
  std::atomic<int> errors{0};
  CheckpointWriter writer(store->get(), {}, {}, [&](const absl::Status&) { ++errors; });
  Checkpoint a;
  a.Put(StateFamily::kJobs, "a", "1");
  ASSERT_TRUE(writer.Enqueue(std::move(a), [] { return absl::DataLossError("changelog"); }).ok());
  EXPECT_EQ(writer.Drain().code(), absl::StatusCode::kDataLoss);
  Checkpoint b;
  b.Put(StateFamily::kJobs, "b", "1");
  EXPECT_EQ(writer.Enqueue(std::move(b)).code(), absl::StatusCode::kDataLoss);
  EXPECT_FALSE(writer.Drain().ok());
  EXPECT_FALSE((*store)->Get(StateFamily::kJobs, "b")->has_value());
  EXPECT_EQ(errors.load(), 1);
}

TEST(CheckpointWriterTest, EnqueueNoWaitPassesTheBoundAndReportsEveryOutcomeOnce) {
  auto fs = std::make_shared<FailingFileSystem>();
  StateStoreOptions store_options{FreshDir("no_wait")};
  store_options.file_system = fs;
  auto store = StateStore::Open(store_options);
  ASSERT_TRUE(store.ok()) << store.status();
  CheckpointWriter writer(store->get(), {}, {}, {});
  const auto put = [](const std::string& key) {
    Checkpoint c;
    c.Put(StateFamily::kAlerts, key, "v");
    return c;
  };
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  ASSERT_TRUE(writer.Enqueue(put("held"), HoldUntil(released)).ok());
  std::mutex mu;
  std::vector<std::pair<std::string, absl::StatusCode>> outcomes;
  const auto record = [&](const std::string& key) {
    return [&, key](const absl::Status& s) {
      std::lock_guard<std::mutex> lock(mu);
      outcomes.emplace_back(key, s.code());
    };
  };
  // Ten writes past a bound of two, from this thread, none of which waits.
  for (int i = 0; i < 10; ++i) writer.EnqueueNoWait(put("ok" + std::to_string(i)), record("ok"));
  release.set_value();
  ASSERT_TRUE(writer.Drain().ok());
  // A write that fails, one dropped behind it, and one after the failure.
  std::promise<void> hold;
  std::shared_future<void> held = hold.get_future().share();
  ASSERT_TRUE(writer.Enqueue(put("gate"), HoldUntil(held)).ok());
  writer.EnqueueNoWait(put("fails"), record("fails"));
  writer.EnqueueNoWait(put("dropped"), record("dropped"));
  fs->fail = true;
  hold.set_value();
  EXPECT_FALSE(writer.Drain().ok());
  fs->fail = false;
  writer.EnqueueNoWait(put("after"), record("after"));  // reported before it returns
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_EQ(outcomes.size(), 13u);
  for (int i = 0; i < 10; ++i)
    EXPECT_EQ(outcomes[i], std::make_pair(std::string("ok"), absl::StatusCode::kOk));
  EXPECT_EQ(outcomes[10], std::make_pair(std::string("fails"), absl::StatusCode::kUnavailable));
  EXPECT_EQ(outcomes[11], std::make_pair(std::string("dropped"), absl::StatusCode::kUnavailable));
  EXPECT_EQ(outcomes[12], std::make_pair(std::string("after"), absl::StatusCode::kUnavailable));
  EXPECT_TRUE((*store)->Get(StateFamily::kAlerts, "ok9")->has_value());
  EXPECT_FALSE((*store)->Get(StateFamily::kAlerts, "dropped")->has_value());
}

// Concurrency (run under TSan by scripts/test.sh --sanitize=thread): a producer thread queues
// checkpoints with deferred values, blocking and non-blocking, and drains now and then, while
// the writer serialises, commits and flushes the memtables after every few commits, and two
// other threads read the store and poll health() and pending(). Every checkpoint lands once and
// in order, every outcome is reported once, and a reader never sees the offset go backwards.
TEST(CheckpointWriterTest, ProducerDrainsReadersAndFlushesRaceWithoutLosingOrder) {
  auto store = StateStore::Open({FreshDir("race")});
  ASSERT_TRUE(store.ok()) << store.status();
  constexpr int kCheckpoints = 600;
  std::atomic<int> serialised{0};
  std::atomic<int> commits{0}, flushes{0};
  CheckpointWriterOptions options;
  options.max_queued = 3;
  options.flush_after_bytes = 4096;  // a memtable flush every few commits
  CheckpointWriter writer(store->get(), options,
                          [&](const CheckpointCommitStats& s) {
                            ++commits;
                            if (s.flushed) ++flushes;
                          },
                          {});
  std::vector<int> after_commit_order;  // writer thread only until Drain
  std::mutex outcomes_mu;
  std::vector<int> outcome_order;  // EnqueueNoWait's `then`, in the order they ran
  std::atomic<bool> done{false};
  std::atomic<int> reader_rounds{0};
  std::atomic<int> backwards{0};
  std::thread reader([&] {
    int64_t last = 0;
    while (!done) {
      auto offsets = (*store)->Offsets();
      if (!offsets.ok()) continue;
      auto it = offsets->find({"t", 3});
      if (it != offsets->end()) {
        if (it->second < last) ++backwards;
        last = it->second;
      }
      ++reader_rounds;
    }
  });
  std::thread poller([&] {
    while (!done) {
      EXPECT_TRUE(writer.health().ok());
      EXPECT_LE(writer.pending(), static_cast<size_t>(kCheckpoints));
      std::this_thread::yield();
    }
  });
  std::thread producer([&] {
    for (int i = 0; i < kCheckpoints; ++i) {
      Checkpoint c;
      c.PutDeferred(StateFamily::kJobs, "job" + std::to_string(i % 7),
                    std::make_shared<CountingValue>(std::string(300, 'a' + i % 26), &serialised));
      c.SetOffset("t", 3, i + 1);
      if (i % 3 == 2) {
        writer.EnqueueNoWait(std::move(c), [&, i](const absl::Status& s) {
          EXPECT_TRUE(s.ok()) << s;
          std::lock_guard<std::mutex> lock(outcomes_mu);
          outcome_order.push_back(i);
        });
      } else {
        EXPECT_TRUE(writer
                        .Enqueue(std::move(c),
                                 [&, i] {
                                   after_commit_order.push_back(i);
                                   return absl::OkStatus();
                                 })
                        .ok());
      }
      if (i % 50 == 49) {
        EXPECT_TRUE(writer.Drain().ok());
      }
    }
    EXPECT_TRUE(writer.Drain().ok());
  });
  producer.join();
  done = true;
  reader.join();
  poller.join();
  EXPECT_EQ(commits.load(), kCheckpoints);
  EXPECT_EQ(serialised.load(), kCheckpoints);
  EXPECT_GT(flushes.load(), 0);
  EXPECT_GT(reader_rounds.load(), 0);
  EXPECT_EQ(backwards.load(), 0) << "a reader saw the stored offset go backwards";
  std::vector<int> blocking, no_wait;
  for (int i = 0; i < kCheckpoints; ++i) (i % 3 == 2 ? no_wait : blocking).push_back(i);
  EXPECT_EQ(after_commit_order, blocking);
  std::lock_guard<std::mutex> lock(outcomes_mu);
  EXPECT_EQ(outcome_order, no_wait);
  EXPECT_EQ((*store)->Offsets()->at({"t", 3}), kCheckpoints);
  EXPECT_EQ(writer.pending(), 0u);
}

}  // namespace
}  // namespace rankwatch
