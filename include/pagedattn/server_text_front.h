// The server's TextFront over a real model directory: the tokenizer (tokenizer.json +
// tokenizer_config.json) for encode and single-token bytes, and the model's chat template for
// the chat endpoint, rendered as transformers' apply_chat_template does with the generation
// prompt appended.
#pragma once

#include <filesystem>
#include <memory>

#include "pagedattn/server_protocol.h"
#include "pagedattn/tokenizer.h"

namespace pagedattn::server {

// `tokenizer` must outlive the front. Reads DIR/tokenizer_config.json for the template's special
// tokens; a model without a chat template gets a front whose render_chat throws Error (400).
std::unique_ptr<TextFront> make_text_front(const tokenizer::Tokenizer& tokenizer,
                                           const std::filesystem::path& model_directory);

}  // namespace pagedattn::server
