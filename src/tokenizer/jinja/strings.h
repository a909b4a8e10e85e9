// Python's str operations over UTF-8 text, as the methods and filters need them. Whitespace is
// Python's ASCII whitespace (space, \t, \n, \r, \v, \f and \x1c-\x1f); case mapping is ASCII-only
// (other letters are left as they are); indexes are code points.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace pagedattn::jinja {

bool is_python_space(char c);
std::string python_strip(std::string_view text, const std::optional<std::string>& chars, bool left,
                         bool right);
// str.split / str.rsplit; maxsplit < 0: no limit; no separator: runs of whitespace.
std::vector<std::string> python_split(std::string_view text,
                                      const std::optional<std::string>& separator, int64_t maxsplit,
                                      bool from_right);
std::vector<std::string> python_splitlines(std::string_view text);
std::string python_replace(std::string_view text, std::string_view old, std::string_view new_text,
                           int64_t count);
int64_t python_find(std::string_view text, std::string_view sub, bool from_right);
int64_t python_count(std::string_view text, std::string_view sub);
std::string ascii_upper(std::string text);
std::string ascii_lower(std::string text);
std::string python_title(std::string_view text);
std::string python_capitalize(std::string_view text);

}  // namespace pagedattn::jinja
