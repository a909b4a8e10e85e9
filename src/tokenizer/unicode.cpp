// UTF-8 and Unicode helpers (see unicode.h). Normalization and character properties come from
// ICU: PCRE2 has Unicode properties but no normalization, and ICU is Debian's well-kept
// implementation of both (libicu-dev).
#include "unicode.h"

#include <unicode/locid.h>
#include <unicode/normalizer2.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>

#include "core/check.h"

namespace pagedattn::tokenizer {

char32_t next_codepoint(std::string_view text, size_t& position) {
  auto byte = [&](size_t i) { return static_cast<unsigned char>(text[i]); };
  unsigned char lead = byte(position);
  size_t length = utf8_length(lead);
  if (position + length > text.size()) length = 1;
  char32_t codepoint = lead;
  if (length == 2) codepoint = (lead & 0x1F) << 6 | (byte(position + 1) & 0x3F);
  if (length == 3) {
    codepoint =
        (lead & 0x0F) << 12 | (byte(position + 1) & 0x3F) << 6 | (byte(position + 2) & 0x3F);
  }
  if (length == 4) {
    codepoint = (lead & 0x07) << 18 | (byte(position + 1) & 0x3F) << 12 |
                (byte(position + 2) & 0x3F) << 6 | (byte(position + 3) & 0x3F);
  }
  position += length;
  return codepoint;
}

void append_utf8(std::string& out, char32_t codepoint) {
  if (codepoint < 0x80) {
    out += static_cast<char>(codepoint);
  } else if (codepoint < 0x800) {
    out += static_cast<char>(0xC0 | codepoint >> 6);
    out += static_cast<char>(0x80 | (codepoint & 0x3F));
  } else if (codepoint < 0x10000) {
    out += static_cast<char>(0xE0 | codepoint >> 12);
    out += static_cast<char>(0x80 | (codepoint >> 6 & 0x3F));
    out += static_cast<char>(0x80 | (codepoint & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | codepoint >> 18);
    out += static_cast<char>(0x80 | (codepoint >> 12 & 0x3F));
    out += static_cast<char>(0x80 | (codepoint >> 6 & 0x3F));
    out += static_cast<char>(0x80 | (codepoint & 0x3F));
  }
}

namespace {

// The number of bytes of the longest valid start of a character at bytes[0..] (Unicode's
// "maximal subpart"); `complete` says whether that is a whole character.
size_t valid_subpart(std::string_view bytes, bool& complete) {
  auto byte = [&](size_t i) { return static_cast<unsigned char>(bytes[i]); };
  unsigned char lead = byte(0);
  complete = true;
  if (lead < 0x80) return 1;
  size_t length;
  unsigned char low = 0x80, high = 0xBF;  // the second byte's range
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    if (lead == 0xE0) low = 0xA0;
    if (lead == 0xED) high = 0x9F;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    if (lead == 0xF0) low = 0x90;
    if (lead == 0xF4) high = 0x8F;
  } else {
    complete = false;
    return 1;
  }
  for (size_t i = 1; i < length; ++i) {
    if (i >= bytes.size()) {
      complete = false;
      return i;
    }
    unsigned char next = byte(i);
    bool ok = i == 1 ? (next >= low && next <= high) : (next >= 0x80 && next <= 0xBF);
    if (!ok) {
      complete = false;
      return i;
    }
  }
  return length;
}

}  // namespace

size_t valid_utf8_prefix(std::string_view bytes) {
  size_t position = 0;
  while (position < bytes.size()) {
    if (static_cast<unsigned char>(bytes[position]) < 0x80) {
      ++position;
      continue;
    }
    bool complete;
    size_t length = valid_subpart(bytes.substr(position), complete);
    if (!complete) return position;
    position += length;
  }
  return position;
}

void append_lossy_utf8(std::string& out, std::string_view bytes) {
  size_t position = 0;
  while (position < bytes.size()) {
    size_t valid = valid_utf8_prefix(bytes.substr(position));
    out.append(bytes.substr(position, valid));
    position += valid;
    if (position == bytes.size()) break;
    bool complete;
    position += valid_subpart(bytes.substr(position), complete);
    out += "\xEF\xBF\xBD";
  }
}

const ByteAlphabet& byte_alphabet() {
  static const ByteAlphabet alphabet = [] {
    ByteAlphabet result;
    result.byte_of_char.fill(-1);
    int extra = 0;
    for (int byte = 0; byte < 256; ++byte) {
      bool printable = (byte >= '!' && byte <= '~') || (byte >= 0xA1 && byte <= 0xAC) ||
                       (byte >= 0xAE && byte <= 0xFF);
      char32_t codepoint = printable ? byte : 256 + extra++;
      append_utf8(result.char_of_byte[byte], codepoint);
      result.byte_of_char[codepoint] = static_cast<int16_t>(byte);
    }
    return result;
  }();
  return alphabet;
}

bool is_whitespace(char32_t codepoint) {
  return u_hasBinaryProperty(static_cast<UChar32>(codepoint), UCHAR_WHITE_SPACE);
}

bool is_alphanumeric(char32_t codepoint) {
  if (codepoint < 0x80) return std::isalnum(static_cast<int>(codepoint)) != 0;
  auto category = u_charType(static_cast<UChar32>(codepoint));
  return u_hasBinaryProperty(static_cast<UChar32>(codepoint), UCHAR_ALPHABETIC) ||
         category == U_DECIMAL_DIGIT_NUMBER || category == U_LETTER_NUMBER ||
         category == U_OTHER_NUMBER;
}

namespace {

const icu::Normalizer2& normalizer_of(NormalizationForm form) {
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* normalizer = nullptr;
  switch (form) {
    case NormalizationForm::kNfc:
      normalizer = icu::Normalizer2::getNFCInstance(status);
      break;
    case NormalizationForm::kNfd:
      normalizer = icu::Normalizer2::getNFDInstance(status);
      break;
    case NormalizationForm::kNfkc:
      normalizer = icu::Normalizer2::getNFKCInstance(status);
      break;
    case NormalizationForm::kNfkd:
      normalizer = icu::Normalizer2::getNFKDInstance(status);
      break;
  }
  PA_CHECK(U_SUCCESS(status) && normalizer, "ICU: no normalizer ({})", u_errorName(status));
  return *normalizer;
}

bool is_ascii(std::string_view text) {
  for (char c : text) {
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  }
  return true;
}

}  // namespace

void normalize(NormalizationForm form, std::string& text) {
  if (is_ascii(text)) return;  // ASCII is invariant under all four forms
  const icu::Normalizer2& normalizer = normalizer_of(form);
  UErrorCode status = U_ZERO_ERROR;
  icu::UnicodeString unicode = icu::UnicodeString::fromUTF8(text);
  if (normalizer.isNormalized(unicode, status) && U_SUCCESS(status)) return;
  status = U_ZERO_ERROR;
  icu::UnicodeString result = normalizer.normalize(unicode, status);
  PA_CHECK(U_SUCCESS(status), "ICU normalization failed: {}", u_errorName(status));
  text.clear();
  result.toUTF8String(text);
}

void lowercase(std::string& text) {
  if (is_ascii(text)) {
    for (char& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return;
  }
  icu::UnicodeString unicode = icu::UnicodeString::fromUTF8(text);
  unicode.toLower(icu::Locale::getRoot());
  text.clear();
  unicode.toUTF8String(text);
}

}  // namespace pagedattn::tokenizer
