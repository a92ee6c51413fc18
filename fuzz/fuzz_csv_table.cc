// fuzz_csv_table: CsvTable::Parse, then every accessor on every cell (columns past the header
// and rows shorter than it included).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "fuzz/fuzz_support.h"
#include "traces/csv_table.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto table =
      rankwatch::CsvTable::Parse(std::string_view(reinterpret_cast<const char*>(data), size), "f");
  if (!table.ok()) return 0;
  const auto& header = table->header();
  RANKWATCH_FUZZ_CHECK(!header.empty());
  // At most 256 columns (a line of 30,000 commas would make this quadratic, not the parser).
  const size_t columns = std::min<size_t>(header.size(), 256);
  for (size_t i = 0; i < columns; ++i) {
    const std::string& name = header[i];
    auto c = table->Column(name);
    RANKWATCH_FUZZ_CHECK(c.has_value() && c <= i && header[*c] == name);
    (void)table->Column(name.substr(0, name.size() / 2), /*prefix=*/true);
  }
  for (size_t row = 0; row < table->rows(); ++row) {
    (void)table->line_of(row);
    for (size_t col = 0; col <= columns; ++col) {
      (void)table->Cell(row, col);
      auto n = table->Number(row, col);
      if (n.ok() && n->has_value()) RANKWATCH_FUZZ_CHECK(**n == **n);  // finite, not NaN
    }
  }
  return 0;
}
