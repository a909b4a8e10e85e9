// UTF-8 helpers of the tokenizer: walking characters, validating, lossy conversion of arbitrary
// bytes (U+FFFD per maximal invalid subpart, as Rust's String::from_utf8_lossy, which
// `tokenizers` uses), GPT-2's byte <-> character alphabet, and the Unicode properties and
// normalization forms that come from ICU.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace pagedattn::tokenizer {

// The length of the UTF-8 character that starts with `lead` (1 for a stray byte).
inline size_t utf8_length(unsigned char lead) {
  if (lead < 0x80) return 1;
  if (lead >= 0xF0) return 4;
  if (lead >= 0xE0) return 3;
  if (lead >= 0xC0) return 2;
  return 1;
}

// Decodes the character at `position` of valid UTF-8 and moves past it.
char32_t next_codepoint(std::string_view text, size_t& position);
void append_utf8(std::string& out, char32_t codepoint);

// The length of the valid UTF-8 prefix of `bytes`.
size_t valid_utf8_prefix(std::string_view bytes);
inline bool is_valid_utf8(std::string_view bytes) {
  return valid_utf8_prefix(bytes) == bytes.size();
}
// Appends `bytes` with every maximal invalid subpart replaced by U+FFFD.
void append_lossy_utf8(std::string& out, std::string_view bytes);

// GPT-2's byte-level alphabet: every byte as a printable character (UTF-8 of 1 or 2 bytes).
struct ByteAlphabet {
  std::array<std::string, 256> char_of_byte;
  // The byte of a character below U+0200, -1 for characters outside the alphabet.
  std::array<int16_t, 512> byte_of_char;
};
const ByteAlphabet& byte_alphabet();

// Unicode properties as Rust's char methods define them (White_Space; Alphabetic or Numeric).
bool is_whitespace(char32_t codepoint);
bool is_alphanumeric(char32_t codepoint);

enum class NormalizationForm : uint8_t { kNfc, kNfd, kNfkc, kNfkd };
// Normalizes valid UTF-8 text in place (ICU).
void normalize(NormalizationForm form, std::string& text);
// Lowercases as Rust's str::to_lowercase (full case mapping, final sigma).
void lowercase(std::string& text);

}  // namespace pagedattn::tokenizer
