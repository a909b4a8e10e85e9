// The wgmma (sm_90a) shape the Hopper MLA kernel needs beyond src/cuda/prefill/wgmma.cuh:
// D[64 x 32] (+)= A[64 x 16] * B[32 x 16]^T with A and B K-major in shared memory (bf16), the
// half-width QK^T product of one warpgroup (kernel_sm90.cuh). Accumulator layout as in
// prefill/wgmma.cuh: register 4 * j + e holds row 16 * warp + lane / 4 + 8 * (e / 2), column
// 8 * j + 2 * (lane % 4) + e % 2.
#pragma once

#include <cstdint>

namespace pagedattn::cuda::mla::sm90 {

__device__ __forceinline__ void ss_m64n32k16_bf16(float (&d)[16], uint64_t desc_a, uint64_t desc_b,
                                                  int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
      "%16, %17, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15])
      : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}

// Waits until at most kPending cp.async groups of this thread are still in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

}  // namespace pagedattn::cuda::mla::sm90
