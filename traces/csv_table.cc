#include "traces/csv_table.h"

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace rankwatch {
namespace {

std::string_view Trim(std::string_view s) {
  const auto space = [](char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; };
  while (!s.empty() && space(s.front())) s.remove_prefix(1);
  while (!s.empty() && space(s.back())) s.remove_suffix(1);
  return s;
}

std::vector<std::string> SplitLine(std::string_view line) {
  std::vector<std::string> cells;
  std::string cell;
  bool quoted = false;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quoted) {
      if (c == '"' && i + 1 < line.size() && line[i + 1] == '"') {
        cell += '"';
        ++i;
      } else if (c == '"') {
        quoted = false;
      } else {
        cell += c;
      }
    } else if (c == '"') {
      quoted = true;
    } else if (c == ',') {
      cells.push_back(std::move(cell));
      cell.clear();
    } else {
      cell += c;
    }
  }
  cells.push_back(std::move(cell));
  return cells;
}

}  // namespace

absl::StatusOr<CsvTable> CsvTable::Read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(path + ": cannot open");
  std::stringstream ss;
  ss << in.rdbuf();
  return Parse(ss.str(), path);
}

absl::StatusOr<CsvTable> CsvTable::Parse(std::string_view text, const std::string& name) {
  CsvTable t;
  t.name_ = name;
  size_t line_no = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (Trim(line).empty()) continue;
    std::vector<std::string> cells = SplitLine(line);
    if (t.header_.empty()) {
      for (std::string& c : cells) c = std::string(Trim(c));
      t.header_ = std::move(cells);
    } else {
      t.rows_.push_back(std::move(cells));
      t.lines_.push_back(line_no);
    }
  }
  if (t.header_.empty()) return absl::InvalidArgumentError(name + ": empty file, no header line");
  return t;
}

std::optional<size_t> CsvTable::Column(std::string_view name, bool prefix) const {
  for (size_t i = 0; i < header_.size(); ++i) {
    if (prefix ? std::string_view(header_[i]).starts_with(name) : header_[i] == name) return i;
  }
  return std::nullopt;
}

std::string_view CsvTable::Cell(size_t row, size_t column) const {
  const auto& cells = rows_[row];
  return column < cells.size() ? Trim(cells[column]) : std::string_view();
}

absl::StatusOr<std::optional<double>> CsvTable::Number(size_t row, size_t column) const {
  const std::string_view cell = Cell(row, column);
  if (cell.empty() || cell == "N/A" || cell == "None" || cell == "null" || cell == "-") {
    return std::optional<double>();
  }
  const std::string text(cell);
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (end != text.c_str() + text.size() || !std::isfinite(v)) {
    return absl::InvalidArgumentError(name_ + ":" + std::to_string(lines_[row]) + ": column '" +
                                      (column < header_.size() ? header_[column] : "?") +
                                      "' holds '" + text + "', not a number");
  }
  return std::optional<double>(v);
}

}  // namespace rankwatch
