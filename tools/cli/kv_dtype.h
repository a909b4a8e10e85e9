// --kv-dtype, shared by generate, serve, bench throughput and bench model: the KV pool's dtype.
// fp8_e4m3 (vLLM's --kv-cache-dtype fp8, "fp8" accepted too) stores K and V as e4m3 with scale 1
// (KvPoolConfig::k_scale / v_scale), half the bytes of bf16 per token.
#pragma once

#include <fmt/format.h>

#include <optional>
#include <string>

#include "pagedattn/dtype.h"
#include "pagedattn/error.h"

namespace pagedattn::tools {

inline constexpr const char* kKvDtypeHelp = "KV cache dtype: bf16, f16, f32, fp8_e4m3 (or fp8)";

// A KV dtype by parse_dtype's names ("fp8" and "e4m3" included); else Error naming --kv-dtype and
// the value.
inline DType parse_kv_dtype(const std::string& name) {
  const std::optional<DType> dtype = parse_dtype(name);
  if (dtype && *dtype != DType::kI32 && *dtype != DType::kI64) return *dtype;
  throw Error(fmt::format("--kv-dtype {} (expected bf16, f16, f32, fp8_e4m3 or fp8)", name));
}

}  // namespace pagedattn::tools
