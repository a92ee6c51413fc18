#include "state/state_changelog.h"

#include <gtest/gtest.h>

#include "kafka/embedded_broker.h"

namespace rankwatch {
namespace {

class StateChangelogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto broker = EmbeddedBroker::Start({"telemetry", 2, 1, /*changelog_topic=*/true});
    ASSERT_TRUE(broker.ok()) << broker.status();
    broker_ = std::move(*broker);
  }
  std::unique_ptr<StateChangelog> Open(int32_t partitions = 2, size_t snapshot_after = 1 << 20) {
    StateChangelogOptions options;
    options.brokers = broker_->bootstrap();
    options.topic = "telemetry.changelog";
    options.partitions = partitions;
    options.snapshot_after_bytes = snapshot_after;
    auto changelog = StateChangelog::Open(options);
    EXPECT_TRUE(changelog.ok()) << changelog.status();
    return changelog.ok() ? std::move(*changelog) : nullptr;
  }
  std::unique_ptr<EmbeddedBroker> broker_;
};

std::string Value(const ChangelogPartition& p, const std::string& key) {
  auto it = p.values.find({StateFamily::kJobs, key});
  return it == p.values.end() ? "<none>" : it->second;
}

TEST_F(StateChangelogTest, AnEmptyPartitionHasNoState) {
  auto changelog = Open();
  auto read = changelog->Read(0);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_FALSE(read->present);
}

TEST_F(StateChangelogTest, ReadsBackASnapshotAndTheDeltasAfterIt) {
  auto writer = Open();
  ASSERT_TRUE(writer->NeedsSnapshot(1));
  Checkpoint full;
  full.Put(StateFamily::kJobs, "mA", "meta-1");
  full.Put(StateFamily::kJobs, "sA1", "step-1");
  full.Put(StateFamily::kJobs, "sA2", "step-2");
  writer->Append(1, full, 10, /*full=*/true);
  EXPECT_FALSE(writer->NeedsSnapshot(1));
  Checkpoint delta;
  delta.Put(StateFamily::kJobs, "mA", "meta-2");
  delta.Put(StateFamily::kJobs, "sA3", "step-3");
  delta.DeleteRange(StateFamily::kJobs, "sA0", "sA2");
  writer->Append(1, delta, 25, false);
  Checkpoint other;
  other.Put(StateFamily::kJobs, "mB", "other partition");
  writer->Append(0, other, 3, true);
  ASSERT_TRUE(writer->Flush(std::chrono::seconds(10)).ok());

  auto reader = Open();
  auto read = reader->Read(1);
  ASSERT_TRUE(read.ok()) << read.status();
  ASSERT_TRUE(read->present);
  EXPECT_EQ(read->next_offset, 25);
  EXPECT_EQ(read->sequence, 2u);
  EXPECT_EQ(Value(*read, "mA"), "meta-2");
  EXPECT_EQ(Value(*read, "sA1"), "<none>");  // range-deleted
  EXPECT_EQ(Value(*read, "sA2"), "step-2");  // the range end is exclusive
  EXPECT_EQ(Value(*read, "sA3"), "step-3");
  EXPECT_EQ(Value(*read, "mB"), "<none>");  // another partition's state
  EXPECT_TRUE(reader->NeedsSnapshot(1));    // a new owner starts with a full snapshot
}

TEST_F(StateChangelogTest, ANewOwnerContinuesTheSequenceAndASnapshotReplacesEverything) {
  auto first = Open();
  Checkpoint full;
  full.Put(StateFamily::kJobs, "mA", "from the first owner");
  full.Put(StateFamily::kJobs, "mGone", "removed later");
  first->Append(0, full, 5, true);
  ASSERT_TRUE(first->Flush(std::chrono::seconds(10)).ok());

  auto second = Open();
  ASSERT_TRUE(second->Read(0).ok());
  Checkpoint state;
  state.Put(StateFamily::kJobs, "mA", "from the second owner");
  second->Append(0, state, 9, true);
  Checkpoint delta;
  delta.Put(StateFamily::kJobs, "mC", "new job");
  second->Append(0, delta, 12, false);
  ASSERT_TRUE(second->Flush(std::chrono::seconds(10)).ok());

  auto read = Open()->Read(0);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->sequence, 3u);
  EXPECT_EQ(read->next_offset, 12);
  EXPECT_EQ(Value(*read, "mA"), "from the second owner");
  EXPECT_EQ(Value(*read, "mGone"), "<none>");
  EXPECT_EQ(Value(*read, "mC"), "new job");
}

TEST_F(StateChangelogTest, SnapshotsAgainAfterEnoughDeltaBytes) {
  auto writer = Open(2, /*snapshot_after=*/1000);
  Checkpoint full;
  full.Put(StateFamily::kJobs, "m", std::string(100, 'x'));
  writer->Append(0, full, 1, true);
  Checkpoint delta;
  delta.Put(StateFamily::kJobs, "m", std::string(600, 'y'));
  writer->Append(0, delta, 2, false);
  EXPECT_FALSE(writer->NeedsSnapshot(0));
  writer->Append(0, delta, 3, false);
  EXPECT_TRUE(writer->NeedsSnapshot(0));
}

TEST_F(StateChangelogTest, AnotherPartitionCountIsRefusedByName) {
  ASSERT_NE(Open(2), nullptr);
  StateChangelogOptions options;
  options.brokers = broker_->bootstrap();
  options.topic = "telemetry.changelog";
  options.partitions = 3;
  auto changelog = StateChangelog::Open(options);
  ASSERT_FALSE(changelog.ok());
  EXPECT_EQ(changelog.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(changelog.status().message().find("telemetry.changelog"), std::string::npos);
}

// Records a hostile producer may write to the changelog topic: they must never reach the
// store as they are (a family byte past the store's column families indexed past its handles;
// fuzz_changelog).
TEST(ChangelogReaderTest, RecordsThisBuildDoesNotWriteAreIgnoredAndCounted) {
  Checkpoint full;
  full.Put(StateFamily::kJobs, "mA", "meta");
  ChangelogReader reader;
  auto records = ChangelogRecords(full, 7, 1, /*full=*/true);
  ASSERT_EQ(records.size(), 3u);  // begin, put, commit
  reader.Add(records[0].key, records[0].value);
  reader.Add(records[1].key, records[1].value);
  reader.Add(std::string("k\xc8stray", 7), "value");  // family 200
  reader.Add("", std::nullopt);                       // no key at all
  reader.Add(std::string("c\0", 2), "short");         // a commit without its 17 bytes
  reader.Add(records[2].key, records[2].value);
  EXPECT_EQ(reader.ignored(), 3u);
  ASSERT_TRUE(reader.state().present);
  EXPECT_EQ(reader.state().next_offset, 7);
  EXPECT_EQ(reader.state().sequence, 1u);
  ASSERT_EQ(reader.state().values.size(), 1u);
  EXPECT_EQ(Value(reader.state(), "mA"), "meta");
}

TEST(ChangelogReaderTest, ADeltaOutOfSequenceIsNotApplied) {
  Checkpoint full, delta;
  full.Put(StateFamily::kJobs, "mA", "1");
  delta.Put(StateFamily::kJobs, "mA", "2");
  ChangelogReader reader;
  for (auto& r : ChangelogRecords(full, 5, 1, true)) reader.Add(r.key, r.value);
  for (auto& r : ChangelogRecords(delta, 9, 3, false)) reader.Add(r.key, r.value);  // 2 lost
  EXPECT_EQ(reader.state().sequence, 1u);
  EXPECT_EQ(Value(reader.state(), "mA"), "1");
}

}  // namespace
}  // namespace rankwatch
