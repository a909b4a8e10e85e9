// The library's one error type. Every message names the argument, the value it had and what was
// expected, so a caller can act on it without reading the source. Library code never exits or
// aborts: a violated precondition throws pagedattn::Error.
#pragma once

#include <stdexcept>
#include <string>

namespace pagedattn {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Throws Error(message). Out of line so that headers compiled by nvcc need no formatting library.
[[noreturn]] void throw_error(const std::string& message);

}  // namespace pagedattn
