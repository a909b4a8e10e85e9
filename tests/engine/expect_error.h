// expect_error(fn, part): fn must throw pagedattn::Error whose message contains `part`.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "pagedattn/error.h"

namespace pagedattn::engine::testing {

inline void expect_error(const std::function<void()>& fn, const std::string& part) {
  try {
    fn();
    ADD_FAILURE() << "no Error thrown; expected one mentioning '" << part << "'";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find(part), std::string::npos) << error.what();
  }
}

}  // namespace pagedattn::engine::testing
