// PA_CHECK(condition, "format {}", args...): throws pagedattn::Error with a formatted message when
// the condition is false. Internal to the library's host code (it needs fmt).
#pragma once

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "pagedattn/error.h"

#define PA_CHECK(condition, ...)                                  \
  do {                                                            \
    if (!(condition)) [[unlikely]] {                              \
      ::pagedattn::throw_error(::fmt::format(__VA_ARGS__));       \
    }                                                             \
  } while (0)

#define PA_FAIL(...) ::pagedattn::throw_error(::fmt::format(__VA_ARGS__))
