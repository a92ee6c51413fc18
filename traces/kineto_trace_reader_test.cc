#include "traces/kineto_trace_reader.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <zlib.h>

#include <cstdio>
#include <fstream>

#include "traces/trace_file_buffer.h"

namespace rankwatch {
namespace {

const std::string kKineto = std::string(RANKWATCH_FIXTURES) + "/kineto";

std::filesystem::path WriteTemp(const std::string& name, const std::string& content) {
  auto path = std::filesystem::temp_directory_path() / ("kineto_reader_test_" + name);
  std::ofstream(path, std::ios::binary) << content;
  return path;
}

absl::StatusOr<KinetoTrace> ParseText(const std::string& text) {
  return ReadKinetoTrace(WriteTemp("t.json", text));
}

TEST(KinetoTraceReader, ReadsTheTwoRankFixture) {
  auto t = ReadKinetoTrace(kKineto + "/hta-trace-filter-2rank/sampled_rank-1.json.gz");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->raw_events, 4720u);
  EXPECT_EQ(t->rank(), 1u);
  EXPECT_EQ(t->hta_rank, 1u);
  EXPECT_EQ(t->world_size, 128u);
  EXPECT_EQ(t->backend, "nccl");
  EXPECT_FALSE(t->ts_is_float);
  // Complete events only: 44 metadata events have no dur.
  EXPECT_EQ(t->events.size(), 4720u - 44u);
  size_t kernels = 0;
  for (const KinetoEvent& e : t->events) {
    if (t->str(e.category) == "kernel" || t->str(e.category) == "gpu_memcpy" ||
        t->str(e.category) == "gpu_memset") {
      ++kernels;
      EXPECT_GE(e.stream, 0);
      EXPECT_GE(e.correlation, 0);
    }
  }
  EXPECT_EQ(kernels, 1154u);
}

TEST(KinetoTraceReader, KeepsFractionalTimestampsExactInNanoseconds) {
  auto t = ReadKinetoTrace(kKineto + "/hta-nccl-ddp-rank0/nccl_data.json.gz");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_TRUE(t->ts_is_float);
  EXPECT_EQ(t->raw_events, 40573u);
  ASSERT_TRUE(t->base_time_unix_ns.has_value());
  bool found = false;
  for (const KinetoEvent& e : t->events) {
    if (e.correlation == 60047 && t->str(e.category) == "kernel") {
      EXPECT_EQ(e.ts_ns, 4458677009853422);  // "ts":4458677009853.422
      EXPECT_EQ(e.dur_ns, 2636669);
      EXPECT_EQ(e.stream, 40);
      found = true;
    }
  }
  EXPECT_TRUE(found);
}

TEST(KinetoTraceReader, CompactDistributedInfoHasNoHtaRank) {
  auto t = ParseText(R"({"distributedInfo":{"rank":3,"world_size":4},"traceEvents":[
    {"ph":"X","cat":"Kernel","name":"hipMemcpyAsync","ts":1.5,"dur":0.25,"args":{"stream":"7","correlation":9}},
    {"ph":"X","cat":"cuda_runtime","name":"x","ts":2,"dur":1,"args":{"stream":"default"}},
    {"ph":"M","name":"process_name","args":{"name":"p"}}]})");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_FALSE(t->hta_rank.has_value());
  EXPECT_EQ(t->json_rank, 3u);
  EXPECT_EQ(t->rank(), 3u);
  EXPECT_TRUE(t->ts_is_float);  // the metadata event has no ts: pandas makes the column float
  ASSERT_EQ(t->events.size(), 2u);
  EXPECT_EQ(t->events[0].ts_ns, 1500);
  EXPECT_EQ(t->events[0].dur_ns, 250);
  EXPECT_EQ(t->events[0].stream, 7);
  EXPECT_EQ(t->str(t->events[0].name), "hipMemcpyAsync");
  EXPECT_EQ(t->events[1].stream, -1);  // non-numeric stream
  EXPECT_EQ(t->events[1].index, 1u);
}

TEST(KinetoTraceReader, MissingDistributedInfoAndStepsAreFine) {
  auto t = ParseText(
      R"({"traceEvents":[{"ph":"X","cat":"kernel","name":"k","ts":10,"dur":0,"args":{}}]})");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->rank(), 0u);
  EXPECT_FALSE(t->ts_is_float);
  EXPECT_EQ(t->events.size(), 1u);
}

// Kineto writes baseTimeNanoseconds after traceEvents, as the last member, ended by the
// document's closing brace (the hta-nccl-ddp-rank0 fixture does).
TEST(KinetoTraceReader, ReadsTheLastMemberAfterTraceEvents) {
  const std::string events =
      R"("traceEvents":[{"ph":"X","cat":"kernel","name":"k","ts":1,"dur":2,"args":{}}])";
  for (const std::string& text : {
           "{" + events + R"(,"baseTimeNanoseconds":1711964646000000000})",
           "{\n  " + events +
               ",\n  \"traceName\": \"x\",\n  \"baseTimeNanoseconds\": 1711964646000000000\n}",
           "{" + events + R"(, "baseTimeNanoseconds" : "1711964646000000000" } )" + "\n\n",
           "{" + events +
               R"(,"distributedInfo":{"rank": 5},"baseTimeNanoseconds":1711964646000000000})",
       }) {
    auto t = ParseText(text);
    ASSERT_TRUE(t.ok()) << t.status() << " in " << text;
    EXPECT_EQ(t->base_time_unix_ns, 1711964646000000000) << text;
    EXPECT_EQ(t->events.size(), 1u) << text;
  }
  auto t = ParseText("{" + events + R"(,"distributedInfo":{"rank": 5, "world_size": 8}})");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->json_rank, 5u);
  EXPECT_EQ(t->hta_rank, 5u);
  EXPECT_EQ(t->world_size, 8u);
}

// The reader gets the file in 4 MiB pieces: the last member must survive a piece boundary
// anywhere in it (in the key, at the colon, in the number, just before the closing brace).
TEST(KinetoTraceReader, ReadsTheLastMemberAcrossAPieceBoundary) {
  constexpr size_t kPiece = 4 << 20;
  const std::string head = R"({"traceEvents":[{"ph":"X","cat":"kernel","name":")";
  const std::string mid = R"(","ts":1,"dur":2,"args":{}}],)";
  const std::string last = R"("baseTimeNanoseconds": 1711964646000000000)";
  for (size_t cut : {size_t{0}, size_t{1}, size_t{10}, size_t{21}, size_t{22}, size_t{30},
                     last.size() - 1, last.size()}) {
    // The piece ends `cut` bytes into the last member.
    const size_t pad = kPiece - head.size() - mid.size() - cut;
    const std::string text = head + std::string(pad, 'n') + mid + last + "}";
    ASSERT_EQ(text.substr(kPiece - cut, 1), last.substr(0, 1));
    auto t = ParseText(text);
    ASSERT_TRUE(t.ok()) << t.status() << " cut " << cut;
    EXPECT_EQ(t->base_time_unix_ns, 1711964646000000000) << "cut " << cut;
    ASSERT_EQ(t->events.size(), 1u);
    EXPECT_EQ(t->str(t->events[0].name).size(), pad);
  }
}

TEST(KinetoTraceReader, BadFilesNameTheFileAndTheReason) {
  auto missing = ReadKinetoTrace("/nonexistent/trace.json");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), ::testing::HasSubstr("/nonexistent/trace.json"));

  auto path = WriteTemp("broken.json", R"({"traceEvents":[{"ph":"X","ts":1,)");
  auto broken = ReadKinetoTrace(path);
  ASSERT_FALSE(broken.ok());
  EXPECT_THAT(broken.status().message(), ::testing::HasSubstr(path.string()));

  auto no_events = ParseText(R"({"schemaVersion":1})");
  EXPECT_THAT(no_events.status().message(), ::testing::HasSubstr("no `traceEvents`"));
  auto array = ParseText(R"([1,2])");
  EXPECT_THAT(array.status().message(), ::testing::HasSubstr("not a Kineto trace"));

  // A gzip file cut short.
  std::ifstream in(kKineto + "/hta-trace-filter-2rank/sampled_rank-0.json.gz", std::ios::binary);
  std::string gz((std::istreambuf_iterator<char>(in)), {});
  auto cut = WriteTemp("cut.json.gz", gz.substr(0, gz.size() / 2));
  auto truncated = ReadKinetoTrace(cut);
  ASSERT_FALSE(truncated.ok());
  EXPECT_THAT(truncated.status().message(), ::testing::HasSubstr("truncated gzip"));
  EXPECT_THAT(truncated.status().message(), ::testing::HasSubstr(cut.string()));
}

TEST(TraceFileBuffer, InflatesToTheDecompressedSize) {
  auto b = TraceFileBuffer::Read(kKineto + "/hta-trace-filter-2rank/sampled_rank-0.json.gz");
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_TRUE(b->was_gzip());
  EXPECT_EQ(b->size(), 1759570u);
}

TEST(TraceFileBuffer, AGzipTrailerClaimingGigabytesIsOnlyAHint) {
  // ISIZE said 4 GiB for 18 bytes of JSON: the buffer was allocated at that size.
  const std::string json = R"({"traceEvents":[]})";
  std::string gz(compressBound(json.size()) + 32, '\0');
  z_stream zs{};
  ASSERT_EQ(deflateInit2(&zs, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY), Z_OK);
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(json.data()));
  zs.avail_in = json.size();
  zs.next_out = reinterpret_cast<Bytef*>(gz.data());
  zs.avail_out = gz.size();
  ASSERT_EQ(deflate(&zs, Z_FINISH), Z_STREAM_END);
  gz.resize(zs.total_out);
  deflateEnd(&zs);
  gz.replace(gz.size() - 4, 4, "\xff\xff\xff\xff");
  // zlib checks ISIZE at the end: the file is corrupt, an error (not a 4 GiB buffer first).
  auto b = TraceFileBuffer::Read(WriteTemp("isize.json.gz", gz));
  ASSERT_FALSE(b.ok());
  EXPECT_THAT(b.status().message(), ::testing::HasSubstr("corrupt gzip"));
}

TEST(KinetoTraceReader, NumbersBeyondInt64NanosecondsAreAbsentNotOverflowed) {
  // 16 digits of µs can exceed int64 ns; a huge args.stream was an undefined conversion
  // (fuzz_kineto). Such values read as absent.
  auto t = ParseText(R"({"traceEvents":[
    {"ph":"X","cat":"kernel","name":"a","ts":9999999999999999,"dur":1,"args":{"stream":1e300}},
    {"ph":"X","cat":"kernel","name":"b","ts":9223372036854774,"dur":1,"args":{"stream":-1e19}},
    {"ph":"X","cat":"kernel","name":"c","ts":1700000000000000.123,"dur":2}]})");
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->events.size(), 2u);                     // `a` has no usable ts
  EXPECT_EQ(t->events[0].ts_ns, 9223372036854774000);  // the largest that fits
  EXPECT_EQ(t->events[0].stream, -1);
  EXPECT_EQ(t->events[1].ts_ns, 1700000000000000123);  // 16 digits stay exact
}

TEST(KinetoTraceReader, PiecesGiveTheSameTraceAsTheWholeFile) {
  auto b = TraceFileBuffer::Read(kKineto + "/hta-trace-filter-2rank/sampled_rank-0.json.gz");
  ASSERT_TRUE(b.ok()) << b.status();
  auto whole = ParseKinetoTrace(b->view(), "whole");
  ASSERT_TRUE(whole.ok()) << whole.status();
  for (size_t piece : {1u, 7u, 4096u}) {
    auto pieces = ParseKinetoTraceInPieces(b->view(), piece, "pieces");
    ASSERT_TRUE(pieces.ok()) << pieces.status();
    EXPECT_EQ(pieces->events.size(), whole->events.size()) << piece;
    EXPECT_EQ(pieces->strings, whole->strings) << piece;
    EXPECT_EQ(pieces->hta_rank, whole->hta_rank) << piece;
  }
}

TEST(FindKinetoTraces, FindsJsonAndGzipRecursively) {
  auto found = FindKinetoTraces({kKineto});
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(found->size(), 4u);
  EXPECT_FALSE(FindKinetoTraces({"/nonexistent"}).ok());
}

}  // namespace
}  // namespace rankwatch
