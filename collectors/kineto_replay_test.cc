// ReplayKinetoTraces against a message size (issue #47): every batch is at most max_bytes
// serialized (by default what a Kafka message of 1,000,000 bytes holds), and a smaller bound
// cuts the same events into more batches, in the same order, each rank's last batch still
// ending its file.
#include "collectors/kineto_replay.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <tuple>
#include <vector>

#include "wire/schema.h"

namespace rankwatch {
namespace {

namespace fs = std::filesystem;

struct Replayed {
  std::vector<v1::Batch> batches;
  KinetoReplayStats stats;
};

Replayed Replay(const std::vector<fs::path>& files, const KinetoReplayOptions& o) {
  Replayed r;
  const absl::Status s = ReplayKinetoTraces(
      files, o,
      [&](const v1::Batch& b) {
        r.batches.push_back(b);
        return absl::OkStatus();
      },
      &r.stats);
  EXPECT_TRUE(s.ok()) << s;
  return r;
}

// Each rank's events as (step, ts, name, category), in the order sent.
std::map<uint32_t, std::vector<std::tuple<int64_t, int64_t, std::string, std::string>>> Events(
    const std::vector<v1::Batch>& batches) {
  std::map<uint32_t, std::vector<std::tuple<int64_t, int64_t, std::string, std::string>>> out;
  for (const v1::Batch& b : batches) {
    for (const v1::KernelEvent& k : b.kernels()) {
      out[b.source().rank()].emplace_back(k.step(), k.ts_ns(), b.strings(k.name()),
                                          b.strings(k.category()));
    }
  }
  return out;
}

KinetoReplayOptions Options() {
  KinetoReplayOptions o;
  o.training_job = "replay-test";
  o.node = "node-0";
  o.created_unix_ns = 1'700'000'000'000'000'000;
  return o;
}

TEST(KinetoReplayTest, TheDefaultBoundIsWhatAKafkaMessageOf1MBHolds) {
  EXPECT_EQ(KinetoReplayOptions{}.max_bytes, MaxBatchPayloadBytes(kDefaultMaxMessageBytes));
  EXPECT_LT(KinetoReplayOptions{}.max_bytes, size_t{1'000'000});
}

// A 1.3 MB trace (40,803 events in 5 steps, ~8,000 a step at ~100 bytes each): within the
// default bound and within 256 KiB messages' (the old estimate, 48 bytes an event, made
// batches of twice the bound), the largest batches close to it, the same events either way.
TEST(KinetoReplayTest, BatchesOfALargeTraceStayWithinTheBound) {
  const std::vector<fs::path> files = {fs::path(RANKWATCH_FIXTURES) /
                                       "kineto/hta-negative-queue-rank0/rank0.json.gz"};
  const Replayed whole = Replay(files, Options());
  for (const size_t bound :
       {KinetoReplayOptions{}.max_bytes, MaxBatchPayloadBytes(size_t{256} << 10)}) {
    KinetoReplayOptions o = Options();
    o.max_bytes = bound;
    const Replayed r = Replay(files, o);
    ASSERT_FALSE(r.batches.empty());
    size_t largest = 0;
    for (const v1::Batch& b : r.batches) {
      EXPECT_LE(b.ByteSizeLong(), bound);
      largest = std::max(largest, b.ByteSizeLong());
    }
    std::printf("bound %zu: %zu batches, %llu events, the largest %zu bytes\n", bound,
                r.batches.size(), static_cast<unsigned long long>(r.stats.events), largest);
    EXPECT_GT(largest, bound * 3 / 4);
    EXPECT_EQ(Events(r.batches), Events(whole.batches));
    EXPECT_TRUE(r.batches.back().trace().end_of_file());
    EXPECT_TRUE(r.batches.back().final());
  }
}

// A 32 KiB message: the same events in more batches, none over the bound, in the same order;
// each rank's last batch ends its file and is final.
TEST(KinetoReplayTest, ASmallerBoundCutsTheSameEventsIntoMoreBatches) {
  const fs::path dir = fs::path(RANKWATCH_FIXTURES) / "kineto/hta-trace-filter-2rank";
  const std::vector<fs::path> files = {dir / "sampled_rank-0.json.gz",
                                       dir / "sampled_rank-1.json.gz"};
  const Replayed whole = Replay(files, Options());
  KinetoReplayOptions small = Options();
  small.max_bytes = MaxBatchPayloadBytes(32 << 10);
  small.max_events = 200'000;
  const Replayed cut = Replay(files, small);
  EXPECT_GT(cut.batches.size(), whole.batches.size());
  EXPECT_EQ(cut.stats.events, whole.stats.events);
  EXPECT_GT(cut.stats.events, 1000u);
  EXPECT_EQ(cut.stats.steps, whole.stats.steps);
  EXPECT_EQ(Events(cut.batches), Events(whole.batches));
  std::map<uint32_t, int> ends;
  std::map<uint32_t, uint64_t> sequence;
  for (const v1::Batch& b : cut.batches) {
    EXPECT_LE(b.ByteSizeLong(), small.max_bytes);
    const uint32_t rank = b.source().rank();
    EXPECT_EQ(b.sequence(), sequence[rank]++);
    EXPECT_EQ(ends[rank], 0) << "a batch of rank " << rank << " after its end of file";
    if (b.trace().end_of_file()) {
      ++ends[rank];
      EXPECT_TRUE(b.final());
    }
  }
  EXPECT_EQ(ends, (std::map<uint32_t, int>{{0, 1}, {1, 1}}));
}

}  // namespace
}  // namespace rankwatch
