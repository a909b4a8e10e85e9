// Explicit instantiations of the decode kernel for head dim 64: q bf16/f16, KV = q's type or fp8.
#include "cuda/cuda_check.h"
#include "cuda/decode/decode_kernel.cuh"

namespace pagedattn::cuda {

template void launch_decode_kernel<64, __nv_bfloat16, __nv_bfloat16>(const DecodeParams&, int,
                                                                     void*);
template void launch_decode_kernel<64, __half, __half>(const DecodeParams&, int, void*);
template void launch_decode_kernel<64, __nv_bfloat16, __nv_fp8_e4m3>(const DecodeParams&, int,
                                                                     void*);
template void launch_decode_kernel<64, __half, __nv_fp8_e4m3>(const DecodeParams&, int, void*);

}  // namespace pagedattn::cuda
