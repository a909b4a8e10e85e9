// Post processors (see post_processor.h). TemplateProcessing's "single" template is a list of
// {"SpecialToken": {"id": NAME}} (ids from its special_tokens table) and {"Sequence": {"id":
// "A"}} (the encoded text).
#include "post_processor.h"

#include <string>

namespace pagedattn::tokenizer {
namespace {

class Template final : public PostProcessor {
 public:
  explicit Template(const JsonNode& node) {
    JsonNode special_tokens = node.at("special_tokens");
    for (const JsonNode& item : node.at("single").items()) {
      if (auto special = item.find("SpecialToken")) {
        std::string name = special->at("id").string();
        auto entry = special_tokens.find(name);
        if (!entry) special->at("id").fail("not in the template's special_tokens");
        Piece piece;
        for (const JsonNode& id : entry->at("ids").items()) {
          piece.ids.push_back(static_cast<TokenId>(id.integer()));
        }
        pieces_.push_back(std::move(piece));
      } else if (auto sequence = item.find("Sequence")) {
        if (sequence->at("id").string() != "A") {
          sequence->at("id").fail("a single-sequence template can only hold sequence \"A\"");
        }
        pieces_.push_back(Piece{{}, true});
      } else {
        item.fail("expected {\"SpecialToken\": ...} or {\"Sequence\": ...}");
      }
    }
  }
  void process(std::vector<TokenId>& ids) const override {
    std::vector<TokenId> result;
    result.reserve(ids.size() + 4);
    for (const Piece& piece : pieces_) {
      if (piece.sequence) {
        result.insert(result.end(), ids.begin(), ids.end());
      } else {
        result.insert(result.end(), piece.ids.begin(), piece.ids.end());
      }
    }
    ids = std::move(result);
  }

 private:
  struct Piece {
    std::vector<TokenId> ids;
    bool sequence = false;
  };
  std::vector<Piece> pieces_;
};

// <s> A </s>: RoBERTa's cls / sep pair of [token, id].
class Roberta final : public PostProcessor {
 public:
  explicit Roberta(const JsonNode& node)
      : cls_(static_cast<TokenId>(node.at("cls").at(1).integer())),
        sep_(static_cast<TokenId>(node.at("sep").at(1).integer())) {}
  void process(std::vector<TokenId>& ids) const override {
    ids.insert(ids.begin(), cls_);
    ids.push_back(sep_);
  }

 private:
  TokenId cls_, sep_;
};

class Identity final : public PostProcessor {
 public:
  void process(std::vector<TokenId>&) const override {}
};

class Sequence final : public PostProcessor {
 public:
  explicit Sequence(const JsonNode& node) {
    for (const JsonNode& item : node.at("processors").items()) {
      members_.push_back(make_post_processor(item));
    }
  }
  void process(std::vector<TokenId>& ids) const override {
    for (const auto& member : members_) member->process(ids);
  }

 private:
  std::vector<std::unique_ptr<PostProcessor>> members_;
};

}  // namespace

std::unique_ptr<PostProcessor> make_post_processor(const JsonNode& node) {
  std::string type = node.type(
      "post processor", {"TemplateProcessing", "RobertaProcessing", "ByteLevel", "Sequence"});
  if (type == "TemplateProcessing") return std::make_unique<Template>(node);
  if (type == "RobertaProcessing") return std::make_unique<Roberta>(node);
  if (type == "ByteLevel") return std::make_unique<Identity>();
  return std::make_unique<Sequence>(node);
}

}  // namespace pagedattn::tokenizer
