// Where the embedded default model is: what `generate` and `serve` run without --model.
#pragma once

#include <fmt/format.h>

#include <filesystem>

#include "pagedattn/error.h"

#ifndef PAGEDATTN_DEFAULT_MODEL
#define PAGEDATTN_DEFAULT_MODEL "models/austen-3m"
#endif

namespace pagedattn::tools {

// The source tree's models/austen-3m (PAGEDATTN_DEFAULT_MODEL, set by tools/CMakeLists.txt), else
// ./models/austen-3m; an Error naming both when neither holds a config.json.
inline std::filesystem::path default_model_directory() {
  for (const std::filesystem::path& candidate :
       {std::filesystem::path(PAGEDATTN_DEFAULT_MODEL), std::filesystem::path("models/austen-3m")}) {
    if (std::filesystem::exists(candidate / "config.json")) return candidate;
  }
  throw Error(fmt::format(
      "the embedded default model is not at {} nor at ./models/austen-3m: pass --model DIR",
      PAGEDATTN_DEFAULT_MODEL));
}

}  // namespace pagedattn::tools
