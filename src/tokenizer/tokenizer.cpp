// Tokenizer: loading tokenizer.json into its stages, encode and decode (see tokenizer.h).
//
// encode: raw text -> segments split by the added tokens found in it (normalized=false) -> each
// text segment normalized -> split again by the normalized added tokens -> each text piece
// pre-tokenized into words -> BPE ids per word; then the post processor when add_special_tokens.
// decode: ids -> token strings (special added tokens skipped on request, unknown ids dropped) ->
// the decoder's chain -> their concatenation. token_bytes: one token through the decoder's
// bytes_chain (decoder.h), nothing repaired or trimmed.
#include <fmt/format.h>

#include <fstream>
#include <limits>
#include <sstream>

#include "core/check.h"
#include "tokenizer_impl.h"
#include "unicode.h"

namespace pagedattn::tokenizer {
namespace {

std::string read_file(const std::filesystem::path& path) {
  std::ifstream file(path, std::ios::binary);
  PA_CHECK(file.good(), "{}: cannot open the file", path.string());
  std::ostringstream text;
  text << file.rdbuf();
  return text.str();
}

}  // namespace

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Tokenizer Tokenizer::from_directory(const std::filesystem::path& directory) {
  std::filesystem::path json = directory / "tokenizer.json";
  PA_CHECK(std::filesystem::exists(json), "{}: no tokenizer.json in the tokenizer directory",
           json.string());
  std::string config;
  std::filesystem::path config_path = directory / "tokenizer_config.json";
  if (std::filesystem::exists(config_path)) config = read_file(config_path);
  Tokenizer tokenizer = from_json(read_file(json), json.string(), config, config_path.string());
  std::filesystem::path jinja = directory / "chat_template.jinja";
  if (std::filesystem::exists(jinja)) {
    tokenizer.impl_->config =
        read_config(config, config_path.string(), read_file(jinja), tokenizer);
  }
  return tokenizer;
}

Tokenizer Tokenizer::from_json(std::string_view tokenizer_json, std::string_view name,
                               std::string_view config_json, std::string_view config_name) {
  auto impl = std::make_unique<Impl>();
  impl->name = name;
  nlohmann::json document = parse_json(tokenizer_json, name);
  JsonNode root(document, std::string(name));
  if (!root.is_object()) root.fail("expected a tokenizer object");
  for (std::string_view unsupported : {"truncation", "padding"}) {
    if (auto member = root.find(unsupported)) {
      member->fail(fmt::format("{} is not supported (expected null)", unsupported));
    }
  }
  JsonNode model = root.at("model");
  std::string type = model.find("type") ? model.at("type").string() : "BPE";
  if (type != "BPE") {
    model.at("type").fail(fmt::format("unsupported model type \"{}\" (supported: BPE)", type));
  }
  if (auto normalizer = root.find("normalizer")) impl->normalizer = make_normalizer(*normalizer);
  if (auto pre = root.find("pre_tokenizer")) impl->pre_tokenizer = make_pre_tokenizer(*pre);
  impl->model = std::make_unique<Bpe>(model);
  if (auto post = root.find("post_processor")) impl->post_processor = make_post_processor(*post);
  if (auto decoder = root.find("decoder")) impl->decoder = make_decoder(*decoder);
  if (auto added = root.find("added_tokens")) {
    impl->added = AddedVocabulary(*added, impl->normalizer.get());
  }
  impl->vocab_size = std::max<int64_t>(impl->model->size(), int64_t{impl->added.max_id()} + 1);
  impl->special_by_id.assign(static_cast<size_t>(impl->vocab_size), false);
  for (TokenId id = 0; id < impl->vocab_size; ++id) {
    std::string_view storage;
    const std::string_view* text = impl->token(id, storage);
    const AddedToken* added = text ? impl->added.find_content(*text) : nullptr;
    impl->special_by_id[static_cast<size_t>(id)] = added != nullptr && added->special;
  }
  if (impl->decoder && impl->decoder->bytes_per_token()) {
    impl->bytes_by_id = true;
    impl->id_bytes_offset.assign(static_cast<size_t>(impl->vocab_size) + 1, 0);
    impl->id_absent.assign(static_cast<size_t>(impl->vocab_size), false);
    for (TokenId id = 0; id < impl->vocab_size; ++id) {
      std::string_view storage;
      const std::string_view* text = impl->token(id, storage);
      if (text == nullptr) {
        impl->id_absent[static_cast<size_t>(id)] = true;
      } else {
        impl->decoder->append_token_bytes(*text, impl->id_bytes);
      }
      PA_CHECK(impl->id_bytes.size() <= std::numeric_limits<uint32_t>::max(),
               "{}: the vocabulary's bytes exceed 4 GiB", name);
      impl->id_bytes_offset[static_cast<size_t>(id) + 1] =
          static_cast<uint32_t>(impl->id_bytes.size());
    }
  }
  Tokenizer tokenizer(std::move(impl));
  tokenizer.impl_->config = read_config(config_json, config_name, {}, tokenizer);
  return tokenizer;
}

std::vector<TokenId> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  size_t valid = valid_utf8_prefix(text);
  PA_CHECK(valid == text.size(), "encode: the text is not valid UTF-8 (byte {} of {}: 0x{:02X})",
           valid, text.size(), static_cast<unsigned char>(text[valid]));
  const Impl& impl = *impl_;
  std::vector<TokenId> ids;
  ids.reserve(text.size() / 3 + 4);
  thread_local std::vector<Segment> raw_segments, normalized_segments;
  thread_local Words words, scratch;
  thread_local std::string normalized;
  raw_segments.clear();
  impl.added.split(text, false, raw_segments);
  for (const Segment& raw : raw_segments) {
    if (raw.id >= 0) {
      ids.push_back(raw.id);
      continue;
    }
    normalized.assign(text.substr(raw.start, raw.end - raw.start));
    if (impl.normalizer) impl.normalizer->normalize(normalized);
    normalized_segments.clear();
    impl.added.split(normalized, true, normalized_segments);
    for (const Segment& segment : normalized_segments) {
      if (segment.id >= 0) {
        ids.push_back(segment.id);
        continue;
      }
      words.reset(std::string_view(normalized).substr(segment.start, segment.end - segment.start),
                  raw.start == 0 && segment.start == 0);
      if (impl.pre_tokenizer) impl.pre_tokenizer->pre_tokenize(words, scratch);
      for (auto [start, end] : words.ranges) {
        impl.model->tokenize(std::string_view(words.text).substr(start, end - start), ids);
      }
    }
  }
  if (add_special_tokens && impl.post_processor) impl.post_processor->process(ids);
  return ids;
}

const std::string_view* Tokenizer::Impl::token(TokenId id, std::string_view& storage) const {
  if (const AddedToken* added_token = added.find_id(id)) {
    storage = added_token->content;
    return &storage;
  }
  auto text = model->id_to_token(id);
  if (!text) return nullptr;
  storage = *text;
  return &storage;
}

bool Tokenizer::Impl::is_byte_fallback_token(TokenId id) const {
  if (!decoder || !decoder->has_byte_fallback()) return false;
  std::string_view storage;
  const std::string_view* text = token(id, storage);
  return text && byte_fallback_value(*text) >= 0;
}

void Tokenizer::Impl::decode(std::span<const TokenId> ids, bool skip_special_tokens,
                             std::string& out) const {
  if (bytes_by_id) {  // what decode_chain would give, from the bytes mapped at load
    thread_local std::string joined;
    joined.clear();
    for (TokenId id : ids) {
      if (id < 0 || id >= vocab_size) continue;  // past the vocabulary: dropped
      const auto index = static_cast<size_t>(id);
      if (id_absent[index] || (skip_special_tokens && special_by_id[index])) continue;
      joined.append(id_bytes, id_bytes_offset[index],
                    id_bytes_offset[index + 1] - id_bytes_offset[index]);
    }
    append_lossy_utf8(out, joined);
    return;
  }
  thread_local std::vector<std::string> tokens;
  tokens.clear();
  for (TokenId id : ids) {
    std::string_view storage;
    const std::string_view* text = token(id, storage);
    if (text == nullptr) continue;  // past the vocabulary: dropped, as tokenizers does
    if (skip_special_tokens && special_by_id[static_cast<size_t>(id)]) continue;
    tokens.emplace_back(*text);
  }
  if (!decoder) {
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (i > 0) out += ' ';
      out += tokens[i];
    }
    return;
  }
  decoder->decode_chain(tokens);
  for (const std::string& piece : tokens) out += piece;
}

std::string Tokenizer::decode(std::span<const TokenId> ids, bool skip_special_tokens) const {
  std::string text;
  impl_->decode(ids, skip_special_tokens, text);
  return text;
}

std::optional<std::string> Tokenizer::token_bytes(TokenId id) const {
  std::string_view storage;
  const std::string_view* text = impl_->token(id, storage);
  if (text == nullptr) return std::nullopt;
  std::vector<std::string> tokens{std::string(*text)};
  if (impl_->decoder) {
    bool fused = false;
    impl_->decoder->bytes_chain(tokens, fused);
  }
  std::string bytes;
  for (const std::string& piece : tokens) bytes += piece;
  return bytes;
}

int64_t Tokenizer::vocab_size() const { return impl_->vocab_size; }

std::optional<TokenId> Tokenizer::token_to_id(std::string_view token) const {
  if (const AddedToken* added = impl_->added.find_content(token)) return added->id;
  return impl_->model->token_to_id(token);
}

std::optional<std::string_view> Tokenizer::id_to_token(TokenId id) const {
  if (const AddedToken* added = impl_->added.find_id(id)) return std::string_view(added->content);
  return impl_->model->id_to_token(id);
}

bool Tokenizer::is_special(TokenId id) const {
  const AddedToken* added = impl_->added.find_id(id);
  return added != nullptr && added->special;
}

const TokenizerConfig& Tokenizer::config() const { return impl_->config; }

std::optional<std::string_view> Tokenizer::chat_template(std::string_view name) const {
  for (const auto& [template_name, text] : impl_->config.chat_templates) {
    if (template_name == name) return std::string_view(text);
  }
  return std::nullopt;
}

}  // namespace pagedattn::tokenizer
