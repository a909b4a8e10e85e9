// Host side of CUDA MLA. No MLA kernel exists on CUDA yet (issue 5): supports_mla() says so, so
// that `auto` selection falls through to the CPU backend and an explicit request gets a clear
// error; run_mla() refuses with the same reason and launches nothing.
#include "cuda/mla.h"

#include <fmt/format.h>

#include "core/check.h"

namespace pagedattn::cuda {

Support supports_mla(const OpDesc& op) {
  return Support::no(
      fmt::format("{}: MLA has no CUDA kernel yet (use the CPU backend for MLA)", op_name(op.op)));
}

void run_mla(CudaWorkspace& /*workspace*/, const MlaArgs& /*args*/) {
  PA_FAIL("run_mla: MLA has no CUDA kernel yet (use the CPU backend for MLA)");
}

}  // namespace pagedattn::cuda
