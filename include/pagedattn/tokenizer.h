// The tokenizer: Hugging Face `tokenizer.json` (+ `tokenizer_config.json`) read as `tokenizers`
// reads it, with encode / decode equal to it id for id and byte for byte.
//
// The pipeline is the one of `tokenizers`, a stage per JSON section: added tokens are split out
// of the text first; the rest goes through the normalizer (NFC, NFKC, Prepend, Replace,
// Sequence), the pre-tokenizer (Split with a PCRE2 regex, ByteLevel, Digits, Metaspace,
// Sequence), the BPE model (byte-level or SentencePiece-style with byte fallback) and the post
// processor (TemplateProcessing, ByteLevel, Sequence). decode() maps ids to token strings and runs
// the decoder (ByteLevel, ByteFallback, Fuse, Strip, Replace, Metaspace, Sequence). A file this
// code cannot read exactly (another model type, an unknown stage, malformed JSON) throws
// pagedattn::Error naming the file, the JSON path and the value: never a wrong tokenization.
//
// A Tokenizer is immutable after loading and safe to use from several threads at once (the BPE
// word cache is internally locked).
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace pagedattn::tokenizer {

using TokenId = int32_t;

// What tokenizer_config.json says beside the pipeline. Special tokens are kept by content; their
// ids are looked up in the vocabulary (nullopt when absent or null).
struct TokenizerConfig {
  std::optional<std::string> bos_token, eos_token, pad_token, unk_token;
  std::optional<TokenId> bos_token_id, eos_token_id, pad_token_id, unk_token_id;
  // transformers' flags; encode() follows tokenizer.json's post processor as `tokenizers` does.
  std::optional<bool> add_bos_token, add_eos_token;
  // Named chat templates: {"default", "..."} from a string, a list of {name, template}, or
  // chat_template.jinja beside the config (which takes the name "default" over the config's).
  std::vector<std::pair<std::string, std::string>> chat_templates;
};

class Tokenizer {
 public:
  // Reads DIR/tokenizer.json, and DIR/tokenizer_config.json and DIR/chat_template.jinja when
  // present.
  static Tokenizer from_directory(const std::filesystem::path& directory);
  // tokenizer.json's text; `name` is used in error messages. `config_json` may be empty.
  static Tokenizer from_json(std::string_view tokenizer_json, std::string_view name,
                             std::string_view config_json = {},
                             std::string_view config_name = "tokenizer_config.json");

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // `text` is UTF-8 (invalid bytes are an Error). add_special_tokens runs the post processor's
  // template (BOS / EOS), as `tokenizers` does.
  std::vector<TokenId> encode(std::string_view text, bool add_special_tokens) const;
  // Ids past the vocabulary are dropped, as `tokenizers` does. Bytes that are not valid UTF-8
  // become U+FFFD exactly as `tokenizers` replaces them.
  std::string decode(std::span<const TokenId> ids, bool skip_special_tokens) const;

  // The number of ids: the model's vocabulary and the added tokens (the largest id + 1).
  int64_t vocab_size() const;
  std::optional<TokenId> token_to_id(std::string_view token) const;
  // The token's string as the vocabulary spells it (byte-level tokens in GPT-2's alphabet).
  std::optional<std::string_view> id_to_token(TokenId id) const;
  // The bytes the token stands for in the middle of a text, not necessarily valid UTF-8 (what
  // OpenAI's logprobs call a token's bytes): a byte-level token's characters mapped back through
  // GPT-2's byte alphabet, a <0xNN> byte-fallback token its byte, Metaspace's "▁" a space, an
  // added token its content, each through this tokenizer's decoder. Unlike decode({id}) nothing
  // is repaired (a token holding part of a multi-byte character gives those raw bytes, where
  // decode gives U+FFFD) and nothing is trimmed that belongs to the start of a whole text (the
  // leading space Llama 2's decoder strips), so the bytes of a text's tokens concatenate to it.
  // Special tokens included; nullopt past the vocabulary.
  std::optional<std::string> token_bytes(TokenId id) const;
  bool is_special(TokenId id) const;
  const TokenizerConfig& config() const;
  // The chat template by name ("default" first); nullopt when the model ships none.
  std::optional<std::string_view> chat_template(std::string_view name = "default") const;

  struct Impl;
  const Impl& impl() const { return *impl_; }

 private:
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Streaming detokenization: feed ids one at a time; each call returns the text that is final so
// far (possibly empty). Text is released only once later ids cannot change it (no character is
// split, a byte-fallback run is complete), so the pieces concatenated, finish() included, equal
// decode(all ids) exactly. Keeps a reference to the tokenizer.
class IncrementalDecoder {
 public:
  IncrementalDecoder(const Tokenizer& tokenizer, bool skip_special_tokens);
  // Appends the released text to `out` (so that a caller can reuse one buffer).
  void feed(TokenId id, std::string& out);
  std::string feed(TokenId id) {
    std::string out;
    feed(id, out);
    return out;
  }
  // Releases whatever is held back (at the end of a stream); the decoder can then be reused.
  std::string finish();

 private:
  const Tokenizer* tokenizer_;
  bool skip_special_tokens_;
  std::vector<TokenId> ids_;
  size_t prefix_offset_ = 0;  // ids_[prefix_offset_, read_offset_) decode to context text
  size_t read_offset_ = 0;    // ids_ before this were released
  std::string prefix_text_, scratch_;
};

// Encode throughput, single-threaded, on `text` (repeated until `min_bytes` have gone through,
// after one warm-up pass), timed by the thread's CPU time. For `pagedattn bench tokenize`.
struct EncodeBenchmark {
  double megabytes_per_second = 0;
  int64_t bytes = 0, tokens = 0;
  double seconds = 0;
};
EncodeBenchmark bench_encode(const Tokenizer& tokenizer, std::string_view text,
                             int64_t min_bytes = 4 << 20);
// The same for many short texts (chat turns), each encoded by its own call.
EncodeBenchmark bench_encode_lines(const Tokenizer& tokenizer, std::span<const std::string> lines,
                                   int64_t min_bytes = 2 << 20);
// Streaming decode cost: mean nanoseconds per IncrementalDecoder::feed over `ids`.
double bench_incremental_decode_ns(const Tokenizer& tokenizer, std::span<const TokenId> ids,
                                   int repeats = 20);

}  // namespace pagedattn::tokenizer
