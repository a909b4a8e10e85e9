// Explicit instantiations of the tensor-core decode kernel for head dim 256: bf16 and f16.
#include "cuda/cuda_check.h"
#include "cuda/decode/decode_tc_kernel.cuh"

namespace pagedattn::cuda {

template void launch_decode_tc_kernel<256, __nv_bfloat16>(const DecodeParams&, int, void*);
template void launch_decode_tc_kernel<256, __half>(const DecodeParams&, int, void*);

}  // namespace pagedattn::cuda
