// Skipping GPU tests where no GPU is: in CI (no GPU) a GPU test skips and says why; on the GPU
// machine (scripts/gpu-check sets PAGEDATTN_REQUIRE_GPU=1) the same condition is a failure, so a
// run in which the GPU was unusable (driver mismatch, no device visible, a cudaGetDeviceCount
// error) cannot pass as "every test skipped".
//
//   PA_SKIP_OR_FAIL_WITHOUT_GPU(reason): when `reason` (a std::string, empty = usable) is not
//   empty, skips the test, or fails it when GPU is required.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>

namespace pagedattn::testing {

// True when PAGEDATTN_REQUIRE_GPU is set to anything but "" or "0".
inline bool gpu_required() {
  const char* value = std::getenv("PAGEDATTN_REQUIRE_GPU");
  return value != nullptr && *value != '\0' && std::strcmp(value, "0") != 0;
}

}  // namespace pagedattn::testing

#define PA_SKIP_OR_FAIL_WITHOUT_GPU(reason)                                                  \
  do {                                                                                       \
    if (const std::string pa_why_ = (reason); !pa_why_.empty()) {                            \
      if (::pagedattn::testing::gpu_required()) {                                            \
        FAIL() << "PAGEDATTN_REQUIRE_GPU=1 but no usable GPU: " << pa_why_;                  \
      }                                                                                      \
      GTEST_SKIP() << "no GPU: " << pa_why_;                                                 \
    }                                                                                        \
  } while (0)
