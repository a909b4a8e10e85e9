// Python's str operations over UTF-8 (see strings.h). Separators and whitespace are ASCII, so
// byte-wise scanning never cuts a multi-byte character.
#include "jinja/strings.h"

#include <algorithm>
#include <cctype>

#include "jinja/value.h"

namespace pagedattn::jinja {

bool is_python_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f' ||
         (c >= '\x1c' && c <= '\x1f');
}

std::string python_strip(std::string_view text, const std::optional<std::string>& chars, bool left,
                         bool right) {
  // With chars: any of its code points is stripped; compare whole UTF-8 characters.
  std::vector<char32_t> strip_set;
  if (chars) strip_set = decode_utf8(*chars);
  std::vector<char32_t> characters = decode_utf8(text);
  auto strippable = [&](char32_t c) {
    if (!chars) return c < 0x80 && is_python_space(static_cast<char>(c));
    return std::find(strip_set.begin(), strip_set.end(), c) != strip_set.end();
  };
  size_t begin = 0, end = characters.size();
  if (left) {
    while (begin < end && strippable(characters[begin])) ++begin;
  }
  if (right) {
    while (end > begin && strippable(characters[end - 1])) --end;
  }
  return encode_utf8(std::vector<char32_t>(characters.begin() + begin, characters.begin() + end));
}

std::vector<std::string> python_split(std::string_view text,
                                      const std::optional<std::string>& separator, int64_t maxsplit,
                                      bool from_right) {
  std::vector<std::string> parts;
  if (separator) {
    if (!from_right) {
      size_t start = 0;
      while (maxsplit < 0 || static_cast<int64_t>(parts.size()) < maxsplit) {
        size_t found = text.find(*separator, start);
        if (found == std::string_view::npos) break;
        parts.emplace_back(text.substr(start, found - start));
        start = found + separator->size();
      }
      parts.emplace_back(text.substr(start));
      return parts;
    }
    size_t end = text.size();
    while (maxsplit < 0 || static_cast<int64_t>(parts.size()) < maxsplit) {
      if (end < separator->size()) break;
      size_t found = text.rfind(*separator, end - separator->size());
      if (found == std::string_view::npos) break;
      parts.emplace_back(text.substr(found + separator->size(), end - found - separator->size()));
      end = found;
    }
    parts.emplace_back(text.substr(0, end));
    std::reverse(parts.begin(), parts.end());
    return parts;
  }
  // Runs of whitespace; no empty parts; the unsplit rest keeps its inner whitespace.
  if (!from_right) {
    size_t i = 0;
    while (true) {
      while (i < text.size() && is_python_space(text[i])) ++i;
      if (i == text.size()) break;
      if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) {
        size_t end = text.size();
        while (end > i && is_python_space(text[end - 1])) --end;
        parts.emplace_back(text.substr(i, end - i));
        break;
      }
      size_t start = i;
      while (i < text.size() && !is_python_space(text[i])) ++i;
      parts.emplace_back(text.substr(start, i - start));
    }
    return parts;
  }
  size_t i = text.size();
  while (true) {
    while (i > 0 && is_python_space(text[i - 1])) --i;
    if (i == 0) break;
    if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) {
      size_t begin = 0;
      while (begin < i && is_python_space(text[begin])) ++begin;
      parts.emplace_back(text.substr(begin, i - begin));
      break;
    }
    size_t end = i;
    while (i > 0 && !is_python_space(text[i - 1])) --i;
    parts.emplace_back(text.substr(i, end - i));
  }
  std::reverse(parts.begin(), parts.end());
  return parts;
}

std::vector<std::string> python_splitlines(std::string_view text) {
  std::vector<std::string> lines;
  size_t start = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (c == '\n' || c == '\r' || c == '\v' || c == '\f' || (c >= '\x1c' && c <= '\x1e')) {
      lines.emplace_back(text.substr(start, i - start));
      if (c == '\r' && i + 1 < text.size() && text[i + 1] == '\n') ++i;
      start = i + 1;
    }
  }
  if (start < text.size()) lines.emplace_back(text.substr(start));
  return lines;
}

std::string python_replace(std::string_view text, std::string_view old, std::string_view new_text,
                           int64_t count) {
  std::string out;
  int64_t done = 0;
  if (old.empty()) {
    // Python inserts the replacement before every character and at the end.
    std::vector<char32_t> characters = decode_utf8(text);
    for (char32_t c : characters) {
      if (count < 0 || done < count) {
        out += new_text;
        ++done;
      }
      append_utf8(out, c);
    }
    if (count < 0 || done < count) out += new_text;
    return out;
  }
  size_t start = 0;
  while (count < 0 || done < count) {
    size_t found = text.find(old, start);
    if (found == std::string_view::npos) break;
    out += text.substr(start, found - start);
    out += new_text;
    start = found + old.size();
    ++done;
  }
  out += text.substr(start);
  return out;
}

int64_t python_find(std::string_view text, std::string_view sub, bool from_right) {
  size_t found = from_right ? text.rfind(sub) : text.find(sub);
  if (found == std::string_view::npos) return -1;
  return static_cast<int64_t>(code_point_count(text.substr(0, found)));
}

int64_t python_count(std::string_view text, std::string_view sub) {
  if (sub.empty()) return static_cast<int64_t>(code_point_count(text)) + 1;
  int64_t count = 0;
  for (size_t found = text.find(sub); found != std::string_view::npos;
       found = text.find(sub, found + sub.size())) {
    ++count;
  }
  return count;
}

std::string ascii_upper(std::string text) {
  for (char& c : text) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return text;
}

std::string ascii_lower(std::string text) {
  for (char& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return text;
}

std::string python_title(std::string_view text) {
  std::string out(text);
  bool previous_cased = false;
  for (char& c : out) {
    unsigned char u = static_cast<unsigned char>(c);
    bool cased = std::isalpha(u);
    if (cased) c = static_cast<char>(previous_cased ? std::tolower(u) : std::toupper(u));
    previous_cased = cased;
  }
  return out;
}

std::string python_capitalize(std::string_view text) {
  std::string out = ascii_lower(std::string(text));
  if (!out.empty()) out[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(out[0])));
  return out;
}

}  // namespace pagedattn::jinja
