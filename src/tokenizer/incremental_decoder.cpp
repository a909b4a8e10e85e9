// IncrementalDecoder (see tokenizer.h). Each feed decodes a short window of ids twice: the
// context ids_[prefix_offset_, read_offset_) (already released) and the context plus the new
// ids; the text the new ids add is the difference. It is released only when nothing later can
// change it: the window's text does not end in U+FFFD (a character still incomplete, or bytes
// whose replacement may still grow) and the last id is not a <0xNN> byte token (ByteFallback
// replaces a whole invalid run, so the run must be complete). The window then moves on, the
// released ids becoming the next context, so that decoder steps that look at the start of the
// text (Strip, Metaspace) and byte sequences split over ids see the same neighbours as in
// decode(all ids).
#include "core/check.h"
#include "tokenizer_impl.h"

namespace pagedattn::tokenizer {
namespace {

constexpr std::string_view kReplacementCharacter = "\xEF\xBF\xBD";

}  // namespace

IncrementalDecoder::IncrementalDecoder(const Tokenizer& tokenizer, bool skip_special_tokens)
    : tokenizer_(&tokenizer), skip_special_tokens_(skip_special_tokens) {}

void IncrementalDecoder::feed(TokenId id, std::string& out) {
  const Tokenizer::Impl& impl = tokenizer_->impl();
  ids_.push_back(id);
  if (impl.is_byte_fallback_token(id)) return;
  std::span<const TokenId> ids(ids_);
  scratch_.clear();
  impl.decode(ids.subspan(prefix_offset_), skip_special_tokens_, scratch_);
  if (scratch_.ends_with(kReplacementCharacter)) return;
  if (scratch_.size() < prefix_text_.size() || !scratch_.starts_with(prefix_text_)) return;
  out.append(scratch_, prefix_text_.size());
  // The released ids become the context, unless their text is empty (skipped special tokens, a
  // lone "▁" that Strip removes): a decoder step at the start of the text (Strip, Metaspace)
  // must act inside the context, as it does in decode(all ids), so the context grows instead.
  std::string candidate;
  impl.decode(ids.subspan(read_offset_), skip_special_tokens_, candidate);
  if (!candidate.empty()) {
    prefix_offset_ = read_offset_;
    prefix_text_ = std::move(candidate);
  } else {
    prefix_text_ = std::move(scratch_);
  }
  read_offset_ = ids_.size();
  // Ids before the context are never read again.
  if (prefix_offset_ > 64) {
    ids_.erase(ids_.begin(), ids_.begin() + static_cast<std::ptrdiff_t>(prefix_offset_));
    read_offset_ -= prefix_offset_;
    prefix_offset_ = 0;
  }
}

std::string IncrementalDecoder::finish() {
  const Tokenizer::Impl& impl = tokenizer_->impl();
  scratch_.clear();
  impl.decode(std::span<const TokenId>(ids_).subspan(prefix_offset_), skip_special_tokens_,
              scratch_);
  std::string rest;
  if (scratch_.starts_with(prefix_text_)) rest = scratch_.substr(prefix_text_.size());
  ids_.clear();
  prefix_offset_ = read_offset_ = 0;
  prefix_text_.clear();
  return rest;
}

}  // namespace pagedattn::tokenizer
