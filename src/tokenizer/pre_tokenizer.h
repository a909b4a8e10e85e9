// Pre-tokenizers: split normalized text into the words the model tokenizes one by one
// (tokenizer.json "pre_tokenizer"). Supported: Split, ByteLevel, Digits, Metaspace, Sequence.
//
// Layout: the words of a segment are byte ranges of one buffer (Words), so that splitting costs
// no copy; ByteLevel and Metaspace, which change the text, write a new buffer.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "json_node.h"

namespace pagedattn::tokenizer {

struct Words {
  std::string text;
  std::vector<std::pair<uint32_t, uint32_t>> ranges;  // [start, end) in text, none empty
  // Whether the segment starts at the start of the input (no added token before it): Metaspace's
  // prepend_scheme "first".
  bool first_segment = true;

  void reset(std::string_view segment, bool first) {
    text.assign(segment);
    ranges.clear();
    if (!text.empty()) ranges.emplace_back(0, static_cast<uint32_t>(text.size()));
    first_segment = first;
  }
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Rewrites `words`; `scratch` is a buffer the stage may use (swapped in when text changes).
  virtual void pre_tokenize(Words& words, Words& scratch) const = 0;
};

std::unique_ptr<PreTokenizer> make_pre_tokenizer(const JsonNode& node);

// How the pieces of a split are kept (tokenizers' SplitDelimiterBehavior).
enum class SplitBehavior : uint8_t {
  kRemoved,
  kIsolated,
  kMergedWithPrevious,
  kMergedWithNext,
  kContiguous
};
// Splits [start, end) by `matches` (sorted, non-overlapping, inside it) and appends the pieces.
void split_range(uint32_t start, uint32_t end,
                 const std::vector<std::pair<size_t, size_t>>& matches, SplitBehavior behavior,
                 bool invert, std::vector<std::pair<uint32_t, uint32_t>>& out);

}  // namespace pagedattn::tokenizer
