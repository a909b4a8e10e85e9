// prefill_kernel instantiations for f16 q and out over an fp8 e4m3 cache (head dims 64, 128, 256,
// 192/128; the tiles widened to f16 in shared memory, fp8_tile.cuh).
#include "cuda/prefill/launch.cuh"

namespace pagedattn::cuda::prefill {

void launch_prefill_f16_fp8(const PrefillParams& params, int head_dim_qk, int head_dim_vo,
                            void* stream) {
  launch_typed<__half, __nv_fp8_e4m3>(params, head_dim_qk, head_dim_vo, stream);
}

}  // namespace pagedattn::cuda::prefill
