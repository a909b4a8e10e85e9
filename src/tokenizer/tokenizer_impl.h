// The stages of a loaded tokenizer (Tokenizer::Impl), shared by tokenizer.cpp (load, encode,
// decode), config.cpp (tokenizer_config.json) and incremental_decoder.cpp.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "added_vocabulary.h"
#include "bpe.h"
#include "decoder.h"
#include "normalizer.h"
#include "pagedattn/tokenizer.h"
#include "post_processor.h"
#include "pre_tokenizer.h"

namespace pagedattn::tokenizer {

struct Tokenizer::Impl {
  std::string name;                             // the file, for messages
  std::unique_ptr<Normalizer> normalizer;       // may be null
  std::unique_ptr<PreTokenizer> pre_tokenizer;  // may be null
  std::unique_ptr<Bpe> model;
  std::unique_ptr<PostProcessor> post_processor;  // may be null
  std::unique_ptr<Decoder> decoder;               // may be null: tokens joined by spaces
  AddedVocabulary added;
  TokenizerConfig config;
  int64_t vocab_size = 0;
  // By id: whether skip_special_tokens drops it (its string is a special added token's).
  std::vector<bool> special_by_id;
  // When the decoder joins each token's bytes independently (Decoder::bytes_per_token, ByteLevel
  // alone): every id's bytes, id_bytes[id_bytes_offset[id] .. id_bytes_offset[id + 1]), so that
  // decode() concatenates them and repairs the UTF-8 without running the chain (which copies
  // every token string and maps it character by character: the cost of the engine's streaming
  // detokenization). Ids without a token (token() null) are in id_absent.
  bool bytes_by_id = false;
  std::string id_bytes;
  std::vector<uint32_t> id_bytes_offset;  // [vocab_size + 1]
  std::vector<bool> id_absent;            // [vocab_size]

  // The token string of an id (an added token's content first); null past the vocabulary.
  const std::string_view* token(TokenId id, std::string_view& storage) const;
  // Appends decode(ids) to `out`.
  void decode(std::span<const TokenId> ids, bool skip_special_tokens, std::string& out) const;
  // Whether `id` is a <0xNN> token that a ByteFallback decoder turns into a byte.
  bool is_byte_fallback_token(TokenId id) const;
};

// Reads tokenizer_config.json (and chat_template.jinja's text, which may be empty).
TokenizerConfig read_config(std::string_view config_json, std::string_view config_name,
                            std::string_view chat_template_jinja, const Tokenizer& tokenizer);

}  // namespace pagedattn::tokenizer
