// Out-of-line thrower for pagedattn::Error (see include/pagedattn/error.h).
#include "pagedattn/error.h"

namespace pagedattn {

void throw_error(const std::string& message) { throw Error(message); }

}  // namespace pagedattn
