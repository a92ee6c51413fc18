#include "traces/csv_table.h"

#include <gtest/gtest.h>

namespace rankwatch {
namespace {

TEST(CsvTableTest, HandlesCrlfTabsNaRaggedRowsAndQuotes) {
  auto t = CsvTable::Parse(
      "Iteration ID,FP Start(us),Data Aug Bound(us),Name\r\n"
      "1,830074691.065\t,N/A,\"a,b\"\r\n"
      "2,830074791.5\t\r\n",
      "x.csv");
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->rows(), 2u);
  EXPECT_EQ(*t->Column("FP Start", /*prefix=*/true), 1u);
  EXPECT_FALSE(t->Column("FP Start").has_value());
  EXPECT_DOUBLE_EQ(**t->Number(0, 1), 830074691.065);
  EXPECT_FALSE(t->Number(0, 2)->has_value());  // N/A
  EXPECT_EQ(t->Cell(0, 3), "a,b");
  EXPECT_FALSE(t->Number(1, 2)->has_value());  // ragged: missing cell
  EXPECT_EQ(t->line_of(1), 3u);
}

TEST(CsvTableTest, BadNumbersAndEmptyFilesAreErrors) {
  auto t = CsvTable::Parse("a,b\n1,x\n", "bad.csv");
  ASSERT_TRUE(t.ok());
  auto n = t->Number(0, 1);
  ASSERT_FALSE(n.ok());
  EXPECT_EQ(n.status().message(), "bad.csv:2: column 'b' holds 'x', not a number");
  EXPECT_FALSE(CsvTable::Parse("\n\n", "empty.csv").ok());
  EXPECT_FALSE(CsvTable::Read("/no/such.csv").ok());
}

}  // namespace
}  // namespace rankwatch
