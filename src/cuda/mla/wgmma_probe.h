// The tensor-core instruction rates the sm_90a MLA kernels are built from, measured on the current
// device: how many cycles a warpgroup spends per wgmma of the shapes the kernels issue, alone and
// in the warp-specialized kernel's mix. `pagedattn bench mla --device cuda` prints them beside the
// kernels' figures, so that a kernel's time per tile can be set against what its instructions can
// do on that device. Host API, no CUDA types.
#pragma once

#include <string>
#include <vector>

namespace pagedattn::cuda::mla {

struct WgmmaRate {
  std::string name;         // e.g. "28 RS + 8 SS m64n32k16"
  std::string role;         // what the kernel uses the sequence for
  int wgmmas = 0;           // wgmmas per group (one commit and wait)
  double flops = 0;         // per group, all issuing warpgroups
  double cycles = 0;        // per group (SM clocks): median over the CTAs of the slowest warpgroup
  double ideal_cycles = 0;  // flops at 4096 dense bf16 FLOP per SM clock (H100 / H200)
};

// One CTA per SM, each warpgroup issuing its groups back to back from shared memory / registers
// holding zeros. Empty when the device or the binary has no sm_90a (compute capability 9.x) code.
std::vector<WgmmaRate> probe_wgmma_rates(void* stream);

}  // namespace pagedattn::cuda::mla
