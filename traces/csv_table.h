// CsvTable: the vendor CSV files rankwatch reads (msprof, MindSpore, torch_npu), with their
// quirks: CRLF or LF line endings, numbers terminated by a TAB, `N/A` / `None` / `null` /
// empty cells, rows shorter than the header, columns found by name (or name prefix).
//
// Not thread-safe; plain value type.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace rankwatch {

class CsvTable {
 public:
  // Reads and splits `path`. Quoted cells ("a,b") are supported; a file without a header
  // line is an error naming the file.
  static absl::StatusOr<CsvTable> Read(const std::string& path);
  static absl::StatusOr<CsvTable> Parse(std::string_view text, const std::string& name);

  const std::vector<std::string>& header() const { return header_; }
  size_t rows() const { return rows_.size(); }
  // 1-based line number of data row `row` in the file, for error messages.
  size_t line_of(size_t row) const { return lines_[row]; }

  // Index of the first column whose name equals `name`, or starts with it when `prefix`.
  std::optional<size_t> Column(std::string_view name, bool prefix = false) const;

  // The trimmed text of a cell ("" for cells missing from a short row).
  std::string_view Cell(size_t row, size_t column) const;
  // The cell as a number; nullopt for empty and N/A-like cells. A cell that is neither is an
  // InvalidArgument error naming the file, line and column.
  absl::StatusOr<std::optional<double>> Number(size_t row, size_t column) const;

  const std::string& name() const { return name_; }

 private:
  std::string name_;
  std::vector<std::string> header_;
  std::vector<std::vector<std::string>> rows_;
  std::vector<size_t> lines_;
};

}  // namespace rankwatch
