// Parsing of benchmark rows (see bench_rows.h).
#include "tools/bench/bench_rows.h"

#include <fmt/format.h>

#include <exception>

#include "core/check.h"

namespace pagedattn::tools {
namespace {

int32_t parse_positive(const std::string& text, std::string_view option, const std::string& item) {
  size_t used = 0;
  int value = 0;
  try {
    value = std::stoi(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  PA_CHECK(used == text.size() && value >= 1, "{}: '{}' is not a row (expected BxL, e.g. 64x8192)",
           option, item);
  return value;
}

}  // namespace

std::string BatchLen::name() const {
  if (ragged) return fmt::format("ragged{}/{}", batch, kv_len);
  if (q_len > 0 && q_len != kv_len) return fmt::format("{}x{}/{}", batch, q_len, kv_len);
  return fmt::format("{}x{}", batch, kv_len);
}

std::vector<BatchLen> parse_batch_lens(const std::string& text, std::string_view option) {
  std::vector<BatchLen> rows;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find(',', start);
    if (end == std::string::npos) end = text.size();
    const std::string item = text.substr(start, end - start);
    start = end + 1;
    if (item.empty()) continue;
    BatchLen row;
    std::string rest = item;
    if (rest.rfind("ragged", 0) == 0) {
      row.ragged = true;
      rest = rest.substr(6);
      const size_t slash = rest.find('/');
      PA_CHECK(slash != std::string::npos, "{}: '{}' is not a row (expected raggedB/L)", option,
               item);
      row.batch = parse_positive(rest.substr(0, slash), option, item);
      row.kv_len = parse_positive(rest.substr(slash + 1), option, item);
      rows.push_back(row);
      continue;
    }
    const size_t x = rest.find('x');
    PA_CHECK(x != std::string::npos, "{}: '{}' is not a row (expected BxL, e.g. 64x8192)", option,
             item);
    row.batch = parse_positive(rest.substr(0, x), option, item);
    rest = rest.substr(x + 1);
    const size_t slash = rest.find('/');
    if (slash != std::string::npos) {
      row.q_len = parse_positive(rest.substr(0, slash), option, item);
      row.kv_len = parse_positive(rest.substr(slash + 1), option, item);
      PA_CHECK(row.q_len <= row.kv_len, "{}: '{}': {} new tokens exceed the {} of the KV", option,
               item, row.q_len, row.kv_len);
    } else {
      row.kv_len = parse_positive(rest, option, item);
    }
    rows.push_back(row);
  }
  PA_CHECK(!rows.empty(), "{}: no rows in '{}'", option, text);
  return rows;
}

}  // namespace pagedattn::tools
