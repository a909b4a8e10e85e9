// Helpers of the chat-template interpreter's unit tests: compile and render a template given as a
// string with a context given as JSON text.
#pragma once

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "pagedattn/chat_template.h"

namespace pagedattn::testing {

inline std::string render_template(const std::string& source, const std::string& context = "{}") {
  return ChatTemplate::compile(source).render(nlohmann::ordered_json::parse(context));
}

// The what() of the ChatTemplateError that compiling and rendering throws ("" when none).
inline std::string template_error(const std::string& source, const std::string& context = "{}") {
  try {
    render_template(source, context);
  } catch (const ChatTemplateError& error) {
    return error.what();
  }
  return "";
}

}  // namespace pagedattn::testing
