// Errors of the template engine: every one names the template's line and column (Jinja2 names the
// line), and raise_exception's are marked as the template's own. Thrown as
// pagedattn::ChatTemplateError (include/pagedattn/chat_template.h).
#pragma once

#include <string>

#include "jinja/lexer.h"

namespace pagedattn::jinja {

[[noreturn]] void fail_at(Location location, const std::string& reason);
[[noreturn]] void raise_from_template(Location location, const std::string& message);

}  // namespace pagedattn::jinja
