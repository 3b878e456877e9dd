// CSV data sets: one sample per line, comma-separated numbers, the label in the last (or first) column.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <optional>
#include <string_view>

#include "sinew/core/error.hpp"
#include "sinew/data/dataset.hpp"

namespace sinew::data {

namespace {

std::string_view trim(std::string_view s) {
  const auto blank = [](char c) { return c == ' ' || c == '\t' || c == '\r'; };
  while (!s.empty() && blank(s.front())) s.remove_prefix(1);
  while (!s.empty() && blank(s.back())) s.remove_suffix(1);
  return s;
}

// A whole field as a number; nullopt for anything else (empty, trailing junk, "1e999" out of range).
// std::from_chars is locale-independent, unlike strtod, so "1.5" parses the same everywhere.
template <class T>
std::optional<T> parse_number(std::string_view field) {
  field = trim(field);
  if (!field.empty() && field.front() == '+') field.remove_prefix(1);  // from_chars rejects a leading '+'
  if (field.empty()) return std::nullopt;
  T value{};
  const auto [end, ec] = std::from_chars(field.data(), field.data() + field.size(), value);
  if (ec != std::errc{} || end != field.data() + field.size()) return std::nullopt;
  return value;
}

void split_fields(std::string_view line, std::vector<std::string_view>& fields) {
  fields.clear();
  for (;;) {
    const std::size_t comma = line.find(',');
    fields.push_back(line.substr(0, comma));
    if (comma == std::string_view::npos) break;
    line.remove_prefix(comma + 1);
  }
}

}  // namespace

Dataset load_csv(const std::string& path, const CsvOptions& opts) {
  const bool shape_given = opts.channels != 0 || opts.height != 0 || opts.width != 0;
  if (shape_given && (opts.channels <= 0 || opts.height <= 0 || opts.width <= 0))
    SINEW_THROW(InvalidArgument,
                "CSV sample shape must be given in full (channels, height, width > 0), got {}x{}x{}",
                opts.channels, opts.height, opts.width);
  if (!std::isfinite(opts.scale))
    SINEW_THROW(InvalidArgument, "CSV feature scale must be finite, got {}", opts.scale);

  const std::string text = read_file(path);
  std::string_view rest(text);

  Dataset d;
  std::size_t columns = 0;  // fixed by the header or the first data line
  std::size_t line_no = 0;
  bool first_line = true;
  std::int32_t max_label = -1;
  std::vector<std::string_view> fields;

  while (!rest.empty()) {
    const std::size_t nl = rest.find('\n');
    const std::string_view line = trim(rest.substr(0, nl));
    rest.remove_prefix(nl == std::string_view::npos ? rest.size() : nl + 1);
    ++line_no;
    if (line.empty()) continue;

    split_fields(line, fields);
    if (columns == 0) {
      if (fields.size() < 2)
        SINEW_THROW(DataError, "{}:{}: a line needs a label and at least one feature, found {} column", path,
                    line_no, fields.size());
      columns = fields.size();
    } else if (fields.size() != columns) {
      SINEW_THROW(DataError, "{}:{}: ragged row: {} columns, earlier lines have {}", path, line_no,
                  fields.size(), columns);
    }

    // A first line with a non-numeric field and no empty one is a header ("x1,x2,label", also "0,1,label").
    // It still fixes the column count, so a mangled first data line mistaken for a header mostly shows up as
    // a ragged row below; an empty field marks a broken data line, not a header.
    if (first_line) {
      first_line = false;
      const bool numeric = std::all_of(fields.begin(), fields.end(), [](std::string_view f) {
        return parse_number<double>(f).has_value();
      });
      const bool any_empty =
          std::any_of(fields.begin(), fields.end(), [](std::string_view f) { return trim(f).empty(); });
      if (!numeric && !any_empty) continue;
    }

    const std::size_t label_col = opts.label_first ? 0 : columns - 1;
    const std::optional<double> label = parse_number<double>(fields[label_col]);
    if (!label || *label < 0 || *label != std::floor(*label) || *label > 1e6)
      SINEW_THROW(DataError, "{}:{}: label '{}' in column {} is not an integer in [0, 1000000]", path,
                  line_no, trim(fields[label_col]), label_col + 1);
    const auto label_value = static_cast<std::int32_t>(*label);
    d.labels.push_back(label_value);
    max_label = std::max(max_label, label_value);

    for (std::size_t c = 0; c < columns; ++c) {
      if (c == label_col) continue;
      const std::optional<float> value = parse_number<float>(fields[c]);
      if (!value) {
        if (trim(fields[c]).empty())
          SINEW_THROW(DataError, "{}:{}: column {} is empty", path, line_no, c + 1);
        SINEW_THROW(DataError, "{}:{}: column {} is not a number: '{}'", path, line_no, c + 1,
                    trim(fields[c]));
      }
      if (!std::isfinite(*value))
        SINEW_THROW(DataError, "{}:{}: column {} is not finite: '{}'", path, line_no, c + 1, trim(fields[c]));
      d.features.push_back(*value * opts.scale);
    }
  }

  if (d.labels.empty()) SINEW_THROW(DataError, "CSV file '{}' holds no samples", path);
  const auto features = static_cast<int>(columns - 1);
  if (shape_given) {
    if (opts.channels * opts.height * opts.width != features)
      SINEW_THROW(DataError, "CSV file '{}' has {} features per sample, but the shape {}x{}x{} needs {}",
                  path, features, opts.channels, opts.height, opts.width,
                  opts.channels * opts.height * opts.width);
    d.channels = opts.channels;
    d.height = opts.height;
    d.width = opts.width;
  } else {
    d.channels = 1;
    d.height = 1;
    d.width = features;
  }
  d.num_classes = max_label + 1;
  return d;
}

}  // namespace sinew::data
