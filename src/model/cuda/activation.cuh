// SiLU(gate) · up in f32, the one formula of every kernel that computes it (kernels.cu's silu_mul,
// gemv.cu's fused gate_up epilogue, moe.cu's grouped GEMM epilogue), so that the fused forms give
// the unfused kernel's bits. Device code only (include from .cu files).
#pragma once

namespace pagedattn::model::cuda {

__device__ __forceinline__ float silu_times(float gate, float up) {
  return gate / (1.0f + expf(-gate)) * up;
}

}  // namespace pagedattn::model::cuda
