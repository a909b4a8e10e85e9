// Normalizers: the text transformations before pre-tokenization (tokenizer.json "normalizer").
// Supported: NFC, NFD, NFKC, NFKD, Lowercase, Prepend, Replace, Sequence.
#pragma once

#include <memory>
#include <string>

#include "json_node.h"

namespace pagedattn::tokenizer {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  // Normalizes valid UTF-8 text in place.
  virtual void normalize(std::string& text) const = 0;
};

// The normalizer of a JSON section (an object with "type"); an Error for an unknown type.
std::unique_ptr<Normalizer> make_normalizer(const JsonNode& node);

}  // namespace pagedattn::tokenizer
