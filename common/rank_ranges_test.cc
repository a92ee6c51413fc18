#include "common/rank_ranges.h"

#include <gtest/gtest.h>

#include <vector>

namespace rankwatch {
namespace {

TEST(FormatRankRangesTest, WritesRunsOfTwoOrMoreWithADashByDefault) {
  const std::vector<uint32_t> ranks = {0, 1, 2, 4, 6, 7};
  EXPECT_EQ(FormatRankRanges(ranks), "0-2, 4, 6-7");
  EXPECT_EQ(FormatRankRanges(std::vector<uint32_t>{}), "");
  EXPECT_EQ(FormatRankRanges(std::vector<uint32_t>{9}), "9");
}

TEST(FormatRankRangesTest, ListsRunsShorterThanMinRunOneByOne) {
  // The Flight Recorder's compact style: "0,1" for a pair, "3-5" from three on.
  const RankRangeStyle compact{",", "-", 3};
  EXPECT_EQ(FormatRankRanges(std::vector<uint32_t>{0, 1, 3, 4, 5, 9}, compact), "0,1,3-5,9");
  const RankRangeStyle dash{", ", "\u2013"};
  EXPECT_EQ(FormatRankRanges(std::vector<uint32_t>{0, 1, 2, 4}, dash), "0\u20132, 4");
}

}  // namespace
}  // namespace rankwatch
