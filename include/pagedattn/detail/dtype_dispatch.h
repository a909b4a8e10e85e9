// dispatch_float: calls fn with a value of the C++ type of a floating DType (float, Half,
// BFloat16, Fp8E4M3), or throws naming `what`. Part of pagedattn/dtype.h, which includes it last;
// including it alone includes dtype.h first (the #pragma once of each ends the cycle).
#pragma once

#include <string>
#include <string_view>

#include "pagedattn/dtype.h"
#include "pagedattn/error.h"

namespace pagedattn {

template <class Fn>
decltype(auto) dispatch_float(DType dtype, std::string_view what, Fn&& fn) {
  switch (dtype) {
    case DType::kF32:
      return fn(float{});
    case DType::kF16:
      return fn(Half{});
    case DType::kBF16:
      return fn(BFloat16{});
    case DType::kFP8E4M3:
      return fn(Fp8E4M3{});
    default:
      throw_error(std::string(what) + ": dtype " + std::string(dtype_name(dtype)) +
                  " is not a floating type (expected f32, f16, bf16 or fp8_e4m3)");
  }
}

}  // namespace pagedattn
