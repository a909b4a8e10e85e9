// Multi-head latent attention (DeepSeek MLA, absorbed form) on CUDA: decode (q_len 1, or 2..4 for
// speculative decoding, causal) and extend over the compressed latent cache ckv [.., P, rank] and
// kpe [.., P, rope]. Host-side entry points only: no CUDA types here.
#pragma once

#include "pagedattn/backend.h"

namespace pagedattn::cuda {

class CudaWorkspace;  // src/cuda/workspace.h

// Whether run_mla() serves `op` (OpKind::kMlaDecode or kMlaExtend on a CUDA device); if not, why.
Support supports_mla(const OpDesc& op);

// plan() for an MLA operation: records the step and, when meta.max_q_len is known, enqueues the
// step's split-KV partition on workspace.stream (every layer's run_mla reuses it).
void plan_mla(CudaWorkspace& workspace, const OpDesc& op, const StepMetadata& meta);

// Validates `args` (throws pagedattn::Error naming the argument) and enqueues the work on
// args.stream, with no host synchronisation.
void run_mla(CudaWorkspace& workspace, const MlaArgs& args);

}  // namespace pagedattn::cuda
