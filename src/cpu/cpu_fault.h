// Deliberate faults for proving the tests' power (scripts/fault-check). A build configured with
// -DPAGEDATTN_INJECT_FAULT=<name> defines PAGEDATTN_FAULT_<NAME> for the CPU kernel
// (src/cpu/cpu_attention.cpp only, so switching faults recompiles one file), which turns exactly
// one of these constants on; the kernel's fault branches test them with plain `if`, so every one
// still compiles (and stays type-checked) in a normal build, where all are false and vanish.
//
// A fault that the test suite does not catch is a missing test: add the test, never remove the
// fault. The names (lower case, as given to CMake) are listed in PAGEDATTN_CPU_FAULTS in
// src/CMakeLists.txt, which rejects any other name; scripts/fault-check runs them all.
#pragma once

namespace pagedattn::cpu {

#ifdef PAGEDATTN_FAULT_SM_SCALE
inline constexpr bool kFaultSmScale = true;  // logits scaled by sm_scale * 1.02
#else
inline constexpr bool kFaultSmScale = false;
#endif
#ifdef PAGEDATTN_FAULT_LAST_KEY
inline constexpr bool kFaultLastKey = true;  // the last key of every request is never read
#else
inline constexpr bool kFaultLastKey = false;
#endif
#ifdef PAGEDATTN_FAULT_SPLIT_PAGE
inline constexpr bool kFaultSplitPage = true;  // split KV: chunks after the first skip a page
#else
inline constexpr bool kFaultSplitPage = false;
#endif
#ifdef PAGEDATTN_FAULT_LSE_NOT_WRITTEN
inline constexpr bool kFaultLseNotWritten = true;  // lse is never stored
#else
inline constexpr bool kFaultLseNotWritten = false;
#endif
#ifdef PAGEDATTN_FAULT_WINDOW
inline constexpr bool kFaultWindow = true;  // sliding window one key too wide
#else
inline constexpr bool kFaultWindow = false;
#endif
#ifdef PAGEDATTN_FAULT_CAUSAL_SHIFT
inline constexpr bool kFaultCausalShift = true;  // causal rows see one future key
#else
inline constexpr bool kFaultCausalShift = false;
#endif
#ifdef PAGEDATTN_FAULT_SOFT_CAP_AFTER_MASK
inline constexpr bool kFaultSoftCapAfterMask = true;  // masked keys get weight exp(-cap - m)
#else
inline constexpr bool kFaultSoftCapAfterMask = false;
#endif
#ifdef PAGEDATTN_FAULT_MERGE_LAST
inline constexpr bool kFaultMergeLast = true;  // merge drops the last of >= 3 partials
#else
inline constexpr bool kFaultMergeLast = false;
#endif
#ifdef PAGEDATTN_FAULT_V_SCALE
inline constexpr bool kFaultVScale = true;  // fp8 V dequantisation scale ignored
#else
inline constexpr bool kFaultVScale = false;
#endif
#ifdef PAGEDATTN_FAULT_ALLOC_PAGE
inline constexpr bool kFaultAllocPage = true;  // attention page's offset in its allocation page
#else                                          // ignored (alloc_page_size > P reads page start)
inline constexpr bool kFaultAllocPage = false;
#endif

}  // namespace pagedattn::cpu
