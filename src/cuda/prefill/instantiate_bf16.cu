// prefill_kernel instantiations for bf16 (head dims 64, 128, 256, 192/128).
#include "cuda/prefill/launch.cuh"

namespace pagedattn::cuda::prefill {

void launch_prefill_bf16(const PrefillParams& params, int head_dim_qk, int head_dim_vo,
                         void* stream) {
  launch_typed<__nv_bfloat16>(params, head_dim_qk, head_dim_vo, stream);
}

}  // namespace pagedattn::cuda::prefill
