// Normalizers (see normalizer.h). Each reads its own JSON section; Sequence applies its members
// in order. Unicode forms come from ICU (unicode.cpp).
#include "normalizer.h"

#include <vector>

#include "pattern.h"
#include "unicode.h"

namespace pagedattn::tokenizer {
namespace {

class UnicodeForm final : public Normalizer {
 public:
  explicit UnicodeForm(NormalizationForm form) : form_(form) {}
  void normalize(std::string& text) const override { tokenizer::normalize(form_, text); }

 private:
  NormalizationForm form_;
};

class Lowercase final : public Normalizer {
 public:
  void normalize(std::string& text) const override { lowercase(text); }
};

// Prepends a string to non-empty text (SentencePiece's "▁" before the first word).
class Prepend final : public Normalizer {
 public:
  explicit Prepend(std::string prefix) : prefix_(std::move(prefix)) {}
  void normalize(std::string& text) const override {
    if (!text.empty()) text.insert(0, prefix_);
  }

 private:
  std::string prefix_;
};

class Replace final : public Normalizer {
 public:
  explicit Replace(const JsonNode& node)
      : pattern_(node.at("pattern")), content_(node.at("content").string()) {}
  void normalize(std::string& text) const override { pattern_.replace_all(text, content_); }

 private:
  Pattern pattern_;
  std::string content_;
};

class Sequence final : public Normalizer {
 public:
  explicit Sequence(const JsonNode& node) {
    for (const JsonNode& item : node.at("normalizers").items()) {
      members_.push_back(make_normalizer(item));
    }
  }
  void normalize(std::string& text) const override {
    for (const auto& member : members_) member->normalize(text);
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> members_;
};

}  // namespace

std::unique_ptr<Normalizer> make_normalizer(const JsonNode& node) {
  std::string type = node.type(
      "normalizer", {"NFC", "NFD", "NFKC", "NFKD", "Lowercase", "Prepend", "Replace", "Sequence"});
  if (type == "NFC") return std::make_unique<UnicodeForm>(NormalizationForm::kNfc);
  if (type == "NFD") return std::make_unique<UnicodeForm>(NormalizationForm::kNfd);
  if (type == "NFKC") return std::make_unique<UnicodeForm>(NormalizationForm::kNfkc);
  if (type == "NFKD") return std::make_unique<UnicodeForm>(NormalizationForm::kNfkd);
  if (type == "Lowercase") return std::make_unique<Lowercase>();
  if (type == "Prepend") return std::make_unique<Prepend>(node.at("prepend").string());
  if (type == "Replace") return std::make_unique<Replace>(node);
  return std::make_unique<Sequence>(node);
}

}  // namespace pagedattn::tokenizer
