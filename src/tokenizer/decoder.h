// Decoders: token strings -> text (tokenizer.json "decoder"). Each stage rewrites the list of
// token strings as tokenizers' decode_chain does; the text is their concatenation.
// Supported: ByteLevel, ByteFallback, Fuse, Strip, Replace, Metaspace, Sequence.
//
// bytes_chain is the same pipeline for Tokenizer::token_bytes: the bytes a token stands for in
// the middle of a text. It differs from decode_chain in two ways only: nothing is repaired
// (invalid UTF-8 stays as it is instead of becoming U+FFFD), and what trims the start of a
// whole text is left out (a Strip after the tokens were fused into one text, Metaspace's rule
// that the first token loses its leading space).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "json_node.h"

namespace pagedattn::tokenizer {

class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual void decode_chain(std::vector<std::string>& tokens) const = 0;
  // `fused` says whether an earlier stage joined the tokens into one text (ByteLevel and Fuse
  // do); a stage that joins them sets it.
  virtual void bytes_chain(std::vector<std::string>& tokens, bool& fused) const {
    (void)fused;
    decode_chain(tokens);
  }
  // Whether this decoder (or a member of its sequence) is ByteFallback: the text of a run of
  // <0xNN> tokens depends on the whole run (the incremental decoder holds such runs back).
  virtual bool has_byte_fallback() const { return false; }
  // Whether decode_chain's text is the lossy UTF-8 of the concatenation of each token's own bytes
  // (ByteLevel alone): then append_token_bytes gives those bytes, and a tokenizer maps every id
  // once at load instead of running the chain on every decode.
  virtual bool bytes_per_token() const { return false; }
  virtual void append_token_bytes(std::string_view token, std::string& bytes) const {
    (void)token;
    (void)bytes;
  }
};

std::unique_ptr<Decoder> make_decoder(const JsonNode& node);

// A <0xNN> token's byte (tokens of six characters "<0x" hex hex ">"), -1 otherwise.
int byte_fallback_value(std::string_view token);

}  // namespace pagedattn::tokenizer
