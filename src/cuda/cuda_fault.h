// Deliberate faults in the CUDA launchers, for `scripts/gpu-check --faults` (the CUDA side of
// scripts/fault-check): a build configured with -DPAGEDATTN_INJECT_FAULT=cuda_<name> defines
// PAGEDATTN_FAULT_CUDA_<NAME> for the three host launchers (cuda/decode/decode.cpp,
// cuda/prefill.cpp, cuda/mla.cpp) only, so switching faults recompiles three host files, no
// kernel. Each fault is injected where the launcher fills the kernel's parameters, so it reaches
// every kernel variant behind that launcher (tensor-core and CUDA-core decode, wgmma and mma
// prefill, every MLA kernel and merge). In a normal build every constant is false.
//
// The names are listed in PAGEDATTN_CUDA_FAULTS in src/CMakeLists.txt. A fault the GPU tests do
// not catch is a missing GPU test.
#pragma once

namespace pagedattn::cuda {

#ifdef PAGEDATTN_FAULT_CUDA_SM_SCALE
inline constexpr bool kFaultSmScale = true;  // logits scaled by sm_scale * 1.02
#else
inline constexpr bool kFaultSmScale = false;
#endif
#ifdef PAGEDATTN_FAULT_CUDA_LSE_NOT_WRITTEN
inline constexpr bool kFaultLseNotWritten = true;  // the kernels get no lse pointer
#else
inline constexpr bool kFaultLseNotWritten = false;
#endif
#ifdef PAGEDATTN_FAULT_CUDA_WINDOW
inline constexpr bool kFaultWindow = true;  // sliding window one key too wide
#else
inline constexpr bool kFaultWindow = false;
#endif

// The sm_scale and window the kernels get (the faults applied when compiled in).
inline float faulty_sm_scale(float sm_scale) { return kFaultSmScale ? sm_scale * 1.02f : sm_scale; }
inline int faulty_window(int window_left) {
  return kFaultWindow && window_left >= 0 ? window_left + 1 : window_left;
}

}  // namespace pagedattn::cuda
