// Post processors: what encode(text, add_special_tokens=true) adds around the ids
// (tokenizer.json "post_processor"). Supported: TemplateProcessing (single sequences),
// RobertaProcessing, ByteLevel (no change to ids), Sequence.
#pragma once

#include <memory>
#include <vector>

#include "json_node.h"
#include "pagedattn/tokenizer.h"

namespace pagedattn::tokenizer {

class PostProcessor {
 public:
  virtual ~PostProcessor() = default;
  virtual void process(std::vector<TokenId>& ids) const = 0;
};

std::unique_ptr<PostProcessor> make_post_processor(const JsonNode& node);

}  // namespace pagedattn::tokenizer
