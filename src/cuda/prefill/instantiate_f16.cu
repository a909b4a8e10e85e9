// prefill_kernel instantiations for f16 (head dims 64, 128, 256, 192/128).
#include "cuda/prefill/launch.cuh"

namespace pagedattn::cuda::prefill {

void launch_prefill_f16(const PrefillParams& params, int head_dim_qk, int head_dim_vo,
                        void* stream) {
  launch_typed<__half>(params, head_dim_qk, head_dim_vo, stream);
}

}  // namespace pagedattn::cuda::prefill
