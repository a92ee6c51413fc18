// The compute orders of torch's schedules against PyTorch's own: its test artifacts for ZB1P
// and DualPipeV (tests/fixtures/pytorch-pipelining/), and the orders PyTorch 2.13's
// ScheduleInterleaved1F1B and ScheduleZBVZeroBubble compute (`_calculate_single_rank_operations`,
// printed once and kept here as data).
#include "collectors/simulator/schedule_orders.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "collectors/simulator/pipeline_schedule.h"

namespace rankwatch {
namespace {

// torch's notation: global stage, F / I (input-gradient) / W / B (full backward), microbatch.
std::string Format(const PipelineSpec& spec, uint32_t stage) {
  std::string out;
  for (const ComputeAction& a :
       RankComputeOrder(spec.schedule, spec.pp, spec.vpp, spec.microbatches, stage)) {
    const char* letter = a.work == ComputeWork::kForward         ? "F"
                         : a.work == ComputeWork::kBackward      ? "B"
                         : a.work == ComputeWork::kBackwardInput ? "I"
                                                                 : "W";
    if (!out.empty()) out += ",";
    out += std::to_string(spec.GlobalChunk(stage, a.chunk)) + letter + std::to_string(a.microbatch);
  }
  return out;
}

// An artifact's rows in the new notation, bubbles and OVERLAP_F_B brackets dropped (torch runs
// an overlapped pair one after the other). `zb1p_notation`: B is the input-gradient backward.
std::vector<std::string> Artifact(const std::string& file, bool zb1p_notation) {
  std::ifstream in(std::string(RANKWATCH_FIXTURES) + "/pytorch-pipelining/" + file);
  EXPECT_TRUE(in.good()) << file;
  std::vector<std::string> rows;
  std::string line;
  while (std::getline(in, line)) {
    std::string row, cell;
    std::stringstream cells(line);
    while (std::getline(cells, cell, ',')) {
      if (cell.empty()) continue;
      std::vector<std::string> parts = {cell};
      if (cell.front() == '(') {
        const std::string inner = cell.substr(1, cell.find(')') - 1);
        parts = {inner.substr(0, inner.find(';')), inner.substr(inner.find(';') + 1)};
      }
      for (std::string a : parts) {
        const size_t b = a.find('B');
        if (zb1p_notation && b != std::string::npos) a[b] = 'I';
        row += (row.empty() ? "" : ",") + a;
      }
    }
    rows.push_back(row);
  }
  return rows;
}

TEST(ScheduleOrdersTest, Zb1pIsPyTorchsArtifact) {
  const auto rows = Artifact("zb1p_2rank_2stagep_compute.csv", true);
  ASSERT_EQ(rows.size(), 2u);
  const PipelineSpec spec{
      .pp = 2, .microbatches = 8, .schedule = PipelineScheduleKind::kZeroBubble, .vpp = 2};
  for (uint32_t r = 0; r < 2; ++r) EXPECT_EQ(Format(spec, r), rows[r]) << "rank " << r;
}

TEST(ScheduleOrdersTest, DualPipeVIsPyTorchsArtifact) {
  const auto rows = Artifact("dualpipev_4rank_10mb.csv", false);
  ASSERT_EQ(rows.size(), 4u);
  const PipelineSpec spec{
      .pp = 4, .microbatches = 10, .schedule = PipelineScheduleKind::kDualPipeV, .vpp = 2};
  for (uint32_t r = 0; r < 4; ++r) EXPECT_EQ(Format(spec, r), rows[r]) << "rank " << r;
}

TEST(ScheduleOrdersTest, Interleaved1F1BIsPyTorchs) {
  // ScheduleInterleaved1F1B, 4 ranks x 2 stages, 8 microbatches.
  const std::vector<std::string> torch = {
      "0F0,0F1,0F2,0F3,4F0,4F1,4F2,4F3,0F4,0F5,0F6,4B0,0F7,4B1,4F4,4B2,4F5,4B3,4F6,0B0,"
      "4F7,0B1,0B2,0B3,4B4,4B5,4B6,4B7,0B4,0B5,0B6,0B7",
      "1F0,1F1,1F2,1F3,5F0,5F1,5F2,5F3,1F4,5B0,1F5,5B1,1F6,5B2,1F7,5B3,5F4,1B0,5F5,1B1,"
      "5F6,1B2,5F7,1B3,5B4,5B5,5B6,5B7,1B4,1B5,1B6,1B7",
      "2F0,2F1,2F2,2F3,6F0,6F1,6F2,6B0,6F3,6B1,2F4,6B2,2F5,6B3,2F6,2B0,2F7,2B1,6F4,2B2,"
      "6F5,2B3,6F6,6B4,6F7,6B5,6B6,6B7,2B4,2B5,2B6,2B7",
      "3F0,3F1,3F2,3F3,7F0,7B0,7F1,7B1,7F2,7B2,7F3,7B3,3F4,3B0,3F5,3B1,3F6,3B2,3F7,3B3,"
      "7F4,7B4,7F5,7B5,7F6,7B6,7F7,7B7,3B4,3B5,3B6,3B7",
  };
  const PipelineSpec spec{
      .pp = 4, .microbatches = 8, .schedule = PipelineScheduleKind::kInterleaved1F1B, .vpp = 2};
  for (uint32_t r = 0; r < 4; ++r) EXPECT_EQ(Format(spec, r), torch[r]) << "rank " << r;
}

TEST(ScheduleOrdersTest, ZbvIsPyTorchs) {
  // ScheduleZBVZeroBubble, 4 ranks, 8 microbatches (fewer than the 2 x 4 - 1 that fill it
  // would drop some: 5 microbatches too).
  for (const auto& [mb, torch] : std::vector<std::pair<uint32_t, std::vector<std::string>>>{
           {8,
            {"0F0,0F1,0F2,0F3,0F4,0F5,0F6,7F0,7I0,7W0,7F1,7I1,7W1,7F2,7I2,7W2,7F3,7I3,7W3,0F7,"
             "0I0,0W0,7F4,7I4,7W4,0I1,0W1,7F5,7I5,7W5,0I2,0W2,7F6,7I6,7W6,0I3,0W3,7F7,7I7,7W7,"
             "0I4,0W4,0I5,0W5,0I6,0W6,0I7,0W7",
             "1F0,1F1,1F2,1F3,1F4,6F0,1F5,6F1,6I0,6W0,6F2,6I1,6W1,6F3,6I2,6W2,1F6,1I0,1W0,6F4,"
             "6I3,6W3,1F7,1I1,1W1,6F5,6I4,6W4,1I2,1W2,6F6,6I5,6W5,1I3,1W3,6F7,6I6,6W6,1I4,6I7,"
             "1I5,1W4,1I6,1W5,1I7,1W6,6W7,1W7",
             "2F0,2F1,2F2,5F0,2F3,5F1,2F4,5F2,5I0,5W0,5F3,5I1,5W1,2F5,2I0,2W0,5F4,5I2,5W2,2F6,"
             "2I1,2W1,5F5,5I3,5W3,2F7,2I2,2W2,5F6,5I4,5W4,2I3,2W3,5F7,5I5,5W5,2I4,5I6,2I5,5I7,"
             "2I6,2W4,2I7,2W5,5W6,5W7,2W6,2W7",
             "3F0,4F0,3F1,4F1,3F2,4F2,3F3,4F3,4I0,4W0,3F4,3I0,3W0,4F4,4I1,4W1,3F5,3I1,3W1,4F5,"
             "4I2,4W2,3F6,3I2,3W2,4F6,4I3,4W3,3F7,3I3,3W3,4F7,4I4,4W4,3I4,4I5,3I5,4I6,3I6,4I7,"
             "3I7,3W4,4W5,4W6,4W7,3W5,3W6,3W7"}},
           {5,
            {"0F0,0F1,0F2,0F3,0F4,7F0,7I0,7W0,7F1,7I1,7W1,7F2,7I2,7W2,7F3,7I3,7W3,0I0,0W0,7F4,"
             "7I4,7W4,0I1,0W1,0I2,0W2,0I3,0W3,0I4,0W4",
             "1F0,1F1,1F2,1F3,1F4,6F0,6F1,6I0,6W0,6F2,6I1,6W1,6F3,6I2,6W2,1I0,1W0,6F4,6I3,6W3,"
             "1I1,1W1,6I4,6W4,1I2,1W2,1I3,1I4,1W3,1W4",
             "2F0,2F1,2F2,5F0,2F3,5F1,2F4,5F2,5I0,5W0,5F3,5I1,5W1,2I0,2W0,5F4,5I2,5W2,2I1,2W1,"
             "5I3,5W3,2I2,2W2,5I4,5W4,2I3,2I4,2W3,2W4",
             "3F0,4F0,3F1,4F1,3F2,4F2,3F3,4F3,4I0,4W0,3F4,3I0,3W0,4F4,4I1,4W1,3I1,3W1,4I2,4W2,"
             "3I2,3W2,4I3,4W3,3I3,4I4,3I4,3W3,4W4,3W4"}}}) {
    const PipelineSpec spec{
        .pp = 4, .microbatches = mb, .schedule = PipelineScheduleKind::kZbv, .vpp = 2};
    for (uint32_t r = 0; r < 4; ++r) EXPECT_EQ(Format(spec, r), torch[r]) << mb << " rank " << r;
  }
}

TEST(ScheduleOrdersTest, EveryScheduleRunsEachMicrobatchOnceAChunk) {
  using K = PipelineScheduleKind;
  for (const auto& [kind, vpp] : std::vector<std::pair<K, uint32_t>>{{K::kInterleaved1F1B, 2},
                                                                     {K::kInterleaved1F1B, 3},
                                                                     {K::kZeroBubble, 1},
                                                                     {K::kZeroBubble, 2},
                                                                     {K::kZbv, 2},
                                                                     {K::kDualPipeV, 2}}) {
    for (uint32_t pp : {2u, 3u, 4u}) {
      for (uint32_t mb : {2 * pp, 4 * pp}) {
        for (uint32_t stage = 0; stage < pp; ++stage) {
          // Per chunk and microbatch: forwards, backward inputs (full ones count for both
          // parts), weights.
          std::vector<int> f(vpp * mb), b(vpp * mb), w(vpp * mb);
          for (const ComputeAction& a : RankComputeOrder(kind, pp, vpp, mb, stage)) {
            const uint32_t i = a.chunk * mb + a.microbatch;
            ASSERT_LT(i, f.size());
            switch (a.work) {
              case ComputeWork::kForward: ++f[i]; break;
              case ComputeWork::kBackward:
                EXPECT_EQ(f[i], 1) << "a backward before its forward";
                ++b[i], ++w[i];
                break;
              case ComputeWork::kBackwardInput:
                EXPECT_EQ(f[i], 1) << "a backward before its forward";
                ++b[i];
                break;
              case ComputeWork::kBackwardWeight:
                EXPECT_EQ(b[i], 1) << "a weight backward before its input backward";
                ++w[i];
                break;
            }
          }
          for (size_t i = 0; i < f.size(); ++i) {
            EXPECT_EQ(f[i], 1);
            EXPECT_EQ(b[i], 1);
            EXPECT_EQ(w[i], 1);
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace rankwatch
