// The engine's detokenizer over the tokenizer's incremental decoder: what joins the engine
// (which knows token ids only) and the tokenizer layer. Header-only, so that the engine library
// does not link the tokenizer (the GPU machine builds the engine without PCRE2 and ICU); a program
// that uses it links pagedattn::tokenizer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "pagedattn/engine_stop.h"
#include "pagedattn/tokenizer.h"

namespace pagedattn::engine {

class TokenizerDetokenizer final : public IncrementalDetokenizer {
 public:
  // The last few prompt tokens are fed first (their text dropped), so that a decoder that treats
  // the start of a sequence specially (SentencePiece's leading space) sees the generated tokens
  // as a continuation.
  TokenizerDetokenizer(const tokenizer::Tokenizer& tokenizer, bool skip_special_tokens,
                       std::span<const int32_t> prompt)
      : decoder_(tokenizer, skip_special_tokens) {
    constexpr size_t kContext = 4;
    const size_t start = prompt.size() > kContext ? prompt.size() - kContext : 0;
    std::string dropped;
    for (size_t i = start; i < prompt.size(); ++i) decoder_.feed(prompt[i], dropped);
  }
  std::string push(int32_t token) override { return decoder_.feed(token); }
  std::string flush() override { return decoder_.finish(); }

 private:
  tokenizer::IncrementalDecoder decoder_;
};

// A factory for the Engine; `tokenizer` must outlive the engine.
inline DetokenizerFactory make_detokenizer_factory(const tokenizer::Tokenizer& tokenizer,
                                                   bool skip_special_tokens = true) {
  return [&tokenizer, skip_special_tokens](std::span<const int32_t> prompt) {
    return std::make_unique<TokenizerDetokenizer>(tokenizer, skip_special_tokens, prompt);
  };
}

}  // namespace pagedattn::engine
