// Explicit instantiations of the CUDA-core decode kernel for head dim 128: q bf16/f16 over fp8
// KV (KV of q's type takes the tensor-core kernel, decode_tc_d128.cu).
#include "cuda/cuda_check.h"
#include "cuda/decode/decode_kernel.cuh"

namespace pagedattn::cuda {

template void launch_decode_kernel<128, __nv_bfloat16, __nv_fp8_e4m3>(const DecodeParams&, int,
                                                                      void*);
template void launch_decode_kernel<128, __half, __nv_fp8_e4m3>(const DecodeParams&, int, void*);

}  // namespace pagedattn::cuda
